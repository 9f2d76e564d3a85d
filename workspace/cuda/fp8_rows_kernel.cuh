// Kernels behind WriteFp8DsMlaRows / GatherFp8DsMlaRows (fp8_rows_cuda.h).
//
// Write: one warp per row (grid-stride over rows). Lane l holds kv_c values [16l, 16l + 16)
// (two 16-byte loads), so tile t is lanes [8t, 8t + 8): its max |x| is a 3-step xor shuffle
// within those 8 lanes. Each lane writes its 16 FP8 bytes with one 16-byte store; lanes 8t
// write the scales, lanes 0-7 copy k_pe (128 bytes). A skipped slot skips the whole warp.
// Gather: the (row, unit) pairs of the output flattened like GatherRowsKernel, a unit = 8
// output values (one 16-byte bf16 store): units 0-63 dequantize 8 FP8 bytes of kv_c with their
// tile's scale, units 64-71 copy 8 bf16 of k_pe.
#pragma once

#include <cuda_bf16.h>

#include <cfloat>
#include <cstdint>

#include "core/cuda/fp8_e4m3.cuh"
#include "core/kv_cache_format.h"

namespace dcp::cuda {

__global__ void WriteFp8DsMlaKernel(const __nv_bfloat16* __restrict__ kv_c,
                                    const __nv_bfloat16* __restrict__ k_pe,
                                    const int32_t* __restrict__ slot_mapping,
                                    uint8_t* __restrict__ cache, int64_t num_rows,
                                    int64_t num_slots, int64_t kv_c_stride, int64_t k_pe_stride) {
  namespace f = fp8_ds_mla;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; row < num_rows;
       row += warps) {
    const int64_t slot = slot_mapping[row];
    if (slot < 0 || slot >= num_slots) continue;  // the same for the whole warp
    const uint4* src = reinterpret_cast<const uint4*>(kv_c + row * kv_c_stride) + 2 * lane;
    const uint4 words[2] = {src[0], src[1]};
    const __nv_bfloat16* values = reinterpret_cast<const __nv_bfloat16*>(words);
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(__bfloat162float(values[i])));
#pragma unroll
    for (int offset = 1; offset < 8; offset *= 2) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    }
    const float scale = fmaxf(__fdiv_rn(amax, f::kFp8Max), FLT_MIN);
    uint32_t codes[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      uint32_t word = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const float x = __bfloat162float(values[4 * w + b]);
        word |= uint32_t(Fp8E4m3FromFloat(__fdiv_rn(x, scale))) << (8 * b);
      }
      codes[w] = word;
    }
    uint8_t* dst = cache + slot * f::kRowBytes;
    reinterpret_cast<uint4*>(dst)[lane] = make_uint4(codes[0], codes[1], codes[2], codes[3]);
    if (lane % 8 == 0) {
      reinterpret_cast<float*>(dst + f::kScaleOffset)[lane / 8] = scale;
    }
    if (lane < 8) {
      reinterpret_cast<uint4*>(dst + f::kRopeOffset)[lane] =
          reinterpret_cast<const uint4*>(k_pe + row * k_pe_stride)[lane];
    }
  }
}

__global__ void GatherFp8DsMlaKernel(const uint8_t* __restrict__ cache,
                                     const int32_t* __restrict__ index,
                                     __nv_bfloat16* __restrict__ dst, int64_t num_rows,
                                     int64_t num_src_rows, int64_t dst_stride) {
  namespace f = fp8_ds_mla;
  constexpr int kUnits = f::kRowWidth / 8;    // 72
  constexpr int kLatentUnits = f::kLatentDim / 8;  // 64
  const int64_t total = num_rows * kUnits;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / kUnits;
    const int unit = int(i - row * kUnits);
    const int64_t from = index[row];
    uint4 value = make_uint4(0, 0, 0, 0);
    if (from >= 0 && from < num_src_rows) {
      const uint8_t* src = cache + from * f::kRowBytes;
      if (unit < kLatentUnits) {
        const float scale =
            reinterpret_cast<const float*>(src + f::kScaleOffset)[unit / (f::kTileSize / 8)];
        value = DequantizeFp8x8ToBf16(reinterpret_cast<const uint2*>(src)[unit], scale);
      } else {
        value = reinterpret_cast<const uint4*>(src + f::kRopeOffset)[unit - kLatentUnits];
      }
    }
    reinterpret_cast<uint4*>(dst + row * dst_stride)[unit] = value;
  }
}

}  // namespace dcp::cuda
