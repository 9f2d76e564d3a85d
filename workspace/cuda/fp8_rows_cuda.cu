#include <algorithm>
#include <cstdint>

#include "core/cuda/cuda_status.h"
#include "workspace/cuda/fp8_rows_cuda.h"
#include "workspace/cuda/fp8_rows_kernel.cuh"
#include "workspace/fp8_rows_check.h"

namespace dcp::cuda {
namespace {

bool Aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

int GridFor(int64_t threads) {
  return static_cast<int>(std::clamp<int64_t>((threads + 255) / 256, 1, 132 * 32));
}

}  // namespace

absl::Status WriteFp8DsMlaRows(const Fp8DsMlaWriteParams& p, cudaStream_t stream) {
  DCP_RETURN_IF_ERROR(CheckFp8DsMlaWrite(p));
  DCP_CHECK_ARG(p.dtype == DType::kBF16, "Fp8DsMlaWrite (CUDA): input dtype must be BF16, got %s",
                dtype_name(p.dtype));
  if (p.num_rows == 0 || p.num_slots == 0) return absl::OkStatus();
  DCP_CHECK_ARG(Aligned16(p.kv_c) && Aligned16(p.k_pe) && Aligned16(p.cache) &&
                    p.kv_c_row_stride % 8 == 0 && p.k_pe_row_stride % 8 == 0,
                "Fp8DsMlaWrite (CUDA): kv_c, k_pe and cache must be 16-byte aligned and the row "
                "strides (%d, %d) multiples of 8",
                p.kv_c_row_stride, p.k_pe_row_stride);
  WriteFp8DsMlaKernel<<<GridFor(p.num_rows * 32), 256, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(p.kv_c), static_cast<const __nv_bfloat16*>(p.k_pe),
      p.slot_mapping, p.cache, p.num_rows, p.num_slots, p.kv_c_row_stride, p.k_pe_row_stride);
  DCP_CUDA_LAUNCH_CHECK("WriteFp8DsMlaKernel");
  return absl::OkStatus();
}

absl::Status GatherFp8DsMlaRows(const Fp8DsMlaGatherParams& p, cudaStream_t stream) {
  DCP_RETURN_IF_ERROR(CheckFp8DsMlaGather(p));
  DCP_CHECK_ARG(p.dst_dtype == DType::kBF16,
                "Fp8DsMlaGather (CUDA): output dtype must be BF16, got %s",
                dtype_name(p.dst_dtype));
  if (p.num_rows == 0) return absl::OkStatus();
  DCP_CHECK_ARG(Aligned16(p.cache) && Aligned16(p.dst) && p.dst_row_stride % 8 == 0,
                "Fp8DsMlaGather (CUDA): cache and dst must be 16-byte aligned and dst_row_stride "
                "(%d) a multiple of 8",
                p.dst_row_stride);
  GatherFp8DsMlaKernel<<<GridFor(p.num_rows * (fp8_ds_mla::kRowWidth / 8)), 256, 0, stream>>>(
      p.cache, p.index, static_cast<__nv_bfloat16*>(p.dst), p.num_rows, p.num_src_rows,
      p.dst_row_stride);
  DCP_CUDA_LAUNCH_CHECK("GatherFp8DsMlaKernel");
  return absl::OkStatus();
}

}  // namespace dcp::cuda
