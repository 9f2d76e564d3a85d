// CudaDevice through the Device interface (runtime/cuda/cuda_device.h): identity, memory,
// copies, conversion (bit-exact against dtype.h's rounding), error Statuses, and the attention
// entry points cross-checked against the CPU twins (attention/cpu) on the same bf16 inputs.
// Ground truth for the kernels is the float64 tests of tests/attention/cuda; this is the plumbing.
#include "runtime/cuda/cuda_device.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "attention/cpu/attention_cpu.h"
#include "attention/cuda/sparse_mqa.h"
#include "attention/topk_validation.h"
#include "collectives/cuda/nccl_status.h"
#include "core/cuda/cuda_status.h"
#include "gtest/gtest.h"
#include "runtime/config.h"
#include "tests/common/gpu_test_util.h"

namespace dcp::testing {
namespace {

class CudaDeviceTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped() || HasFailure()) return;
    auto device = CudaDevice::Create(0);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(device).value();
  }
  void TearDown() override {
    device_.reset();
    GpuTest::TearDown();
  }
  template <typename T>
  Buffer Upload(const std::vector<T>& host) {
    auto buffer = device_->Allocate(host.size() * sizeof(T));
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    EXPECT_TRUE(device_->CopyFromHost(buffer->data(), host.data(), host.size() * sizeof(T)).ok());
    return std::move(buffer).value();
  }
  template <typename T>
  std::vector<T> Download(const Buffer& buffer) {
    std::vector<T> host(buffer.bytes() / sizeof(T));
    EXPECT_TRUE(device_->CopyToHost(host.data(), buffer.data(), buffer.bytes()).ok());
    return host;
  }
  std::unique_ptr<CudaDevice> device_;
};

// The memory rule DcpEngine::Run checks on CUDA ranks before it writes the cache (no GPU
// needed): each refusal names what is wrong; what the kernels take passes.
TEST(CudaLayerMemoryTest, MisalignedCacheOrBf16OutputIsRefused) {
  alignas(16) static char memory[64];
  void* aligned = memory;
  EXPECT_TRUE(CheckCudaLayerMemory(aligned, 1152, aligned, DType::kBF16).ok());
  EXPECT_TRUE(CheckCudaLayerMemory(aligned, 656, memory + 1, DType::kF32).ok());
  const auto message = [](absl::Status status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    return std::string(status.message());
  };
  EXPECT_NE(message(CheckCudaLayerMemory(memory + 8, 1152, aligned, DType::kBF16))
                .find("KV cache must be 16-byte aligned"),
            std::string::npos);
  // A bf16 row stride of 580 elements: 1160 bytes.
  EXPECT_NE(message(CheckCudaLayerMemory(aligned, 1160, aligned, DType::kBF16))
                .find("row stride 1160 bytes"),
            std::string::npos);
  EXPECT_NE(message(CheckCudaLayerMemory(aligned, 1152, memory + 2, DType::kBF16))
                .find("BF16 layer output must be 4-byte aligned"),
            std::string::npos);
}

// The model sizes an engine on a CUDA rank accepts at Create (no GPU needed): the sparse MQA
// kernels' 576 / 512; the small test model (80 / 64) is refused, naming both numbers.
TEST(CudaSparseMqaSupportTest, OnlyTheCompiledLatentSizes) {
  EXPECT_TRUE(cuda::CheckSparseMqaSizes(576, 512).ok());
  const ModelDims small;
  const absl::Status refused = cuda::CheckSparseMqaSizes(small.latent_width(), small.kv_lora_rank);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("this model has 80 / 64"), std::string::npos) << refused;
  EXPECT_FALSE(cuda::CheckSparseMqaSizes(576, 448).ok());
}

TEST_F(CudaDeviceTest, Identity) {
  EXPECT_EQ(device_->name(), "cuda:0");
  EXPECT_EQ(device_->memory_space(), MemorySpace::kDevice);
  EXPECT_EQ(device_->storage_dtype(), DType::kBF16);
  EXPECT_TRUE(device_->DenseMhaSupport(192, 128).ok());
  const absl::Status unsupported = device_->DenseMhaSupport(128, 128);
  EXPECT_FALSE(unsupported.ok());
  EXPECT_NE(unsupported.message().find("192"), std::string::npos);
  auto selected = SelectLocalDevice();
  ASSERT_TRUE(selected.ok()) << selected.status();
  EXPECT_GE(*selected, 0);
  EXPECT_NE(MakeCudaDevice(0), nullptr);
  EXPECT_EQ(MakeCudaDevice(1 << 20), nullptr);
}

