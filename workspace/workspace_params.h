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

// A few strided row copies in one call (the dense route's query assembly and k_pe broadcast in
// one launch): for every copy and every r in [0, rows), dst[r * dst_row_stride, + width) =
// src[(r / src_row_repeat) * src_row_stride, + width). src_row_repeat > 1 broadcasts each source
// row to that many consecutive destination rows. Strides and widths are in elements of dtype;
// the copies' destinations must not overlap each other or their sources.
struct RowCopy {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t rows = 0;
  int width = 0;
  int64_t src_row_stride = 0, dst_row_stride = 0;
  int src_row_repeat = 1;
};

struct CopyRowsParams {
  static constexpr int kMaxCopies = 4;
  RowCopy copies[kMaxCopies];
  int num_copies = 0;
  DType dtype = DType::kBF16;
};

}  // namespace dcp
