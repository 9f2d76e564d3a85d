// Checks and dispatch of the dense MHA launcher; the kernel is in dense_mha_kernel.cuh.
#include <cstdint>

#include "attention/cuda/dense_mha.h"
#include "core/cuda/cuda_status.h"

namespace dcp::cuda {
namespace {

bool Aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

absl::Status Check(const DenseMhaParams& p) {
  DCP_CHECK_ARG(p.num_seqs >= 0 && p.num_heads >= 0 && p.max_seqlen_q >= 0 && p.max_seqlen_k >= 0,
                "DenseMha: negative size (seqs %d, heads %d, max_seqlen_q %d, max_seqlen_k %d)",
                p.num_seqs, p.num_heads, p.max_seqlen_q, p.max_seqlen_k);
  DCP_CHECK_ARG(p.dtype == DType::kBF16, "DenseMha (CUDA): dtype must be BF16, got %s",
                dtype_name(p.dtype));
  DCP_CHECK_ARG((p.qk_dim == 192 && p.v_dim == 128) || (p.qk_dim == 256 && p.v_dim == 256),
                "DenseMha (CUDA): qk_dim %d / v_dim %d not compiled; only 192 / 128 "
                "(DeepSeek-V3.2) and 256 / 256 (GLM-5)",
                p.qk_dim, p.v_dim);
  if (p.num_seqs == 0 || p.num_heads == 0 || p.max_seqlen_q == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.num_heads <= 65535, "DenseMha (CUDA): at most 65535 heads (got %d)", p.num_heads);
  DCP_CHECK_ARG(p.cu_seqlens_q != nullptr && p.cu_seqlens_k != nullptr,
                "DenseMha: cu_seqlens_q and cu_seqlens_k must not be null");
  DCP_CHECK_ARG(p.q != nullptr && p.k != nullptr && p.v != nullptr && p.out != nullptr,
                "DenseMha: q, k, v and out must not be null");
  DCP_CHECK_ARG(p.out_dtype == DType::kF32 ||
                    (p.out_dtype == DType::kBF16 && reinterpret_cast<uintptr_t>(p.out) % 4 == 0 &&
                     p.out_token_stride % 2 == 0 && p.out_head_stride % 2 == 0),
                "DenseMha (CUDA): out must be F32, or BF16 with 4-byte alignment and even "
                "strides (got %s, strides %d/%d)",
                dtype_name(p.out_dtype), p.out_token_stride, p.out_head_stride);
  DCP_CHECK_ARG(Aligned16(p.q) && Aligned16(p.k) && Aligned16(p.v),
                "DenseMha (CUDA): q, k and v must be 16-byte aligned");
  DCP_CHECK_ARG(p.q_token_stride % 8 == 0 && p.q_head_stride % 8 == 0 &&
                    p.k_token_stride % 8 == 0 && p.k_head_stride % 8 == 0 &&
                    p.v_token_stride % 8 == 0 && p.v_head_stride % 8 == 0,
                "DenseMha (CUDA): q/k/v strides must be multiples of 8 elements (q %d/%d, k "
                "%d/%d, v %d/%d)",
                p.q_token_stride, p.q_head_stride, p.k_token_stride, p.k_head_stride,
                p.v_token_stride, p.v_head_stride);
  return absl::OkStatus();
}

}  // namespace

absl::Status DenseMha(const DenseMhaParams& params, cudaStream_t stream) {
  DCP_RETURN_IF_ERROR(Check(params));
  if (params.num_seqs == 0 || params.num_heads == 0 || params.max_seqlen_q == 0) {
    return absl::OkStatus();
  }
  if (params.qk_dim == 192 && params.v_dim == 128) {
    return LaunchDenseMha<192, 128>(params, stream);
  }
  if (params.qk_dim == 256 && params.v_dim == 256) {
    return LaunchDenseMha<256, 256>(params, stream);
  }
  return DCP_ERROR(InvalidArgument, "DenseMha (CUDA): no kernel for qk_dim %d / v_dim %d",
                   params.qk_dim, params.v_dim);
}

}  // namespace dcp::cuda
