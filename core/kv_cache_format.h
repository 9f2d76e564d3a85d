// KV cache row formats (FORMATS.md "KV cache formats"): the `kv_cache_dtype` config value and
// the byte layout of vLLM's `fp8_ds_mla` rows, as constants every kernel that reads or writes
// such rows uses, plus the host E4M3 conversions of the CPU kernels.
//
// fp8_ds_mla, one 656-byte row per token (R = 512, Dr = 64 only):
//   bytes [0, 512)    kv_c as FP8 E4M3 (OCP "FN": no inf, +-448 max, 0x7f/0xff NaN), 4 tiles of
//                     128 values; value i of tile t is x_i / s_t rounded to nearest-even and
//                     saturated at +-448
//   bytes [512, 528)  s_0..s_3 as float32, s_t = max(max|x| over tile t / 448, FLT_MIN), float32
//   bytes [528, 656)  k_pe as bf16, unquantized
// Dequantized value: float(e4m3) * s_t in float32. x is the value as the rank stores it (bf16
// on CUDA ranks, float32 on CPU ranks).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "absl/status/status.h"

namespace dcp {

enum class KvCacheDType : uint8_t {
  kBF16 = 0,      // [kv_c | k_pe] in the storage dtype (1152 bytes at DeepSeek dims in bf16)
  kFp8DsMla = 1,  // the 656-byte rows above
};

// "bf16" / "fp8_ds_mla"; "?" for a value outside the enum.
const char* kv_cache_dtype_name(KvCacheDType dtype);
// Parses "bf16" or "fp8_ds_mla"; anything else is InvalidArgument naming both.
absl::Status ParseKvCacheDType(const std::string& text, KvCacheDType* dtype);
// OK for the formats this build compiles; InvalidArgument (naming the value) otherwise, e.g. an
// enum value cast from a number no format has.
absl::Status CheckKvCacheDTypeSupported(KvCacheDType dtype, const char* what);

namespace fp8_ds_mla {

inline constexpr int kLatentDim = 512;  // R
inline constexpr int kRopeDim = 64;     // Dr
inline constexpr int kRowWidth = kLatentDim + kRopeDim;  // 576 dequantized values per row
inline constexpr int kTileSize = 128;
inline constexpr int kNumTiles = kLatentDim / kTileSize;  // 4
inline constexpr int kScaleOffset = kLatentDim;                 // bytes
inline constexpr int kRopeOffset = kScaleOffset + 4 * kNumTiles;  // 528 bytes
inline constexpr int kRowBytes = kRopeOffset + 2 * kRopeDim;      // 656 bytes
inline constexpr float kFp8Max = 448.0f;
static_assert(kRowBytes == 656 && kRopeOffset == 528 && kRowBytes % 16 == 0);

// E4M3 (FN) code of a float32: round to nearest-even, saturate to +-448, NaN -> 0x7f | sign.
// Sign kept for zeros (-0 -> 0x80).
inline uint8_t FloatToE4m3(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7f;          // NaN
  if (magnitude >= 0x43e00000u) return sign | 0x7e;         // >= 448 (inf too): saturate
  if (magnitude < 0x3c800000u) {                            // < 2^-6: subnormal steps of 2^-9
    const float steps = std::nearbyint(std::bit_cast<float>(magnitude) * 512.0f);  // exact scale
    return sign | static_cast<uint8_t>(steps);              // 8 steps = 0x08 = 2^-6, normal
  }
  // Normal: keep 3 of the 23 mantissa bits, ties to even; a carry bumps the exponent.
  const uint32_t rounded = (magnitude + 0x7ffffu + ((magnitude >> 20) & 1u)) >> 20;
  const uint32_t exponent = (rounded >> 3) - 127 + 7;
  const uint32_t code = (exponent << 3) | (rounded & 7u);
  return sign | static_cast<uint8_t>(code > 0x7e ? 0x7e : code);
}

// float32 value of an E4M3 (FN) code.
inline float E4m3ToFloat(uint8_t code) {
  const uint32_t exponent = (code >> 3) & 15u, mantissa = code & 7u;
  float magnitude;
  if (exponent == 15 && mantissa == 7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);
  } else {
    magnitude = std::ldexp(static_cast<float>(8 + mantissa), static_cast<int>(exponent) - 10);
  }
  return (code & 0x80) ? -magnitude : magnitude;
}

// E4m3ToFloat of every code, built once: the host readers' decode is one load.
inline const float* E4m3Table() {
  static const auto* table = [] {
    auto* values = new float[256];
    for (int code = 0; code < 256; ++code) values[code] = E4m3ToFloat(static_cast<uint8_t>(code));
    return values;
  }();
  return table;
}

// One whole 656-byte row dequantized to 576 floats: kv_c as e4m3 * s_t (float32), then k_pe.
// The host reader of the CPU gather and the CPU sparse MQA.
inline void DequantizeRow(const uint8_t* row, float* out) {
  const float* decode = E4m3Table();
  float scales[kNumTiles];
  std::memcpy(scales, row + kScaleOffset, sizeof(scales));
  for (int t = 0; t < kNumTiles; ++t) {
    for (int i = t * kTileSize; i < (t + 1) * kTileSize; ++i) out[i] = decode[row[i]] * scales[t];
  }
  for (int i = 0; i < kRopeDim; ++i) {
    uint16_t bits;
    std::memcpy(&bits, row + kRopeOffset + 2 * i, 2);
    out[kLatentDim + i] = std::bit_cast<float>(uint32_t{bits} << 16);
  }
}

}  // namespace fp8_ds_mla
}  // namespace dcp
