#include <algorithm>
#include <cstdint>

#include "core/cuda/cuda_status.h"
#include "workspace/cuda/rows_cuda.h"
#include "workspace/cuda/rows_kernel.cuh"
#include "workspace/rows_check.h"

namespace dcp::cuda {
namespace {

// The widest unit (16, 8, 4 or 2 bytes; 1 for odd sizes) dividing every byte quantity given.
int UnitBytes(std::initializer_list<uint64_t> quantities) {
  for (int unit : {16, 8, 4, 2}) {
    bool fits = true;
    for (uint64_t q : quantities) fits = fits && (q % unit == 0);
    if (fits) return unit;
  }
  return 1;
}

int GridFor(int64_t work) {
  return static_cast<int>(std::clamp<int64_t>((work + 255) / 256, 1, 132 * 32));
}

template <typename Vec, bool kGather>
absl::Status Launch(const void* src, const int32_t* index, void* dst, int64_t num_rows,
                    int64_t bound_rows, int64_t row_bytes, int64_t src_stride_bytes,
                    int64_t dst_stride_bytes, cudaStream_t stream) {
  const int64_t units = row_bytes / int64_t(sizeof(Vec));
  const int64_t src_stride = src_stride_bytes / int64_t(sizeof(Vec));
  const int64_t dst_stride = dst_stride_bytes / int64_t(sizeof(Vec));
  const int grid = GridFor(num_rows * units);
  if constexpr (kGather) {
    GatherRowsKernel<Vec><<<grid, 256, 0, stream>>>(static_cast<const Vec*>(src), index,
                                                    static_cast<Vec*>(dst), num_rows, bound_rows,
                                                    units, src_stride, dst_stride);
    DCP_CUDA_LAUNCH_CHECK("GatherRowsKernel");
  } else {
    ScatterRowsKernel<Vec><<<grid, 256, 0, stream>>>(static_cast<const Vec*>(src), index,
                                                     static_cast<Vec*>(dst), num_rows, bound_rows,
                                                     units, src_stride, dst_stride);
    DCP_CUDA_LAUNCH_CHECK("ScatterRowsKernel");
  }
  return absl::OkStatus();
}

template <bool kGather>
absl::Status Dispatch(const void* src, const int32_t* index, void* dst, DType dtype,
                      int64_t num_rows, int64_t bound_rows, int width, int64_t src_row_stride,
                      int64_t dst_row_stride, cudaStream_t stream) {
  const int64_t element = int64_t(dtype_size(dtype));
  const int64_t row_bytes = width * element;
  const int64_t src_stride = src_row_stride * element;
  const int64_t dst_stride = dst_row_stride * element;
  const int unit = UnitBytes({uint64_t(row_bytes), uint64_t(src_stride), uint64_t(dst_stride),
                              reinterpret_cast<uint64_t>(src), reinterpret_cast<uint64_t>(dst)});
  switch (unit) {
    case 16:
      return Launch<uint4, kGather>(src, index, dst, num_rows, bound_rows, row_bytes, src_stride,
                                    dst_stride, stream);
    case 8:
      return Launch<uint2, kGather>(src, index, dst, num_rows, bound_rows, row_bytes, src_stride,
                                    dst_stride, stream);
    case 4:
      return Launch<uint32_t, kGather>(src, index, dst, num_rows, bound_rows, row_bytes,
                                       src_stride, dst_stride, stream);
    case 2:
      return Launch<uint16_t, kGather>(src, index, dst, num_rows, bound_rows, row_bytes,
                                       src_stride, dst_stride, stream);
    case 1:
      return Launch<uint8_t, kGather>(src, index, dst, num_rows, bound_rows, row_bytes,
                                      src_stride, dst_stride, stream);
  }
  return DCP_ERROR(Internal, "rows: no unit of %d bytes", unit);
}

}  // namespace

absl::Status GatherRows(const GatherRowsParams& p, cudaStream_t stream) {
  DCP_RETURN_IF_ERROR(CheckRows(p));
  if (p.num_rows == 0 || p.width == 0) return absl::OkStatus();
  return Dispatch<true>(p.src, p.index, p.dst, p.dtype, p.num_rows, p.num_src_rows, p.width,
                        p.src_row_stride, p.dst_row_stride, stream);
}

absl::Status ScatterRows(const ScatterRowsParams& p, cudaStream_t stream) {
  DCP_RETURN_IF_ERROR(CheckRows(p));
  if (p.num_rows == 0 || p.width == 0) return absl::OkStatus();
  return Dispatch<false>(p.src, p.index, p.dst, p.dtype, p.num_rows, p.num_dst_rows, p.width,
                         p.src_row_stride, p.dst_row_stride, stream);
}

}  // namespace dcp::cuda
