// PinnedStaging and CudaDevice::StageToDevice (runtime/cuda/pinned_staging.h): a staged upload
// returns while the stream is still busy, the source may be overwritten at once, the copy lands
// in stream order (after earlier work, before later work), the ring wraps and waits only for
// regions still in flight, a copy larger than the ring grows it, switching the device's stream
// orders the new stream after the old one, and a batch (BeginBatch .. FlushBatch) lands every
// array at its flush with the copy kernel.
#include "runtime/cuda/pinned_staging.h"

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/cuda/cuda_device.h"
#include "tests/common/gpu_test_util.h"
#include "tests/common/spin_kernel.h"

namespace dcp::testing {
namespace {

// A flag in host-mapped memory that a spin kernel waits on.
class HostFlag {
 public:
  HostFlag() {
    EXPECT_EQ(cudaHostAlloc(&host_, sizeof(int), cudaHostAllocMapped), cudaSuccess);
    *host_ = 0;
    EXPECT_EQ(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0),
              cudaSuccess);
  }
  ~HostFlag() {
    Set();
    cudaFreeHost(host_);
  }
  void Set() { reinterpret_cast<std::atomic<int>*>(host_)->store(1); }
  const int* device() const { return device_; }

 private:
  int* host_ = nullptr;
  int* device_ = nullptr;
};

class PinnedStagingTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped() || HasFailure()) return;
    DCP_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    GpuTest::TearDown();
  }
  std::vector<uint8_t> Random(size_t n, std::mt19937_64& rng) {
    std::vector<uint8_t> v(n);
    for (auto& b : v) b = static_cast<uint8_t>(rng());
    return v;
  }
  std::vector<uint8_t> Read(const uint8_t* device, size_t n) {
    std::vector<uint8_t> host(n);
    EXPECT_EQ(cudaMemcpyAsync(host.data(), device, n, cudaMemcpyDeviceToHost, stream_),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    return host;
  }
  cudaStream_t stream_ = nullptr;
};

TEST_F(PinnedStagingTest, ReturnsWhileTheStreamIsBusyAndTheSourceMayBeReused) {
  std::mt19937_64 rng(TestSeed());
  PinnedStaging staging(4096);
  DeviceArray<uint8_t> dst(3 * 1000);
  dst.Poison();
  HostFlag flag;
  ASSERT_EQ(LaunchSpinUntilSet(flag.device(), 20.0, stream_), cudaSuccess);
  std::vector<std::vector<uint8_t>> sent;
  std::vector<uint8_t> source;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    source = Random(1000, rng);
    sent.push_back(source);
    ASSERT_TRUE(staging.Copy(dst.get() + i * 1000, source.data(), 1000, stream_).ok());
    std::fill(source.begin(), source.end(), 0xAB);  // reused at once
  }
  // The calls did not wait for the stream (the spin kernel holds it for up to 20 s), and
  // nothing could have run yet.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  EXPECT_EQ(cudaStreamQuery(stream_), cudaErrorNotReady);
  EXPECT_EQ(staging.pending(), 3u);
  flag.Set();
  const std::vector<uint8_t> got = Read(dst.get(), 3000);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(std::equal(sent[i].begin(), sent[i].end(), got.begin() + i * 1000)) << "copy " << i;
  }
}

TEST_F(PinnedStagingTest, WrapsManyTimesAndGrowsForALargeCopy) {
  std::mt19937_64 rng(TestSeed());
  PinnedStaging staging(4096);
  constexpr int kCopies = 300;
  constexpr size_t kSlot = 3000;
  DeviceArray<uint8_t> dst(kCopies * kSlot);
  dst.Poison();
  std::vector<std::vector<uint8_t>> sent(kCopies);
  std::vector<uint8_t> source;
  for (int i = 0; i < kCopies; ++i) {
    const size_t bytes = 1 + rng() % kSlot;  // odd sizes: unaligned ends, every wrap position
    source = Random(bytes, rng);
    sent[i] = source;
    ASSERT_TRUE(staging.Copy(dst.get() + i * kSlot, source.data(), bytes, stream_).ok());
    std::fill(source.begin(), source.end(), 0xCD);
  }
  EXPECT_EQ(staging.capacity(), 4096u);  // never grew: the copies fit
  const std::vector<uint8_t> got = Read(dst.get(), kCopies * kSlot);
  for (int i = 0; i < kCopies; ++i) {
    ASSERT_TRUE(std::equal(sent[i].begin(), sent[i].end(), got.begin() + i * kSlot))
        << "copy " << i << " of " << sent[i].size() << " bytes";
  }
  // Larger than the ring: it grows (after draining), and the copy is right.
  const std::vector<uint8_t> big = Random(100000, rng);
  DeviceArray<uint8_t> big_dst(big.size());
  ASSERT_TRUE(staging.Copy(big_dst.get(), big.data(), big.size(), stream_).ok());
  EXPECT_GE(staging.capacity(), big.size());
  EXPECT_EQ(Read(big_dst.get(), big.size()), big);
}

