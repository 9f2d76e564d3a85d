// An independent host model of the fp8_ds_mla cache row (FORMATS.md "KV cache formats"), written
// from the format's text and sharing no code with core/kv_cache_format.h or the kernels: the
// E4M3 encoder picks the nearest of the 253 finite codes by value (ties to the even code), not
// by bit manipulation; the decoder evaluates the code's definition in double.
#pragma once

#include <cstdint>
#include <vector>

namespace dcp::reference {

inline constexpr int kFp8RowBytes = 656;

// Value of an E4M3 (FN) code: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
// subnormal (m/8 * 2^-6); 0x7f / 0xff are NaN.
double E4m3Value(uint8_t code);

// The E4M3 code the format stores for the float32 value y = x / s: nearest finite code, ties
// to the code with an even mantissa, |y| > 448 saturated to +-448, the sign of zero kept, NaN
// to 0x7f.
uint8_t E4m3Nearest(float y);

// bf16 bits of a finite float, rounded to nearest-even.
uint16_t Bf16Nearest(float x);

// The 656 bytes of one token: kv_c [512] and k_pe [64] as the rank stores them (floats; a CUDA
// rank's bf16 values are passed as their exact float values).
std::vector<uint8_t> QuantizeFp8DsMlaRow(const float* kv_c, const float* k_pe);

// The 576 dequantized values of a row: e4m3 * s_t (rounded to float32, as the format says),
// then k_pe.
std::vector<double> DequantizeFp8DsMlaRow(const uint8_t* row);

}  // namespace dcp::reference