TEST_F(CudaDeviceTest, MemoryAndCopies) {
  std::mt19937_64 rng(TestSeed());
  auto empty = device_->Allocate(0);
  ASSERT_TRUE(empty.ok());
  auto huge = device_->Allocate(size_t(1) << 50);  // a petabyte: a clean error
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();

  std::vector<int32_t> values(1000);
  for (auto& v : values) v = int32_t(rng());
  Buffer a = Upload(values);
  auto b = device_->Allocate(a.bytes());
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(device_->Copy(b->data(), a.data(), a.bytes()).ok());
  EXPECT_EQ(Download<int32_t>(*b), values);

  // Copy2D: 10 rows of 12 bytes out of 40-byte rows into 16-byte rows.
  auto c = device_->Allocate(10 * 16);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(device_->Memset(c->data(), 0x5A, c->bytes()).ok());
  ASSERT_TRUE(device_->Copy2D(c->data(), 16, a.data(), 40, 12, 10).ok());
  const auto copied = Download<uint8_t>(*c);
  const auto* source = reinterpret_cast<const uint8_t*>(values.data());
  for (int r = 0; r < 10; ++r) {
    for (int i = 0; i < 16; ++i) {
      ASSERT_EQ(copied[r * 16 + i], i < 12 ? source[r * 40 + i] : 0x5A) << r << "," << i;
    }
  }
  EXPECT_FALSE(device_->Copy2D(c->data(), 8, a.data(), 40, 12, 10).ok());  // stride < row
  ASSERT_TRUE(device_->Synchronize().ok());
}

// Copy2D is a kernel (core/cuda/copy_2d.h): its 16-byte, 4-byte and byte units, short rows
// with long pitches (the decode's q_pe), more units than its grid covers (the grid-stride
// loop), against memcpy on the host; bytes between the rows stay as they were.
TEST_F(CudaDeviceTest, Copy2DEveryUnitAndTheGridStride) {
  std::mt19937_64 rng(TestSeed());
  std::uniform_int_distribution<int> byte(0, 255);
  struct Case {
    size_t rows, row_bytes, src_pitch, dst_pitch, misalign;
  };
  // 8192 x 128: q_pe of 64 tokens x 128 heads; 4096 x 1024: 262144 16-byte units, more than
  // the launch's threads; 4-byte units (pitches of 4); bytes (a misaligned pointer, odd sizes).
  const Case cases[] = {{1, 16, 16, 16, 0},          {37, 128, 144, 1152, 0},
                        {8192, 128, 128, 1152, 0},   {4096, 1024, 1040, 1024, 0},
                        {33, 12, 20, 40, 0},         {37, 129, 144, 1152, 1},
                        {5, 3, 7, 9, 3}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " bytes " << c.row_bytes
                                      << " misalign " << c.misalign);
    std::vector<uint8_t> src(c.rows * c.src_pitch + 16), dst(c.rows * c.dst_pitch + 16);
    for (auto& v : src) v = static_cast<uint8_t>(byte(rng));
    for (auto& v : dst) v = static_cast<uint8_t>(byte(rng));
    Buffer dsrc = Upload(src), ddst = Upload(dst);
    ASSERT_TRUE(device_
                    ->Copy2D(ddst.as<uint8_t>() + c.misalign, c.dst_pitch,
                             dsrc.as<uint8_t>() + c.misalign, c.src_pitch, c.row_bytes, c.rows)
                    .ok());
    std::vector<uint8_t> want = dst;
    for (size_t row = 0; row < c.rows; ++row) {
      std::memcpy(&want[row * c.dst_pitch + c.misalign], &src[row * c.src_pitch + c.misalign],
                  c.row_bytes);
    }
    EXPECT_EQ(Download<uint8_t>(ddst), want);
  }
  Buffer a = Upload(std::vector<uint8_t>(64, 7));
  EXPECT_TRUE(device_->Copy2D(nullptr, 16, nullptr, 16, 0, 4).ok());  // nothing to copy
  const absl::Status null = device_->Copy2D(nullptr, 16, a.data(), 16, 16, 2);
  EXPECT_EQ(null.code(), absl::StatusCode::kInvalidArgument) << null;
  const absl::Status pitch = device_->Copy2D(a.data(), 8, a.data(), 16, 16, 2);
  EXPECT_EQ(pitch.code(), absl::StatusCode::kInvalidArgument) << pitch;
  EXPECT_NE(std::string(pitch.message()).find("pitches"), std::string::npos) << pitch;
  EXPECT_EQ(Download<uint8_t>(a), std::vector<uint8_t>(64, 7));
}

