// Parameters of the row-movement kernels behind the KV cache and the chunked-prefill workspace.
// One gather serves both the paged gather of a rank's local rows (cp_gather_cache) and the
// reorganization of the all-gathered rows into per-request global order; one scatter serves the
// cache write of the new tokens a rank owns. Rows are `width` elements of `dtype`.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace dcp {

// dst[i] = src[index[i]] for i in [0, num_rows); index -1 (or outside [0, num_src_rows)) writes
// a zero row, so padding never reads memory it should not.
struct GatherRowsParams {
  const void* src = nullptr;      // [num_src_rows, width], row stride src_row_stride
  const int32_t* index = nullptr;  // [num_rows]
  void* dst = nullptr;            // [num_rows, width], row stride dst_row_stride
  DType dtype = DType::kF32;
  int64_t num_rows = 0, num_src_rows = 0;
  int width = 0;
  int64_t src_row_stride = 0, dst_row_stride = 0;
};

// dst[index[i]] = src[i] for i in [0, num_rows); index -1 (a token another rank owns) or
// outside [0, num_dst_rows) is skipped. Indices must be distinct.
struct ScatterRowsParams {
  const void* src = nullptr;       // [num_rows, width]
  const int32_t* index = nullptr;  // [num_rows] destination slots
  void* dst = nullptr;             // [num_dst_rows, width]
  DType dtype = DType::kF32;
  int64_t num_rows = 0, num_dst_rows = 0;
  int width = 0;
  int64_t src_row_stride = 0, dst_row_stride = 0;
};

}  // namespace dcp
