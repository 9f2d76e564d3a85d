// The argument checks of the row gather/scatter (workspace_params.h), shared by the CPU and
// CUDA implementations so both reject the same calls with the same message.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "core/status.h"
#include "workspace/workspace_params.h"

namespace dcp {

inline absl::Status CheckRowMove(const char* what, const void* src, const int32_t* index,
                                 const void* dst, int64_t num_rows, int width, int64_t src_stride,
                                 int64_t dst_stride) {
  DCP_CHECK_ARG(num_rows >= 0 && width >= 0, "%s: num_rows %d and width %d must be >= 0", what,
                num_rows, width);
  if (num_rows == 0 || width == 0) return absl::OkStatus();
  DCP_CHECK_ARG(src != nullptr && index != nullptr && dst != nullptr,
                "%s: src, index and dst must not be null", what);
  DCP_CHECK_ARG(src_stride >= width && dst_stride >= width,
                "%s: row strides (%d, %d) must be >= width %d", what, src_stride, dst_stride,
                width);
  return absl::OkStatus();
}

inline absl::Status CheckRows(const GatherRowsParams& p) {
  return CheckRowMove("GatherRows", p.src, p.index, p.dst, p.num_rows, p.width, p.src_row_stride,
                      p.dst_row_stride);
}

inline absl::Status CheckRows(const ScatterRowsParams& p) {
  return CheckRowMove("ScatterRows", p.src, p.index, p.dst, p.num_rows, p.width,
                      p.src_row_stride, p.dst_row_stride);
}

inline absl::Status CheckRows(const CopyRowsParams& p) {
  DCP_CHECK_ARG(p.num_copies >= 0 && p.num_copies <= CopyRowsParams::kMaxCopies,
                "CopyRows: %d copies, at most %d", p.num_copies, CopyRowsParams::kMaxCopies);
  for (int c = 0; c < p.num_copies; ++c) {
    const RowCopy& copy = p.copies[c];
    DCP_CHECK_ARG(copy.rows >= 0 && copy.width >= 0 && copy.src_row_repeat >= 1,
                  "CopyRows: copy %d has rows %d, width %d, src_row_repeat %d (need >= 0, >= 0, "
                  ">= 1)",
                  c, copy.rows, copy.width, copy.src_row_repeat);
    if (copy.rows == 0 || copy.width == 0) continue;
    DCP_CHECK_ARG(copy.src != nullptr && copy.dst != nullptr,
                  "CopyRows: copy %d: src and dst must not be null", c);
    DCP_CHECK_ARG(copy.src_row_stride >= copy.width && copy.dst_row_stride >= copy.width,
                  "CopyRows: copy %d: row strides (%d, %d) must be >= width %d", c,
                  copy.src_row_stride, copy.dst_row_stride, copy.width);
  }
  return absl::OkStatus();
}

}  // namespace dcp