TEST_F(CudaDeviceTest, ConvertIsBitExact) {
  std::mt19937_64 rng(TestSeed());
  std::vector<float> values = RandomFloats(rng, 1003, -1e4f, 1e4f);
  values[0] = std::nanf("");
  values[1] = INFINITY;
  values[2] = -0.f;
  values[3] = 1.00390625f;  // a tie: rounds to even
  values[4] = 3.4e38f;      // rounds to +inf
  Buffer f32 = Upload(values);
  auto bf = device_->Allocate(values.size() * 2);
  ASSERT_TRUE(bf.ok());
  // Whole array (16-byte vectors + tail) and an offset view (unaligned: scalar path).
  ASSERT_TRUE(device_->Convert(bf->data(), DType::kBF16, f32.data(), DType::kF32, values.size()).ok());
  auto got = Download<bf16>(*bf);
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(got[i].bits, float_to_bf16(values[i]).bits) << "element " << i << " " << values[i];
  }
  ASSERT_TRUE(device_
                  ->Convert(static_cast<bf16*>(bf->data()) + 1, DType::kBF16,
                            f32.as<float>() + 1, DType::kF32, values.size() - 1)
                  .ok());
  got = Download<bf16>(*bf);
  for (size_t i = 1; i < values.size(); ++i) ASSERT_EQ(got[i].bits, float_to_bf16(values[i]).bits);
  auto back = device_->Allocate(values.size() * 4);
  ASSERT_TRUE(back.ok());
  ASSERT_TRUE(device_->Convert(back->data(), DType::kF32, bf->data(), DType::kBF16, values.size()).ok());
  const auto widened = Download<float>(*back);
  for (size_t i = 1; i < values.size(); ++i) {
    const float want = bf16_to_float(got[i]);
    ASSERT_TRUE(widened[i] == want || (std::isnan(want) && std::isnan(widened[i])));
  }
  EXPECT_EQ(device_->Convert(bf->data(), DType::kI32, f32.data(), DType::kF32, 4).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaDeviceTest, ErrorStatusCarriesCallAndLocation) {
  const absl::Status status =
      CudaCodeToStatus(cudaErrorInvalidValue, "cudaMemcpy(dst, src, n)", "runtime/x.cc", 12);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(status.message().find("cudaMemcpy(dst, src, n)"), std::string::npos) << status;
  EXPECT_NE(status.message().find("cudaErrorInvalidValue"), std::string::npos) << status;
  EXPECT_NE(status.message().find("x.cc:12"), std::string::npos) << status;
  EXPECT_NE(status.message().find("[rank"), std::string::npos) << status;
  EXPECT_TRUE(CudaCodeToStatus(cudaSuccess, "x", "y", 1).ok());
  EXPECT_FALSE(NcclCodeToStatus(ncclInvalidArgument, "ncclAllGather(...)", "c.cc", 3).ok());
}

