#include "tests/reference/fp8_ds_mla_reference.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

namespace dcp::reference {

double E4m3Value(uint8_t code) {
  const bool negative = code >= 128;
  const int magnitude_code = code % 128;
  if (magnitude_code == 127) return std::numeric_limits<double>::quiet_NaN();
  const int exponent_field = magnitude_code / 8;
  const int mantissa_field = magnitude_code % 8;
  double value;
  if (exponent_field == 0) {
    value = (mantissa_field / 8.0) * std::pow(2.0, -6);
  } else {
    value = (1.0 + mantissa_field / 8.0) * std::pow(2.0, exponent_field - 7);
  }
  return negative ? -value : value;
}

uint8_t E4m3Nearest(float y) {
  if (std::isnan(y)) return 0x7f;
  const uint8_t sign = std::signbit(y) ? 0x80 : 0x00;
  const double target = std::fabs(static_cast<double>(y));
  if (target >= 448.0) return sign | 0x7e;
  // Linear search over the finite non-negative codes 0x00..0x7e (values ascending).
  int best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int code = 0; code <= 0x7e; ++code) {
    const double distance = std::fabs(E4m3Value(static_cast<uint8_t>(code)) - target);
    if (distance < best_distance || (distance == best_distance && code % 2 == 0)) {
      best = code;
      best_distance = distance;
    }
  }
  return sign | static_cast<uint8_t>(best);
}

uint16_t Bf16Nearest(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint32_t down_bits = bits & 0xffff0000u;
  const uint32_t up_bits = down_bits + 0x10000u;  // next bf16 away from zero
  float down, up;
  std::memcpy(&down, &down_bits, 4);
  std::memcpy(&up, &up_bits, 4);
  const double to_down = std::fabs(double(x) - double(down));
  const double to_up = std::fabs(double(up) - double(x));
  if (to_down < to_up) return static_cast<uint16_t>(down_bits >> 16);
  if (to_up < to_down) return static_cast<uint16_t>(up_bits >> 16);
  return ((down_bits >> 16) % 2 == 0) ? static_cast<uint16_t>(down_bits >> 16)
                                      : static_cast<uint16_t>(up_bits >> 16);
}

std::vector<uint8_t> QuantizeFp8DsMlaRow(const float* kv_c, const float* k_pe) {
  std::vector<uint8_t> row(kFp8RowBytes, 0);
  for (int tile = 0; tile < 4; ++tile) {
    float largest = 0.0f;
    for (int i = 0; i < 128; ++i) {
      const float magnitude = std::fabs(kv_c[tile * 128 + i]);
      if (magnitude > largest) largest = magnitude;
    }
    // The format: s = max(max|x| / 448, FLT_MIN) in float32, stored value x / s in float32.
    const float quotient = largest / 448.0f;
    const float s = quotient > FLT_MIN ? quotient : FLT_MIN;
    for (int i = 0; i < 128; ++i) {
      const float y = kv_c[tile * 128 + i] / s;
      row[tile * 128 + i] = E4m3Nearest(y);
    }
    std::memcpy(&row[512 + 4 * tile], &s, 4);
  }
  for (int i = 0; i < 64; ++i) {
    const uint16_t bits = Bf16Nearest(k_pe[i]);
    row[528 + 2 * i] = static_cast<uint8_t>(bits & 0xff);  // little-endian
    row[528 + 2 * i + 1] = static_cast<uint8_t>(bits >> 8);
  }
  return row;
}

std::vector<double> DequantizeFp8DsMlaRow(const uint8_t* row) {
  std::vector<double> out(576);
  for (int i = 0; i < 512; ++i) {
    float s;
    std::memcpy(&s, row + 512 + 4 * (i / 128), 4);
    // The product of a 4-bit and a 24-bit significand is exact in double; one rounding to
    // float32 then gives the format's float32 product.
    out[i] = static_cast<float>(E4m3Value(row[i]) * static_cast<double>(s));
  }
  for (int i = 0; i < 64; ++i) {
    const uint32_t bits = uint32_t{row[528 + 2 * i]} | (uint32_t{row[528 + 2 * i + 1]} << 8);
    const uint32_t word = bits << 16;
    float value;
    std::memcpy(&value, &word, 4);
    out[512 + i] = value;
  }
  return out;
}

}  // namespace dcp::reference