TEST_F(PinnedStagingTest, AFullRingWaitsForTheRegionItNeedsThenLands) {
  std::mt19937_64 rng(TestSeed());
  PinnedStaging staging(2048);
  DeviceArray<uint8_t> dst(4 * 1024);
  HostFlag flag;
  ASSERT_EQ(LaunchSpinUntilSet(flag.device(), 20.0, stream_), cudaSuccess);
  std::vector<uint8_t> a = Random(1024, rng), b = Random(1024, rng), c = Random(1024, rng);
  ASSERT_TRUE(staging.Copy(dst.get(), a.data(), a.size(), stream_).ok());
  ASSERT_TRUE(staging.Copy(dst.get() + 1024, b.data(), b.size(), stream_).ok());
  // The ring is full of copies held behind the spin kernel: the third must wait for the first
  // region, which frees once the kernel ends. Release it from another thread after a while.
  std::thread release([&flag] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    flag.Set();
  });
  const auto start = std::chrono::steady_clock::now();
  const absl::Status third = staging.Copy(dst.get() + 2048, c.data(), c.size(), stream_);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  release.join();
  ASSERT_TRUE(third.ok()) << third;
  EXPECT_GT(waited, 0.1) << "the third copy did not wait for its region";
  EXPECT_LT(waited, 10.0) << "the third copy waited for more than its region";
  const std::vector<uint8_t> got = Read(dst.get(), 3 * 1024);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), got.begin()));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), got.begin() + 1024));
  EXPECT_TRUE(std::equal(c.begin(), c.end(), got.begin() + 2048));
}

TEST_F(PinnedStagingTest, LandsBetweenTheWorkBeforeAndTheWorkAfter) {
  std::mt19937_64 rng(TestSeed());
  PinnedStaging staging;
  DeviceArray<uint8_t> dst(4096), copy_of_first(4096);
  const std::vector<uint8_t> first = Random(4096, rng), second = Random(4096, rng);
  HostFlag flag;
  ASSERT_EQ(LaunchSpinUntilSet(flag.device(), 20.0, stream_), cudaSuccess);
  ASSERT_TRUE(staging.Copy(dst.get(), first.data(), first.size(), stream_).ok());
  ASSERT_EQ(cudaMemcpyAsync(copy_of_first.get(), dst.get(), 4096, cudaMemcpyDeviceToDevice,
                            stream_), cudaSuccess);
  ASSERT_TRUE(staging.Copy(dst.get(), second.data(), second.size(), stream_).ok());
  flag.Set();
  EXPECT_EQ(Read(copy_of_first.get(), 4096), first);
  EXPECT_EQ(Read(dst.get(), 4096), second);
}

TEST_F(PinnedStagingTest, DeviceStreamSwitchOrdersTheNewStreamAfterTheOld) {
  auto created = CudaDevice::Create(0);
  ASSERT_TRUE(created.ok()) << created.status();
  CudaDevice& device = **created;
  std::mt19937_64 rng(TestSeed());
  DeviceArray<uint8_t> dst(8192), copied(8192);
  copied.Poison();
  const std::vector<uint8_t> values = Random(8192, rng);
  cudaStream_t first = nullptr;
  DCP_ASSERT_CUDA(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking));
  HostFlag flag;
  ASSERT_TRUE(device.SetStream(first).ok());
  ASSERT_EQ(LaunchSpinUntilSet(flag.device(), 20.0, first), cudaSuccess);
  ASSERT_TRUE(device.StageToDevice(dst.get(), values.data(), values.size()).ok());
  // On another stream: must still see the staged values, not what dst held before.
  ASSERT_TRUE(device.SetStream(stream_).ok());
  ASSERT_TRUE(device.Copy(copied.get(), dst.get(), values.size()).ok());
  flag.Set();
  EXPECT_EQ(Read(copied.get(), values.size()), values);
  ASSERT_TRUE(device.SetStream(nullptr).ok());
  ASSERT_TRUE(device.Synchronize().ok());
  cudaStreamSynchronize(first);
  cudaStreamDestroy(first);
}

