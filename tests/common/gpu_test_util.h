// Shared helpers of the CUDA tests.
//
// - GPU presence: DCP_SKIP_OR_FAIL_WITHOUT_GPU() skips the test (GTEST_SKIP) when no CUDA
//   device is visible, but fails it when the environment says DCP_REQUIRE_GPU=1 (the GPU
//   machine's test run), so a silently skipped suite cannot pass there. GpuTest does it in
//   SetUp and binds device 0.
// - DeviceArray<T>: a cudaMalloc'd array (test-only RAII; the code under test allocates
//   through Device/cudaMalloc itself) with upload, download and poisoning.
// - Seeds: every test draws fresh random inputs from TestSeed(), printed so that a failure can
//   be replayed with DCP_TEST_SEED=<seed>.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/environment.h"
#include "gtest/gtest.h"

namespace dcp::testing {

inline bool GpuRequired() { return EnvSwitch("DCP_REQUIRE_GPU", false); }

inline int VisibleGpuCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

#define DCP_SKIP_OR_FAIL_WITHOUT_GPU()                                                      \
  do {                                                                                      \
    if (::dcp::testing::VisibleGpuCount() == 0) {                                           \
      if (::dcp::testing::GpuRequired()) {                                                  \
        FAIL() << "no CUDA GPU is visible, and DCP_REQUIRE_GPU=1 makes that a failure";     \
      }                                                                                     \
      GTEST_SKIP() << "no CUDA GPU visible (set DCP_REQUIRE_GPU=1 to make this a failure)"; \
    }                                                                                       \
  } while (0)

#define DCP_ASSERT_CUDA(call)                                                            \
  do {                                                                                   \
    const cudaError_t dcp_code_ = (call);                                                \
    ASSERT_EQ(dcp_code_, cudaSuccess) << #call << ": " << cudaGetErrorString(dcp_code_); \
  } while (0)

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DCP_SKIP_OR_FAIL_WITHOUT_GPU();
    DCP_ASSERT_CUDA(cudaSetDevice(0));
  }
  void TearDown() override {
    if (VisibleGpuCount() == 0) return;
    // A kernel fault surfaces at the next synchronization: make it this test's failure.
    const cudaError_t code = cudaDeviceSynchronize();
    EXPECT_EQ(code, cudaSuccess) << "device error after the test: " << cudaGetErrorString(code);
  }
};

// A seed per test: DCP_TEST_SEED when set, else fresh; printed either way.
inline uint64_t TestSeed() {
  uint64_t seed = 0;
  if (const char* value = std::getenv("DCP_TEST_SEED"); value != nullptr && *value != '\0') {
    seed = std::strtoull(value, nullptr, 10);
  } else {
    seed = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  }
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::cout << "[seed] " << (info ? info->name() : "?") << ": DCP_TEST_SEED=" << seed
            << std::endl;
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return seed;
}

template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t count) : count_(count) {
    if (count > 0 && cudaMalloc(&data_, count * sizeof(T)) != cudaSuccess) {
      data_ = nullptr;
      ADD_FAILURE() << "cudaMalloc of " << count * sizeof(T) << " bytes failed";
    }
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { Upload(host); }
  DeviceArray(DeviceArray&& other) noexcept { *this = std::move(other); }
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(count_, other.count_);
    return *this;
  }
  ~DeviceArray() {
    if (data_ != nullptr) cudaFree(data_);
  }

  T* get() const { return static_cast<T*>(data_); }
  size_t size() const { return count_; }

  void Upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size(), count_);
    if (count_ == 0) return;
    ASSERT_EQ(cudaMemcpy(data_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<T> Download() const {
    std::vector<T> host(count_);
    if (count_ > 0) {
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    return host;
  }
  // Every byte 0xFF: NaN for floats and bf16, -1 for ints. Unwritten outputs then show. Waits
  // for the memset: it runs on the legacy default stream, which work on a non-blocking stream
  // does not wait for (a kernel's output could otherwise be poisoned after it was written).
  void Poison() {
    if (count_ > 0) {
      EXPECT_EQ(cudaMemset(data_, 0xFF, count_ * sizeof(T)), cudaSuccess);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
  }

 private:
  void* data_ = nullptr;
  size_t count_ = 0;
};

// bf16 helpers: values drawn as floats, stored as bf16, and read back as the exact double that
// the GPU sees.
inline std::vector<bf16> ToBf16(const std::vector<float>& values) {
  std::vector<bf16> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = float_to_bf16(values[i]);
  return out;
}
inline std::vector<double> ToDouble(const std::vector<bf16>& values) {
  std::vector<double> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = bf16_to_float(values[i]);
  return out;
}

inline std::vector<float> RandomFloats(std::mt19937_64& rng, size_t count, float low = -1.f,
                                       float high = 1.f) {
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> out(count);
  for (float& v : out) v = dist(rng);
  return out;
}

// Relative L2 error of `got` against `want` over a range, and the first non-finite value.
struct Comparison {
  double relative_error = 0;
  bool all_finite = true;
};
inline Comparison Compare(const float* got, const double* want, size_t count) {
  double diff = 0, norm = 0;
  Comparison result;
  for (size_t i = 0; i < count; ++i) {
    if (!std::isfinite(got[i])) result.all_finite = false;
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  result.relative_error = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
  return result;
}

}  // namespace dcp::testing
