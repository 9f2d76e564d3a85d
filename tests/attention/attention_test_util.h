// Test helpers of tests/attention only: fresh-seed random data, storage in F32 or BF16 with the
// exact values the kernel reads, NaN poisoning and the tolerance checks. Nothing here touches
// the code under test.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace dcp::testing {

// fp32 storage and arithmetic: relative error; bf16 storage where something is rounded beyond
// the inputs (bf16 outputs, bf16 intermediates of a route).
inline constexpr double kF32Tolerance = 1e-5;
inline constexpr double kBf16Tolerance = 2e-2;
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// A fresh seed per run (std::random_device): every run explores new shapes and values; tests
// print it through SCOPED_TRACE so a failure can be replayed by hard-coding it.
inline uint64_t FreshSeed() {
  std::random_device device;
  return (uint64_t{device()} << 32) | device();
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(engine_); }
  double Normal() { return std::normal_distribution<double>(0.0, 1.0)(engine_); }
  double Uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(engine_);
  }
  bool Bool() { return Int(0, 1) == 1; }
  std::mt19937_64& engine() { return engine_; }

 private:
  std::mt19937_64 engine_;
};

inline std::string SeedTrace(uint64_t seed) { return "seed " + std::to_string(seed); }

// Values stored as F32 or BF16; exact[i] is the double value of what is stored (bf16-rounded
// where bf16), the input the reference must see.
struct Stored {
  DType dtype = DType::kF32;
  std::vector<float> f32;
  std::vector<bf16> b16;
  std::vector<double> exact;

  Stored() = default;
  Stored(DType type, size_t size) : dtype(type), exact(size, 0.0) {
    if (dtype == DType::kF32) {
      f32.assign(size, 0.0f);
    } else {
      b16.assign(size, float_to_bf16(0.0f));
    }
  }
  size_t size() const { return exact.size(); }
  void Set(size_t i, double value) {
    if (dtype == DType::kF32) {
      f32[i] = static_cast<float>(value);
      exact[i] = f32[i];
    } else {
      b16[i] = float_to_bf16(static_cast<float>(value));
      exact[i] = bf16_to_float(b16[i]);
    }
  }
  double Get(size_t i) const { return dtype == DType::kF32 ? f32[i] : bf16_to_float(b16[i]); }
  void* data() { return dtype == DType::kF32 ? static_cast<void*>(f32.data()) : b16.data(); }
  const void* data() const {
    return dtype == DType::kF32 ? static_cast<const void*>(f32.data()) : b16.data();
  }
};

inline Stored RandomStored(Rng& rng, DType dtype, size_t size, double stddev = 1.0) {
  Stored stored(dtype, size);
  for (size_t i = 0; i < size; ++i) stored.Set(i, stddev * rng.Normal());
  return stored;
}

inline DType RandomFloatDType(Rng& rng) { return rng.Bool() ? DType::kBF16 : DType::kF32; }

inline void Poison(std::vector<float>& values) {
  std::fill(values.begin(), values.end(), std::numeric_limits<float>::quiet_NaN());
}

// got (via get(i)) against ref over `count` elements: |got - ref| <= tol * (|ref| + max|ref|),
// i.e. relative error, with entries near zero judged against the tensor's scale. NaN, and any
// infinity that the reference does not have, fail.
template <typename Get>
::testing::AssertionResult AllCloseBy(const std::string& name, Get&& get,
                                      const std::vector<double>& ref, double tol) {
  double scale = 0.0;
  for (double value : ref) {
    if (std::isfinite(value)) scale = std::max(scale, std::abs(value));
  }
  int bad = 0;
  std::ostringstream message;
  double worst = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = get(i), r = ref[i];
    bool ok;
    if (std::isnan(g) || std::isnan(r)) {
      ok = false;
    } else if (std::isinf(r) || std::isinf(g)) {
      ok = g == r;
    } else {
      const double error = std::abs(g - r);
      worst = std::max(worst, error / (std::abs(r) + scale + 1e-300));
      ok = error <= tol * (std::abs(r) + scale);
    }
    if (!ok && ++bad <= 5) message << "\n  " << name << "[" << i << "] = " << g << ", want " << r;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << ref.size() << " elements of " << name << " off (tolerance " << tol
         << ", worst relative " << worst << "):" << message.str();
}

inline ::testing::AssertionResult AllClose(const std::string& name, const std::vector<float>& got,
                                           const std::vector<double>& ref, double tol) {
  if (got.size() < ref.size()) {
    return ::testing::AssertionFailure() << name << ": " << got.size() << " < " << ref.size();
  }
  return AllCloseBy(
      name, [&](size_t i) { return static_cast<double>(got[i]); }, ref, tol);
}

// LSEs: absolute error tol * max(1, |ref|) (an LSE near 0 has no meaningful relative error);
// -inf must be exactly -inf.
inline ::testing::AssertionResult LseClose(const std::string& name, const std::vector<float>& got,
                                           const std::vector<double>& ref, double tol) {
  int bad = 0;
  std::ostringstream message;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = got[i], r = ref[i];
    bool ok;
    if (std::isnan(g) || std::isnan(r)) {
      ok = false;
    } else if (std::isinf(r) || std::isinf(g)) {
      ok = g == r;
    } else {
      ok = std::abs(g - r) <= tol * std::max(1.0, std::abs(r));
    }
    if (!ok && ++bad <= 5) message << "\n  " << name << "[" << i << "] = " << g << ", want " << r;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << ref.size() << " LSEs of " << name
                                       << " off (tolerance " << tol << "):" << message.str();
}

}  // namespace dcp::testing
