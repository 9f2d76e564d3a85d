#include "workspace/cpu/rows_cpu.h"

#include <cstring>

#include "core/status.h"
#include "workspace/rows_check.h"

namespace dcp::cpu {

absl::Status GatherRows(const GatherRowsParams& p) {
  DCP_RETURN_IF_ERROR(CheckRows(p));
  const size_t element = dtype_size(p.dtype);
  const size_t row_bytes = size_t(p.width) * element;
  const auto* src = static_cast<const std::byte*>(p.src);
  auto* dst = static_cast<std::byte*>(p.dst);
  for (int64_t i = 0; i < p.num_rows; ++i) {
    std::byte* target = dst + i * p.dst_row_stride * element;
    const int64_t row = p.index[i];
    if (row < 0 || row >= p.num_src_rows) {
      std::memset(target, 0, row_bytes);
    } else {
      std::memcpy(target, src + row * p.src_row_stride * element, row_bytes);
    }
  }
  return absl::OkStatus();
}

absl::Status ScatterRows(const ScatterRowsParams& p) {
  DCP_RETURN_IF_ERROR(CheckRows(p));
  const size_t element = dtype_size(p.dtype);
  const size_t row_bytes = size_t(p.width) * element;
  const auto* src = static_cast<const std::byte*>(p.src);
  auto* dst = static_cast<std::byte*>(p.dst);
  for (int64_t i = 0; i < p.num_rows; ++i) {
    const int64_t row = p.index[i];
    if (row < 0 || row >= p.num_dst_rows) continue;
    std::memcpy(dst + row * p.dst_row_stride * element, src + i * p.src_row_stride * element,
                row_bytes);
  }
  return absl::OkStatus();
}

absl::Status CopyRows(const CopyRowsParams& p) {
  DCP_RETURN_IF_ERROR(CheckRows(p));
  const size_t element = dtype_size(p.dtype);
  for (int c = 0; c < p.num_copies; ++c) {
    const RowCopy& copy = p.copies[c];
    const auto* src = static_cast<const std::byte*>(copy.src);
    auto* dst = static_cast<std::byte*>(copy.dst);
    const size_t row_bytes = size_t(copy.width) * element;
    for (int64_t r = 0; r < copy.rows && row_bytes > 0; ++r) {
      std::memcpy(dst + r * copy.dst_row_stride * element,
                  src + (r / copy.src_row_repeat) * copy.src_row_stride * element, row_bytes);
    }
  }
  return absl::OkStatus();
}

}  // namespace dcp::cpu
