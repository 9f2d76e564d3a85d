#include "workspace/cpu/rows_cpu.h"

#include <cstring>

#include "runtime/status.h"

namespace dcp::cpu {
namespace {

absl::Status CheckRows(const char* what, const void* src, const int32_t* index, const void* dst,
                       int64_t num_rows, int width, int64_t src_stride, int64_t dst_stride) {
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

}  // namespace

absl::Status GatherRows(const GatherRowsParams& p) {
  DCP_RETURN_IF_ERROR(CheckRows("GatherRows", p.src, p.index, p.dst, p.num_rows, p.width,
                                p.src_row_stride, p.dst_row_stride));
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
  DCP_RETURN_IF_ERROR(CheckRows("ScatterRows", p.src, p.index, p.dst, p.num_rows, p.width,
                                p.src_row_stride, p.dst_row_stride));
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

}  // namespace dcp::cpu