// The device's SparseMqa against the CPU twin on the same bf16 inputs.
TEST_F(CudaDeviceTest, SparseMqaMatchesCpuTwin) {
  std::mt19937_64 rng(TestSeed());
  const int tokens = 6, heads = 32, topk = 300, slots = 2000, d = 576, dv = 512;
  const auto q = ToBf16(RandomFloats(rng, size_t(tokens) * heads * d));
  const auto kv = ToBf16(RandomFloats(rng, size_t(slots) * d));
  std::vector<int32_t> indices(size_t(tokens) * topk);
  std::vector<int32_t> pool(slots);
  std::iota(pool.begin(), pool.end(), 0);
  for (int t = 0; t < tokens; ++t) {
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int k = 0; k < topk; ++k) indices[t * topk + k] = (k % 5 == 0) ? -1 : pool[k];
  }
  Buffer dq = Upload(q), dkv = Upload(kv), didx = Upload(indices);
  auto dout = device_->Allocate(size_t(tokens) * heads * dv * 4);
  auto dlse = device_->Allocate(size_t(tokens) * heads * 4);
  ASSERT_TRUE(dout.ok() && dlse.ok());
  SparseMqaParams p;
  p.q = dq.data();
  p.kv_cache = dkv.data();
  p.indices = didx.as<int32_t>();
  p.out = dout->as<float>();
  p.lse = dlse->as<float>();
  p.dtype = DType::kBF16;
  p.num_tokens = tokens;
  p.num_heads = heads;
  p.head_dim = d;
  p.v_dim = dv;
  p.topk = topk;
  p.num_slots = slots;
  p.q_token_stride = int64_t(heads) * d;
  p.q_head_stride = d;
  p.kv_row_stride = d;
  p.indices_token_stride = topk;
  p.out_token_stride = int64_t(heads) * dv;
  p.out_head_stride = dv;
  p.lse_token_stride = heads;
  p.scale = 0.07f;
  ASSERT_TRUE(device_->SparseMqa(p).ok());
  const auto got = Download<float>(*dout);
  const auto got_lse = Download<float>(*dlse);

  std::vector<float> cpu_out(got.size()), cpu_lse(got_lse.size());
  SparseMqaParams h = p;
  h.q = q.data();
  h.kv_cache = kv.data();
  h.indices = indices.data();
  h.out = cpu_out.data();
  h.lse = cpu_lse.data();
  const absl::Status cpu = cpu::SparseMqa(h, /*validate=*/true);
  ASSERT_TRUE(cpu.ok()) << cpu;
  std::vector<double> want(cpu_out.begin(), cpu_out.end());
  EXPECT_LT(Compare(got.data(), want.data(), got.size()).relative_error, 1e-2);
  for (size_t i = 0; i < got_lse.size(); ++i) ASSERT_NEAR(got_lse[i], cpu_lse[i], 2e-3);
}

TEST_F(CudaDeviceTest, DenseMhaChecksSeqlensAndMatchesCpuTwin) {
  std::mt19937_64 rng(TestSeed());
  const int heads = 2, qk = 192, v = 128;
  const std::vector<int32_t> cu_q = {0, 3, 80}, cu_k = {0, 50, 127};
  const int tq = cu_q.back(), tk = cu_k.back();
  const auto q = ToBf16(RandomFloats(rng, size_t(tq) * heads * qk));
  const auto k = ToBf16(RandomFloats(rng, size_t(tk) * heads * qk));
  const auto vv = ToBf16(RandomFloats(rng, size_t(tk) * heads * v));
  Buffer dq = Upload(q), dk = Upload(k), dv = Upload(vv), dcq = Upload(cu_q), dck = Upload(cu_k);
  auto dout = device_->Allocate(size_t(tq) * heads * v * 4);
  auto dlse = device_->Allocate(size_t(tq) * heads * 4);
  ASSERT_TRUE(dout.ok() && dlse.ok());
  DenseMhaParams p;
  p.q = dq.data();
  p.k = dk.data();
  p.v = dv.data();
  p.out = dout->as<float>();
  p.lse = dlse->as<float>();
  p.cu_seqlens_q = dcq.as<int32_t>();
  p.cu_seqlens_k = dck.as<int32_t>();
  p.dtype = DType::kBF16;
  p.num_seqs = 2;
  p.num_heads = heads;
  p.qk_dim = qk;
  p.v_dim = v;
  p.max_seqlen_q = 10;  // too small for the second sequence: must be rejected
  p.max_seqlen_k = 77;
  p.q_token_stride = int64_t(heads) * qk;
  p.q_head_stride = qk;
  p.k_token_stride = int64_t(heads) * qk;
  p.k_head_stride = qk;
  p.v_token_stride = int64_t(heads) * v;
  p.v_head_stride = v;
  p.out_token_stride = int64_t(heads) * v;
  p.out_head_stride = v;
  p.lse_token_stride = heads;
  p.causal = true;
  p.scale = 0.072f;
  EXPECT_EQ(device_->DenseMha(p).code(), absl::StatusCode::kInvalidArgument);
  p.max_seqlen_q = 77;
  ASSERT_TRUE(device_->DenseMha(p).ok());
  const auto got = Download<float>(*dout);
  const auto got_lse = Download<float>(*dlse);

  std::vector<float> cpu_out(got.size()), cpu_lse(got_lse.size());
  DenseMhaParams h = p;
  h.q = q.data();
  h.k = k.data();
  h.v = vv.data();
  h.cu_seqlens_q = cu_q.data();
  h.cu_seqlens_k = cu_k.data();
  h.out = cpu_out.data();
  h.lse = cpu_lse.data();
  const absl::Status cpu = cpu::DenseMha(h);
  ASSERT_TRUE(cpu.ok()) << cpu;
  std::vector<double> want(cpu_out.begin(), cpu_out.end());
  EXPECT_LT(Compare(got.data(), want.data(), got.size()).relative_error, 1e-2);
  for (size_t i = 0; i < got_lse.size(); ++i) ASSERT_NEAR(got_lse[i], cpu_lse[i], 2e-3);
}