// Batch mode: appends defer the device side (sources reused at once, nothing enqueued, the
// destinations untouched) until the flush, which lands every array, of any size and alignment,
// in stream order; more than one launch's worth of arrays, a batch larger than the ring (flushed
// early), and a discarded batch (nothing lands, the ring is reusable).
TEST_F(PinnedStagingTest, ABatchLandsAtItsFlushInStreamOrder) {
  std::mt19937_64 rng(TestSeed());
  PinnedStaging staging(4096);
  constexpr int kArrays = 75;  // three launches of at most 32
  constexpr size_t kSlot = 1100;
  DeviceArray<uint8_t> dst(kArrays * kSlot + 16);
  dst.Poison();
  const std::vector<uint8_t> poison = Read(dst.get(), kArrays * kSlot);
  std::vector<std::vector<uint8_t>> sent(kArrays);
  staging.BeginBatch();
  std::vector<uint8_t> source;
  for (int i = 0; i < kArrays; ++i) {
    const size_t bytes = 1 + rng() % (kSlot - 1);
    source = Random(bytes, rng);
    sent[i] = source;
    // Every third destination is 1 byte past a 16-byte boundary: the kernel's byte path.
    uint8_t* to = dst.get() + i * kSlot + (i % 3 == 0 ? 1 : 0);
    ASSERT_TRUE(staging.Append(to, source.data(), bytes, stream_).ok());
    std::fill(source.begin(), source.end(), 0xEF);  // reused at once
  }
  // 75 arrays of up to 1.1 KB do not fit a 4 KiB ring: parts of the batch were flushed early
  // and the rest is still deferred.
  EXPECT_GT(staging.deferred(), 0u);
  EXPECT_LT(staging.deferred(), size_t{kArrays});
  EXPECT_EQ(staging.capacity(), 4096u);
  ASSERT_TRUE(staging.FlushBatch(stream_).ok());
  EXPECT_FALSE(staging.batching());
  EXPECT_EQ(staging.deferred(), 0u);
  const std::vector<uint8_t> got = Read(dst.get(), kArrays * kSlot);
  for (int i = 0; i < kArrays; ++i) {
    const size_t at = i * kSlot + (i % 3 == 0 ? 1 : 0);
    ASSERT_TRUE(std::equal(sent[i].begin(), sent[i].end(), got.begin() + at)) << "array " << i;
    // Nothing written past the array (up to the next slot).
    ASSERT_TRUE(std::equal(got.begin() + at + sent[i].size(), got.begin() + (i + 1) * kSlot,
                           poison.begin() + at + sent[i].size()))
        << "array " << i;
  }
}

TEST_F(PinnedStagingTest, ABatchDefersEverythingToItsFlushAndADiscardedOneLandsNothing) {
  std::mt19937_64 rng(TestSeed());
  PinnedStaging staging;
  DeviceArray<uint8_t> dst(3 * 4096);
  dst.Poison();
  const std::vector<uint8_t> poison = Read(dst.get(), 3 * 4096);
  const std::vector<uint8_t> a = Random(4096, rng), b = Random(4000, rng), c = Random(100, rng);
  staging.BeginBatch();
  ASSERT_TRUE(staging.Append(dst.get(), a.data(), a.size(), stream_).ok());
  ASSERT_TRUE(staging.Append(dst.get() + 4096, b.data(), b.size(), stream_).ok());
  EXPECT_EQ(staging.deferred(), 2u);
  EXPECT_EQ(staging.pending(), 0u);  // nothing enqueued
  EXPECT_EQ(Read(dst.get(), 3 * 4096), poison);
  staging.DiscardBatch();
  EXPECT_EQ(Read(dst.get(), 3 * 4096), poison);
  // Two copies to the same bytes in one batch: the later one wins, as outside a batch.
  staging.BeginBatch();
  ASSERT_TRUE(staging.Append(dst.get() + 8192, b.data(), 100, stream_).ok());
  ASSERT_TRUE(staging.Append(dst.get() + 8192 + 50, c.data(), c.size(), stream_).ok());
  ASSERT_TRUE(staging.FlushBatch(stream_).ok());
  {
    const std::vector<uint8_t> got = Read(dst.get() + 8192, 150);
    EXPECT_TRUE(std::equal(b.begin(), b.begin() + 50, got.begin()));
    EXPECT_TRUE(std::equal(c.begin(), c.end(), got.begin() + 50));
  }
  // A batch of one array after it, then a plain copy: both land, in order.
  staging.BeginBatch();
  ASSERT_TRUE(staging.Append(dst.get() + 8192, c.data(), c.size(), stream_).ok());
  ASSERT_TRUE(staging.FlushBatch(stream_).ok());
  ASSERT_TRUE(staging.Append(dst.get(), a.data(), a.size(), stream_).ok());  // not batching
  EXPECT_EQ(staging.deferred(), 0u);
  const std::vector<uint8_t> got = Read(dst.get(), 3 * 4096);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), got.begin()));
  EXPECT_TRUE(std::equal(got.begin() + 4096, got.begin() + 8192, poison.begin() + 4096));
  EXPECT_TRUE(std::equal(c.begin(), c.end(), got.begin() + 8192));
}

