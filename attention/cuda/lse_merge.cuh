// The LSE merge's device arithmetic (DESIGN.md section 3), one copy for every CUDA kernel that
// merges partial outputs: merge_states_kernel.cuh (MergeSplits and the DCP combines), the
// cluster merge of the sm_90a sparse MQA kernel and the small-M GEMM's merged A. The cluster
// merge promises the same bits as MergeSplitsKernel on the same partials; both run
// LseMerge4::AddGroup, so that holds by construction.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

namespace dcp::cuda {

// Splits whose LSEs and values a merging thread loads at once (one memory round trip a group).
constexpr int kLseMergeGroup = 16;

// NaN and +inf are treated as -inf: never propagated.
__device__ __forceinline__ float SanitizeLse(float lse) {
  return (isnan(lse) || lse == INFINITY) ? -INFINITY : lse;
}

// The natural-log LSE of a merged row from its running maximum and sum of weights; -inf for a
// row without keys.
__device__ __forceinline__ float MergedLse(float max, float sum) {
  return sum > 0.f ? max + logf(sum) : -INFINITY;
}

// An online LSE merge of 4 values of one row over groups of split partials. A group's LSEs
// (sanitized) and values are handed in together, so a caller can load a whole group in one
// memory round trip. A split with LSE -inf (no key in its range) gets weight 0 and is never
// multiplied: its values may be anything, NaN included.
struct LseMerge4 {
  float max = -INFINITY;
  float sum = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);

  template <int kGroup>
  __device__ __forceinline__ void AddGroup(const float (&lse)[kGroup],
                                           const float4 (&value)[kGroup]) {
    float group_max = -INFINITY;
#pragma unroll
    for (int k = 0; k < kGroup; ++k) group_max = fmaxf(group_max, lse[k]);
    if (group_max == -INFINITY) return;  // no key in this group
    const float new_max = fmaxf(max, group_max);
    const float rescale = max == -INFINITY ? 0.f : expf(max - new_max);
    max = new_max;
    sum *= rescale;
    acc.x *= rescale;
    acc.y *= rescale;
    acc.z *= rescale;
    acc.w *= rescale;
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      const float weight = lse[k] == -INFINITY ? 0.f : expf(lse[k] - max);
      sum += weight;
      if (weight > 0.f) {
        acc.x += weight * value[k].x;
        acc.y += weight * value[k].y;
        acc.z += weight * value[k].z;
        acc.w += weight * value[k].w;
      }
    }
  }

  // The merged values (zeros for a row without keys) and LSE.
  __device__ __forceinline__ float4 Values() const {
    const float inverse = sum > 0.f ? 1.f / sum : 0.f;
    return make_float4(acc.x * inverse, acc.y * inverse, acc.z * inverse, acc.w * inverse);
  }
  __device__ __forceinline__ float Lse() const { return MergedLse(max, sum); }
};

// Stores 4 merged values at element `at` of `out`: fp32, or bf16 (round to nearest even) when
// `bf16`. `vector`: one 16-byte (fp32) or 8-byte (bf16) store, which the caller has checked is
// aligned; else four scalar stores.
__device__ __forceinline__ void StoreMerged4(void* out, int64_t at, bool bf16, bool vector,
                                             float4 r) {
  if (bf16) {
    __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(out) + at;
    const __nv_bfloat162 low = __floats2bfloat162_rn(r.x, r.y);
    const __nv_bfloat162 high = __floats2bfloat162_rn(r.z, r.w);
    if (vector) {
      uint2 packed;
      packed.x = *reinterpret_cast<const uint32_t*>(&low);
      packed.y = *reinterpret_cast<const uint32_t*>(&high);
      *reinterpret_cast<uint2*>(dst) = packed;
    } else {
      dst[0] = low.x;
      dst[1] = low.y;
      dst[2] = high.x;
      dst[3] = high.y;
    }
  } else {
    float* dst = static_cast<float*>(out) + at;
    if (vector) {
      *reinterpret_cast<float4*>(dst) = r;
    } else {
      dst[0] = r.x;
      dst[1] = r.y;
      dst[2] = r.z;
      dst[3] = r.w;
    }
  }
}

}  // namespace dcp::cuda
