// Device-side FP8 E4M3 (FN) conversions of the fp8_ds_mla kernels (core/kv_cache_format.h
// has the format and the host twins): the cache write (workspace/cuda) and the readers
// (workspace/cuda gather, attention/cuda sparse MQA).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace dcp::cuda {

// E4M3 (FN) code of x: round to nearest-even, saturate to +-448, NaN -> NaN (the cvt
// instruction's satfinite mode on sm_89+).
__device__ __forceinline__ uint8_t Fp8E4m3FromFloat(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// 8 FP8 codes (little-endian in `codes`) times `scale` in float32, rounded to 8 bf16. The codes
// convert in pairs (cvt.rn.f16x2.e4m3x2: the low byte becomes the low half, exactly).
__device__ __forceinline__ uint4 DequantizeFp8x8ToBf16(uint2 codes, float scale) {
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = i < 2 ? codes.x : codes.y;
    const auto pair_codes = static_cast<__nv_fp8x2_storage_t>(word >> ((i & 1) * 16));
    const float2 pair = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair_codes, __NV_E4M3)));
    const __nv_bfloat162 rounded =
        __floats2bfloat162_rn(__fmul_rn(pair.x, scale), __fmul_rn(pair.y, scale));
    out[i] = *reinterpret_cast<const uint32_t*>(&rounded);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

}  // namespace dcp::cuda