// A batch array larger than 65535 slices of the copy kernel (512 MiB: a causal top-k of 32
// prefills of 2048 tokens is exactly that) lands whole, beside a small one, and nothing past it.
// Before, the flush refused it ("a segment of N bytes is too large") and with it the step's Plan.
TEST_F(PinnedStagingTest, ABatchArrayPastTheGridsSliceLimitLandsWhole) {
  constexpr size_t kBig = (size_t{600} << 20) + 13;  // odd: the byte tail too
  constexpr size_t kSmall = 4000;
  std::vector<uint8_t> big(kBig);
  uint64_t state = TestSeed() | 1;  // xorshift: fast enough for 600 MB, never constant
  for (size_t i = 0; i + 8 <= kBig; i += 8) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    std::memcpy(big.data() + i, &state, 8);
  }
  for (size_t i = kBig / 8 * 8; i < kBig; ++i) big[i] = static_cast<uint8_t>(i * 131 + 7);
  std::mt19937_64 rng(TestSeed());
  const std::vector<uint8_t> small = Random(kSmall, rng);
  DeviceArray<uint8_t> dst(kBig + 256 + kSmall + 64);
  if (HasFailure()) return;  // no room on this device
  dst.Poison();
  PinnedStaging staging;
  staging.BeginBatch();
  ASSERT_TRUE(staging.Append(dst.get() + kSmall + 64, big.data(), kBig, stream_).ok());
  ASSERT_TRUE(staging.Append(dst.get(), small.data(), kSmall, stream_).ok());
  ASSERT_TRUE(staging.FlushBatch(stream_).ok());
  const std::vector<uint8_t> got = Read(dst.get(), dst.size());
  EXPECT_TRUE(std::equal(small.begin(), small.end(), got.begin()));
  EXPECT_TRUE(std::equal(big.begin(), big.end(), got.begin() + kSmall + 64));
  // The poison between and after the arrays is intact (DeviceArray::Poison writes 0xFF bytes).
  for (size_t i = kSmall; i < kSmall + 64; ++i) ASSERT_EQ(got[i], 0xFF) << i;
  for (size_t i = kSmall + 64 + kBig; i < got.size(); ++i) ASSERT_EQ(got[i], 0xFF) << i;
}

// CudaDevice with DCP_BATCH_UPLOADS=1: StageToDevice inside a batch lands at the flush, before
// the device's next work on its stream.
TEST_F(PinnedStagingTest, DeviceBatchLandsBeforeTheNextWork) {
  setenv("DCP_BATCH_UPLOADS", "1", 1);
  auto created = CudaDevice::Create(0);
  unsetenv("DCP_BATCH_UPLOADS");
  ASSERT_TRUE(created.ok()) << created.status();
  CudaDevice& device = **created;
  ASSERT_TRUE(device.SetStream(stream_).ok());
  std::mt19937_64 rng(TestSeed());
  DeviceArray<uint8_t> dst(2 * 8192), copied(2 * 8192);
  copied.Poison();
  const std::vector<uint8_t> values = Random(2 * 8192, rng);
  device.BeginStagingBatch();
  ASSERT_TRUE(device.StageToDevice(dst.get(), values.data(), 8192).ok());
  ASSERT_TRUE(device.StageToDevice(dst.get() + 8192, values.data() + 8192, 8192).ok());
  ASSERT_TRUE(device.FlushStagingBatch().ok());
  ASSERT_TRUE(device.Copy(copied.get(), dst.get(), values.size()).ok());
  EXPECT_EQ(Read(copied.get(), values.size()), values);
  ASSERT_TRUE(device.SetStream(nullptr).ok());
  ASSERT_TRUE(device.Synchronize().ok());
}

}  // namespace
}  // namespace dcp::testing
