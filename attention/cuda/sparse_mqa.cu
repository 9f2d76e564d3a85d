// Checks and dispatch of the sparse MQA launcher; the kernel is in sparse_mqa_kernel.cuh.
#include <cstdint>

#include "attention/cuda/sparse_mqa.h"
#include "runtime/cuda/cuda_status.h"

namespace dcp::cuda {
namespace {

bool Aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

absl::Status Check(const SparseMqaParams& p) {
  DCP_CHECK_ARG(p.num_tokens >= 0 && p.num_heads >= 0 && p.topk >= 0 && p.num_slots >= 0,
                "SparseMqa: negative size (tokens %d, heads %d, topk %d, slots %d)", p.num_tokens,
                p.num_heads, p.topk, p.num_slots);
  DCP_CHECK_ARG(p.dtype == DType::kBF16, "SparseMqa (CUDA): dtype must be BF16, got %s",
                dtype_name(p.dtype));
  DCP_RETURN_IF_ERROR(CheckKvCacheDTypeSupported(p.kv_format, "SparseMqa (CUDA)"));
  DCP_CHECK_ARG(p.head_dim == 576 && p.v_dim == 512,
                "SparseMqa (CUDA): head_dim %d / v_dim %d not compiled; only 576 / 512", p.head_dim,
                p.v_dim);
  if (p.num_tokens == 0 || p.num_heads == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.q != nullptr && p.out != nullptr && p.lse != nullptr,
                "SparseMqa: q, out and lse must not be null");
  DCP_CHECK_ARG(p.num_heads <= 65535 * 64, "SparseMqa: %d heads is too many", p.num_heads);
  if (p.topk > 0) {
    DCP_CHECK_ARG(p.indices != nullptr, "SparseMqa: indices must not be null when topk > 0");
    DCP_CHECK_ARG(p.num_slots == 0 || p.kv_cache != nullptr,
                  "SparseMqa: kv_cache must not be null");
    DCP_CHECK_ARG(p.indices_token_stride >= p.topk,
                  "SparseMqa: indices_token_stride %d < topk %d", p.indices_token_stride, p.topk);
  }
  DCP_CHECK_ARG(Aligned16(p.q) && p.q_token_stride % 8 == 0 && p.q_head_stride % 8 == 0,
                "SparseMqa (CUDA): q must be 16-byte aligned with strides that are multiples of 8 "
                "(token %d, head %d)",
                p.q_token_stride, p.q_head_stride);
  DCP_CHECK_ARG(p.q_head_stride >= p.head_dim || p.num_heads == 1,
                "SparseMqa: q_head_stride %d < head_dim %d", p.q_head_stride, p.head_dim);
  if (p.kv_format == KvCacheDType::kFp8DsMla) {
    DCP_CHECK_ARG(p.kv_row_stride == fp8_ds_mla::kRowBytes,
                  "SparseMqa (CUDA): fp8_ds_mla rows are %d bytes, got a kv_row_stride of %d bytes",
                  fp8_ds_mla::kRowBytes, p.kv_row_stride);
    DCP_CHECK_ARG(Aligned16(p.kv_cache), "SparseMqa (CUDA): kv_cache must be 16-byte aligned");
  } else {
    DCP_CHECK_ARG(Aligned16(p.kv_cache) && p.kv_row_stride % 8 == 0 &&
                      (p.kv_row_stride >= p.head_dim || p.num_slots <= 1),
                  "SparseMqa (CUDA): kv_cache must be 16-byte aligned, row stride %d a multiple of "
                  "8 and >= head_dim",
                  p.kv_row_stride);
  }
  DCP_CHECK_ARG(p.out_head_stride >= p.v_dim || p.num_heads == 1,
                "SparseMqa: out_head_stride %d < v_dim %d", p.out_head_stride, p.v_dim);
  DCP_CHECK_ARG(p.lse_token_stride >= p.num_heads || p.num_tokens == 1,
                "SparseMqa: lse_token_stride %d < num_heads %d", p.lse_token_stride, p.num_heads);
  return absl::OkStatus();
}

}  // namespace

absl::Status SparseMqa(const SparseMqaParams& params, cudaStream_t stream) {
  DCP_RETURN_IF_ERROR(Check(params));
  if (params.num_tokens == 0 || params.num_heads == 0) return absl::OkStatus();
  if (params.head_dim == 576 && params.v_dim == 512) {
    if (params.kv_format == KvCacheDType::kFp8DsMla) {
      return LaunchSparseMqa<576, 512, KvCacheDType::kFp8DsMla>(params, stream);
    }
    return LaunchSparseMqa<576, 512>(params, stream);
  }
  return DCP_ERROR(InvalidArgument, "SparseMqa (CUDA): no kernel for head_dim %d / v_dim %d",
                   params.head_dim, params.v_dim);
}

}  // namespace dcp::cuda