// The top-k check in two halves (Begin / Finish): the verdict of the host check, to the letter,
// on rows of consecutive indices (every lane of a warp marking one bitmap word) and on rows with
// a repeat or an out-of-range entry, which Finish describes from the device's rows.
TEST_F(CudaDeviceTest, TopkCheckInTwoHalvesMatchesTheHostCheck) {
  std::mt19937_64 rng(TestSeed());
  constexpr int kTokens = 40, kWidth = 2048, kStride = 2056, kMax = 9000;
  std::vector<int32_t> topk(size_t(kTokens) * kStride, -7), position(kTokens);
  for (int t = 0; t < kTokens; ++t) {
    position[t] = 2047 + int(rng() % (kMax - 2047));
    const int start = t % 3 == 0 ? 0 : int(rng() % (position[t] - 2046));
    for (int c = 0; c < kWidth; ++c) topk[size_t(t) * kStride + c] = start + c;
    if (t % 5 == 1) topk[size_t(t) * kStride + rng() % kWidth] = -1;
  }
  auto check = [&](const std::vector<int32_t>& rows, int first_token) {
    Buffer d_topk = Upload(rows), d_position = Upload(position);
    TopkValidateParams p;
    p.topk = static_cast<const int32_t*>(d_topk.data());
    p.token_position = static_cast<const int32_t*>(d_position.data());
    p.num_tokens = kTokens;
    p.topk_width = kWidth;
    p.topk_token_stride = kStride;
    p.max_positions = kMax;
    p.first_token = first_token;
    TopkValidateParams host = p;
    host.topk = rows.data();
    host.token_position = position.data();
    const absl::Status expected = ValidateTopkPositions(host);
    EXPECT_TRUE(device_->BeginValidateTopk(p).ok());
    const absl::Status begun = device_->FinishValidateTopk();
    EXPECT_EQ(begun.code(), expected.code()) << begun << " / " << expected;
    EXPECT_EQ(begun.message(), expected.message());
    const absl::Status whole = device_->ValidateTopk(p);
    EXPECT_EQ(whole.message(), expected.message());
    return begun;
  };
  EXPECT_TRUE(check(topk, 0).ok());
  std::vector<int32_t> bad = topk;
  const int row = 17, column = 1500;
  bad[size_t(row) * kStride + column] = bad[size_t(row) * kStride + 3];  // a repeat
  EXPECT_EQ(check(bad, 100).code(), absl::StatusCode::kInvalidArgument);
  bad[size_t(row - 4) * kStride + 9] = position[row - 4] + 1;  // a future key, an earlier row
  const absl::Status future = check(bad, 0);
  EXPECT_NE(std::string(future.message()).find("token 13"), std::string::npos) << future;
  EXPECT_TRUE(check(topk, 0).ok());  // the record is reset between checks
  EXPECT_FALSE(device_->FinishValidateTopk().ok());  // no check pending
}

TEST_F(CudaDeviceTest, GemmThroughDevice) {
  std::mt19937_64 rng(TestSeed());
  const int m = 20, n = 30, k = 40;
  const auto a = ToBf16(RandomFloats(rng, size_t(m) * k));
  const auto b = ToBf16(RandomFloats(rng, size_t(k) * n));
  Buffer da = Upload(a), db = Upload(b);
  auto dc = device_->Allocate(size_t(m) * n * 4);
  ASSERT_TRUE(dc.ok());
  GemmParams p;
  p.a = da.data();
  p.b = db.data();
  p.c = dc->data();
  p.a_dtype = p.b_dtype = DType::kBF16;
  p.c_dtype = DType::kF32;
  p.m = m;
  p.n = n;
  p.k = k;
  p.lda = k;
  p.ldb = n;
  p.ldc = n;
  ASSERT_TRUE(device_->Gemm(p).ok());
  const auto c = Download<float>(*dc);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double want = 0;
      for (int x = 0; x < k; ++x) {
        want += double(bf16_to_float(a[i * k + x])) * bf16_to_float(b[x * n + j]);
      }
      ASSERT_NEAR(c[i * n + j], want, 1e-4 * (1 + std::abs(want)));
    }
  }
}

}  // namespace
}  // namespace dcp::testing
