#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cuda/cuda_status.h"
#include "core/cuda/programmatic_launch.h"
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
  // sm_90+: a programmatic dependent launch (the kernels wait with griddepcontrol.wait before
  // they touch memory), letting their own dependent launch at once: a decode layer's cache
  // write is followed by the top-k -> slots step and the absorb GEMM, whose weight stream then
  // starts under this launch.
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(256);
  config.stream = stream;
  cudaLaunchAttribute attribute;
  SetProgrammaticLaunch(&config, &attribute);
  const bool trigger = EarlyTriggerEnabled();
  if constexpr (kGather) {
    DCP_CUDA_CHECK(cudaLaunchKernelEx(&config, GatherRowsKernel<Vec>, static_cast<const Vec*>(src),
                                      index, static_cast<Vec*>(dst), num_rows, bound_rows, units,
                                      src_stride, dst_stride, trigger));
    DCP_CUDA_LAUNCH_CHECK("GatherRowsKernel");
  } else {
    DCP_CUDA_CHECK(cudaLaunchKernelEx(&config, ScatterRowsKernel<Vec>, static_cast<const Vec*>(src),
                                      index, static_cast<Vec*>(dst), num_rows, bound_rows, units,
                                      src_stride, dst_stride, trigger));
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
      return Launch<uint32_t, kGather>(src, index, dst, num_rows, bound_rows, row_bytes, src_stride,
                                       dst_stride, stream);
    case 2:
      return Launch<uint16_t, kGather>(src, index, dst, num_rows, bound_rows, row_bytes, src_stride,
                                       dst_stride, stream);
    case 1:
      return Launch<uint8_t, kGather>(src, index, dst, num_rows, bound_rows, row_bytes, src_stride,
                                      dst_stride, stream);
  }
  return DCP_ERROR(Internal, "rows: no unit of %d bytes", unit);
}

// CopyRows: the copies' units laid end to end (copy c owns [begin[c], begin[c + 1])); a
// grid-stride loop over them. Index is uint32_t when every quantity fits (no 64-bit division
// per unit), else int64_t.
template <typename Index>
struct RowCopyArgs {
  const void* src[CopyRowsParams::kMaxCopies];
  void* dst[CopyRowsParams::kMaxCopies];
  Index begin[CopyRowsParams::kMaxCopies + 1];
  Index units[CopyRowsParams::kMaxCopies];  // per row
  Index src_stride[CopyRowsParams::kMaxCopies], dst_stride[CopyRowsParams::kMaxCopies];
  Index repeat[CopyRowsParams::kMaxCopies];
  int num_copies;
};

template <typename Vec, typename Index>
__global__ void CopyRowsKernel(const RowCopyArgs<Index> a) {
  const Index total = a.begin[a.num_copies];
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += Index(gridDim.x) * blockDim.x) {
    int c = 0;
    while (c + 1 < a.num_copies && i >= a.begin[c + 1]) ++c;
    const Index j = i - a.begin[c];
    const Index row = j / a.units[c], unit = j - row * a.units[c];
    const Vec* src = static_cast<const Vec*>(a.src[c]);
    Vec* dst = static_cast<Vec*>(a.dst[c]);
    dst[row * a.dst_stride[c] + unit] = src[(row / a.repeat[c]) * a.src_stride[c] + unit];
  }
}

template <typename Vec, typename Index>
absl::Status LaunchCopyRows(const CopyRowsParams& p, int unit, cudaStream_t stream) {
  RowCopyArgs<Index> a{};
  const int64_t element = int64_t(dtype_size(p.dtype));
  int n = 0;
  int64_t total = 0;
  for (int c = 0; c < p.num_copies; ++c) {
    const RowCopy& copy = p.copies[c];
    if (copy.rows == 0 || copy.width == 0) continue;
    a.src[n] = copy.src;
    a.dst[n] = copy.dst;
    a.begin[n] = Index(total);
    a.units[n] = Index(copy.width * element / unit);
    a.src_stride[n] = Index(copy.src_row_stride * element / unit);
    a.dst_stride[n] = Index(copy.dst_row_stride * element / unit);
    a.repeat[n] = Index(copy.src_row_repeat);
    total += copy.rows * int64_t(a.units[n]);
    ++n;
  }
  a.num_copies = n;
  a.begin[n] = Index(total);
  if (total == 0) return absl::OkStatus();
  CopyRowsKernel<Vec, Index><<<GridFor(total), 256, 0, stream>>>(a);
  DCP_CUDA_LAUNCH_CHECK("CopyRowsKernel");
  return absl::OkStatus();
}

template <typename Index>
absl::Status DispatchCopyRows(const CopyRowsParams& p, int unit, cudaStream_t stream) {
  switch (unit) {
    case 16:
      return LaunchCopyRows<uint4, Index>(p, unit, stream);
    case 8:
      return LaunchCopyRows<uint2, Index>(p, unit, stream);
    case 4:
      return LaunchCopyRows<uint32_t, Index>(p, unit, stream);
    case 2:
      return LaunchCopyRows<uint16_t, Index>(p, unit, stream);
    case 1:
      return LaunchCopyRows<uint8_t, Index>(p, unit, stream);
  }
  return DCP_ERROR(Internal, "CopyRows: no unit of %d bytes", unit);
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

absl::Status CopyRows(const CopyRowsParams& p, cudaStream_t stream) {
  DCP_RETURN_IF_ERROR(CheckRows(p));
  const uint64_t element = dtype_size(p.dtype);
  std::vector<uint64_t> quantities;
  int64_t units = 0, largest = 0;  // in bytes: the total, and the largest offset touched
  for (int c = 0; c < p.num_copies; ++c) {
    const RowCopy& copy = p.copies[c];
    if (copy.rows == 0 || copy.width == 0) continue;
    quantities.insert(
        quantities.end(),
        {copy.width * element, copy.src_row_stride * element, copy.dst_row_stride * element,
         reinterpret_cast<uint64_t>(copy.src), reinterpret_cast<uint64_t>(copy.dst)});
    units += copy.rows * copy.width * int64_t(element);
    largest = std::max<int64_t>(
        largest, copy.rows * std::max(copy.src_row_stride, copy.dst_row_stride) * int64_t(element));
  }
  if (quantities.empty()) return absl::OkStatus();
  int unit = 16;
  while (unit > 1 && !std::all_of(quantities.begin(), quantities.end(),
                                  [unit](uint64_t q) { return q % unit == 0; })) {
    unit /= 2;
  }
  // 32-bit indices when every unit index and offset fits (with room for the grid stride).
  if (std::max(units, largest) / unit < (int64_t{1} << 31)) {
    return DispatchCopyRows<uint32_t>(p, unit, stream);
  }
  return DispatchCopyRows<int64_t>(p, unit, stream);
}

}  // namespace dcp::cuda
