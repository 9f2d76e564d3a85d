// Values the communicator tests exchange: each rank can compute every rank's contribution
// alone. They are small multiples of 1/4, so bf16 holds them and their sums exactly, and the
// int32 encoding (x * 4) is exact too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace dcp::testing {

// The value rank r contributes at position i of a buffer tagged `salt`.
inline double value_of(int r, size_t i, int salt) {
  return 0.25 * static_cast<double>((r * 13 + static_cast<int>(i % 17) + salt) % 29);
}

template <typename T>
T as(double x) {
  if constexpr (std::is_same_v<T, bf16>) return float_to_bf16(static_cast<float>(x));
  if constexpr (std::is_same_v<T, float>) return static_cast<float>(x);
  if constexpr (std::is_same_v<T, int32_t>) return static_cast<int32_t>(x * 4);
}

template <typename T>
double back(T v) {
  if constexpr (std::is_same_v<T, bf16>) return bf16_to_float(v);
  if constexpr (std::is_same_v<T, float>) return v;
  if constexpr (std::is_same_v<T, int32_t>) return v / 4.0;
}

}  // namespace dcp::testing
