// LSE merge kernels. Thread mapping: one warp per (token, head) row; the lanes read the row's
// LSEs first, compute the weights redundantly, then stride over the `dim` values (coalesced
// 128-byte runs). Every lane reads its LSEs before lane 0 writes the merged LSE (__syncwarp), so
// in-place merges (lse aliasing lse_a) are safe: no other warp touches that row.
#pragma once

#include <cmath>
#include <cstdint>

namespace dcp::cuda {

// NaN and +inf are treated as -inf (DESIGN.md section 3): never propagated.
__device__ __forceinline__ float SanitizeLse(float lse) {
  return (isnan(lse) || lse == INFINITY) ? -INFINITY : lse;
}

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

__global__ void DcpCorrectKernel(float* out, const float* lse_all, float* lse_total,
                                 int world_size, int rank, int64_t rows, int dim) {
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
    weight = mine == -INFINITY ? 0.f : expf(mine - total);
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
  float total = -INFINITY;
  if (m != -INFINITY) {
    float sum = 0.f;
    for (int r = 0; r < world_size; ++r) sum += expf(SanitizeLse(lses[r * rows + row]) - m);
    total = m + logf(sum);
  }
  const int64_t base = row * dim;
  for (int d = lane; d < dim; d += 32) {
    float value = 0.f;
    if (total != -INFINITY) {
      for (int r = 0; r < world_size; ++r) {
        const float lr = SanitizeLse(lses[r * rows + row]);
        if (lr != -INFINITY) value += expf(lr - total) * outs[(r * rows + row) * dim + d];
      }
    }
    out[base + d] = value;
  }
  if (lse != nullptr && lane == 0) lse[row] = total;
}

}  // namespace dcp::cuda
