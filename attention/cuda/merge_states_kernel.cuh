// LSE merge kernels. Thread mapping: one warp per (token, head) row; the lanes read the row's
// LSEs first, compute the weights redundantly, then stride over the `dim` values (coalesced
// 128-byte runs). Every lane reads its LSEs before lane 0 writes the merged LSE (__syncwarp), so
// in-place merges (lse aliasing lse_a) are safe: no other warp touches that row.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "attention/cuda/lse_merge.cuh"
#include "attention/cuda/merge_states.h"

namespace dcp::cuda {

__global__ void MergeStatesKernel(const float* out_a, const float* lse_a, const float* out_b,
                                  const float* lse_b, float* out, float* lse, int64_t rows,
                                  int dim) {
  const int lane = threadIdx.x % 32;
  const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  if (row >= rows) return;
  const float a = SanitizeLse(lse_a[row]), b = SanitizeLse(lse_b[row]);
  const float m = fmaxf(a, b);
  float weight_a = 0.f, weight_b = 0.f, merged = -INFINITY;
  if (m != -INFINITY) {
    const float ea = expf(a - m), eb = expf(b - m);
    const float sum = ea + eb;
    merged = m + logf(sum);
    weight_a = ea / sum;
    weight_b = eb / sum;
  }
  __syncwarp();
  const int64_t base = row * dim;
  for (int d = lane; d < dim; d += 32) {
    // A zero weight must not pick up a NaN from an unused partial: select, don't multiply.
    const float va = weight_a > 0.f ? weight_a * out_a[base + d] : 0.f;
    const float vb = weight_b > 0.f ? weight_b * out_b[base + d] : 0.f;
    out[base + d] = va + vb;
  }
  if (lane == 0) lse[row] = merged;
}

__global__ void DcpCorrectKernel(float* out, const float* lse_all, float* lse_total, int world_size,
                                 int rank, int64_t rows, int dim) {
  const int lane = threadIdx.x % 32;
  const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  if (row >= rows) return;
  float m = -INFINITY;
  for (int r = 0; r < world_size; ++r) m = fmaxf(m, SanitizeLse(lse_all[r * rows + row]));
  float total = -INFINITY, weight = 0.f;
  if (m != -INFINITY) {
    float sum = 0.f;
    for (int r = 0; r < world_size; ++r) sum += expf(SanitizeLse(lse_all[r * rows + row]) - m);
    total = m + logf(sum);
    const float mine = SanitizeLse(lse_all[rank * rows + row]);
    // e^(mine - m) / sum, not e^(mine - total): far from zero, fp32 total loses log(sum).
    weight = mine == -INFINITY ? 0.f : expf(mine - m) / sum;
  }
  const int64_t base = row * dim;
  for (int d = lane; d < dim; d += 32) {
    out[base + d] = weight > 0.f ? weight * out[base + d] : 0.f;
  }
  if (lse_total != nullptr && lane == 0) lse_total[row] = total;
}

__global__ void DcpCombineKernel(const float* outs, const float* lses, float* out, float* lse,
                                 int world_size, int64_t rows, int dim) {
  const int lane = threadIdx.x % 32;
  const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  if (row >= rows) return;
  float m = -INFINITY;
  for (int r = 0; r < world_size; ++r) m = fmaxf(m, SanitizeLse(lses[r * rows + row]));
  float total = -INFINITY, inverse = 0.f;
  if (m != -INFINITY) {
    float sum = 0.f;
    for (int r = 0; r < world_size; ++r) sum += expf(SanitizeLse(lses[r * rows + row]) - m);
    total = m + logf(sum);
    inverse = 1.f / sum;
  }
  const int64_t base = row * dim;
  for (int d = lane; d < dim; d += 32) {
    float value = 0.f;
    if (total != -INFINITY) {
      for (int r = 0; r < world_size; ++r) {
        const float lr = SanitizeLse(lses[r * rows + row]);
        // As in DcpCorrectKernel: relative to m, not to total.
        if (lr != -INFINITY) value += expf(lr - m) * inverse * outs[(r * rows + row) * dim + d];
      }
    }
    out[base + d] = value;
  }
  if (lse != nullptr && lane == 0) lse[row] = total;
}

// Split-KV merge of the sparse MQA kernels: `splits` partials of the same (token, head) grid,
// [splits, T, H, dim] contiguous and LSEs [splits, T, H], into a strided output. One thread per
// (row, 4 values): every thread reads its row's LSEs (L1 serves the repeats) and the float4 of
// every split, kMergeUnroll of each in flight at once. The first version (one warp per row, a
// lane walking the splits one dependent load at a time) cost about 1 us per split on the H200,
// all latency (docs/sparse_mqa_sm90.md). A partial with lse -inf (no key in its range) is
// loaded with the others but selected out (weight 0), never multiplied: its values may be
// anything, NaN included (every split's partial must be readable memory).
// On sm_90 the kernel may be launched as a programmatic dependent of the attention kernel
// (MergeSplits): griddepcontrol.wait holds it until that grid has finished and its writes are
// visible, while its launch and scheduling overlap the attention kernel's tail. With
// `trigger_dependents` it lets its own programmatic dependent (the output projection's small-M
// GEMM) launch at once, so that kernel's weight stream (loaded and prefetched before its own
// wait) overlaps the attention kernel and this one; the dependent's griddepcontrol.wait still
// waits for this whole grid to finish, so the trigger's place never changes what it reads.
constexpr int kMergeSplitsThreads = 256;
constexpr int kMergeUnroll = kLseMergeGroup;

__global__ void __launch_bounds__(kMergeSplitsThreads)
    MergeSplitsKernel(const float* __restrict__ parts, const float* __restrict__ part_lse,
                      int splits, int num_tokens, int num_heads, int dim, void* out,
                      int64_t out_token_stride, int64_t out_head_stride, float* lse,
                      int64_t lse_token_stride, bool vector_store, bool out_bf16,
                      bool trigger_dependents) {
  if (trigger_dependents) TriggerDependents();
  GridDependencyWait();
  const int chunks = dim >= 4 ? dim / 4 : 1;  // dim 0: one thread per row writes the LSE
  const int64_t rows = int64_t(num_tokens) * num_heads;
  const int64_t index = blockIdx.x * int64_t(kMergeSplitsThreads) + threadIdx.x;
  if (index >= rows * chunks) return;
  const int64_t row = index / chunks;
  const int d = static_cast<int>(index % chunks) * 4;
  const int64_t token = row / num_heads, head = row % num_heads;
  // One pass (an online LSE merge over groups of kMergeUnroll splits): a group's LSEs and
  // values are loaded together, so a group costs one memory round trip, not two.
  LseMerge4 merge;
  for (int s0 = 0; s0 < splits; s0 += kMergeUnroll) {
    float l[kMergeUnroll];
    float4 v[kMergeUnroll];
#pragma unroll
    for (int k = 0; k < kMergeUnroll; ++k) {
      const bool in = s0 + k < splits;
      l[k] = in ? SanitizeLse(part_lse[(s0 + k) * rows + row]) : -INFINITY;
      v[k] = in && d < dim
                 ? *reinterpret_cast<const float4*>(parts + ((s0 + k) * rows + row) * dim + d)
                 : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    merge.AddGroup(l, v);
  }
  // dim 0: no values.
  if (d < dim) {
    StoreMerged4(out, token * out_token_stride + head * out_head_stride + d, out_bf16,
                 vector_store, merge.Values());
  }
  if (d == 0) lse[token * lse_token_stride + head] = merge.Lse();
}

}  // namespace dcp::cuda
