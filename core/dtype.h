// Element types that cross the module's boundaries: fp32 and bf16 floats, int32 indices.
// `bf16` is 16 bits of storage (the upper half of an IEEE float), layout-compatible with
// CUDA's __nv_bfloat16; arithmetic is always done in fp32.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace dcp {

enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kI32 = 2 };

constexpr size_t dtype_size(DType dtype) {
  return dtype == DType::kBF16 ? 2 : 4;
}

constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kI32: return "I32";
  }
  return "?";
}

struct bf16 {
  uint16_t bits = 0;
};
static_assert(sizeof(bf16) == 2);

inline float bf16_to_float(bf16 value) {
  uint32_t word = static_cast<uint32_t>(value.bits) << 16;
  float result;
  std::memcpy(&result, &word, sizeof(result));
  return result;
}

// Round to nearest even; NaN stays a (quiet) NaN.
inline bf16 float_to_bf16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  if ((word & 0x7f800000u) == 0x7f800000u && (word & 0x007fffffu) != 0) {
    return bf16{static_cast<uint16_t>((word >> 16) | 0x0040u)};
  }
  word += 0x7fffu + ((word >> 16) & 1u);
  return bf16{static_cast<uint16_t>(word >> 16)};
}

inline float to_float(float value) { return value; }
inline float to_float(bf16 value) { return bf16_to_float(value); }

template <typename T>
T from_float(float value);
template <>
inline float from_float<float>(float value) { return value; }
template <>
inline bf16 from_float<bf16>(float value) { return float_to_bf16(value); }

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::kF32; }
template <>
constexpr DType dtype_of<bf16>() { return DType::kBF16; }
template <>
constexpr DType dtype_of<int32_t>() { return DType::kI32; }

}  // namespace dcp
