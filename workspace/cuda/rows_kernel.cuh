// Row movement kernels behind GatherRows / ScatterRows.
//
// Thread mapping: the (row, unit) pairs of the output are flattened, unit = one Vec (16, 8, 4 or
// 2 bytes) of a row; consecutive threads take consecutive units of a row, so a warp reads and
// writes contiguous, coalesced 512-byte runs with 16-byte units. Grid-stride over the pairs.
// The row index is re-read per unit (it stays in L1); a row whose index is out of range is
// written as zeros (gather) or skipped (scatter), so no read or write goes through it.
// Both may be launched as programmatic dependents (rows_cuda.cu): nothing is touched before
// griddepcontrol.wait; with `trigger_dependents` the next kernel may launch at once.
#pragma once

#include <cstdint>

#include "core/cuda/programmatic_launch.h"

namespace dcp::cuda {

template <typename Vec>
__global__ void GatherRowsKernel(const Vec* __restrict__ src, const int32_t* __restrict__ index,
                                 Vec* __restrict__ dst, int64_t num_rows, int64_t num_src_rows,
                                 int64_t units_per_row, int64_t src_stride, int64_t dst_stride,
                                 bool trigger_dependents) {
  if (trigger_dependents) TriggerDependents();
  GridDependencyWait();
  const int64_t total = num_rows * units_per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    // 32-bit division where it fits (a 64-bit one by a run-time value is a long sequence).
    const int64_t row =
        total <= UINT32_MAX ? int64_t(uint32_t(i) / uint32_t(units_per_row)) : i / units_per_row;
    const int64_t unit = i - row * units_per_row;
    const int64_t from = index[row];
    Vec value;
    if (from >= 0 && from < num_src_rows) {
      value = src[from * src_stride + unit];
    } else {
      value = Vec{};
    }
    dst[row * dst_stride + unit] = value;
  }
}

template <typename Vec>
__global__ void ScatterRowsKernel(const Vec* __restrict__ src, const int32_t* __restrict__ index,
                                  Vec* __restrict__ dst, int64_t num_rows, int64_t num_dst_rows,
                                  int64_t units_per_row, int64_t src_stride, int64_t dst_stride,
                                  bool trigger_dependents) {
  if (trigger_dependents) TriggerDependents();
  GridDependencyWait();
  const int64_t total = num_rows * units_per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    // 32-bit division where it fits (a 64-bit one by a run-time value is a long sequence).
    const int64_t row =
        total <= UINT32_MAX ? int64_t(uint32_t(i) / uint32_t(units_per_row)) : i / units_per_row;
    const int64_t unit = i - row * units_per_row;
    const int64_t to = index[row];
    if (to < 0 || to >= num_dst_rows) continue;
    dst[to * dst_stride + unit] = src[row * src_stride + unit];
  }
}

}  // namespace dcp::cuda
