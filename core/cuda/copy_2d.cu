#include "core/cuda/copy_2d.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/cuda/cuda_status.h"
#include "core/cuda/programmatic_launch.h"
#include "core/status.h"

namespace dcp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;

// Thread mapping: the (row, unit) pairs flattened, consecutive threads on consecutive units of
// a row (coalesced); grid-stride.
template <typename Unit>
__global__ void __launch_bounds__(kThreads)
    Copy2DKernel(std::byte* dst, const std::byte* src, int64_t dst_pitch, int64_t src_pitch,
                 int64_t units_per_row, int64_t rows) {
  GridDependencyWait();
  const int64_t total = rows * units_per_row;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * kThreads) {
    // 32-bit division where it fits (a 64-bit one by a run-time value is a long sequence).
    const int64_t row =
        total <= UINT32_MAX ? int64_t(uint32_t(i) / uint32_t(units_per_row)) : i / units_per_row;
    const int64_t unit = i - row * units_per_row;
    reinterpret_cast<Unit*>(dst + row * dst_pitch)[unit] =
        reinterpret_cast<const Unit*>(src + row * src_pitch)[unit];
  }
}

template <typename Unit>
absl::Status Launch(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                    int64_t row_bytes, int64_t rows, cudaStream_t stream) {
  const int64_t units = row_bytes / int64_t(sizeof(Unit));
  const int64_t blocks = std::min((units * rows + kThreads - 1) / kThreads, kMaxBlocks);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute;
  SetProgrammaticLaunch(&config, &attribute);
  DCP_CUDA_CHECK(cudaLaunchKernelEx(&config, Copy2DKernel<Unit>, static_cast<std::byte*>(dst),
                                    static_cast<const std::byte*>(src), dst_pitch, src_pitch,
                                    units, rows));
  DCP_CUDA_LAUNCH_CHECK("Copy2DKernel");
  return absl::OkStatus();
}

}  // namespace

absl::Status Copy2D(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                    size_t row_bytes, size_t rows, cudaStream_t stream, const char* what) {
  if (rows == 0 || row_bytes == 0) return absl::OkStatus();
  DCP_CHECK_ARG(dst != nullptr && src != nullptr, "%s: null pointer", what);
  DCP_CHECK_ARG(dst_pitch >= row_bytes && src_pitch >= row_bytes,
                "%s: pitches (%d, %d) must be >= the row's %d bytes", what, dst_pitch, src_pitch,
                row_bytes);
  DCP_CHECK_ARG(rows <= size_t{INT64_MAX} / dst_pitch && rows <= size_t{INT64_MAX} / src_pitch,
                "%s: %d rows of pitch (%d, %d) overflow", what, rows, dst_pitch, src_pitch);
  auto fits = [&](size_t unit) {
    return reinterpret_cast<uintptr_t>(dst) % unit == 0 &&
           reinterpret_cast<uintptr_t>(src) % unit == 0 && dst_pitch % unit == 0 &&
           src_pitch % unit == 0 && row_bytes % unit == 0;
  };
  const auto d = static_cast<int64_t>(dst_pitch), s = static_cast<int64_t>(src_pitch);
  const auto b = static_cast<int64_t>(row_bytes), r = static_cast<int64_t>(rows);
  if (fits(16)) return Launch<uint4>(dst, d, src, s, b, r, stream);
  if (fits(4)) return Launch<uint32_t>(dst, d, src, s, b, r, stream);
  return Launch<unsigned char>(dst, d, src, s, b, r, stream);
}

}  // namespace dcp::cuda
