// Kernels of sdpa_glue.h. SdpaIndex: one thread per sequence slot. SdpaFinish: one warp per
// (token, head) row; the token's sequence comes from a binary search over cu_seqlens_q, each
// lane converts v_dim / 32 values (v_dim is a multiple of 8: lanes take 4-wide chunks).
#include "attention/cuda/cudnn/sdpa_glue.h"

#include "core/cuda/cuda_status.h"

namespace dcp::cuda {
namespace {

__global__ void SdpaIndexKernel(const SdpaIndexParams p) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b > p.padded_seqs) return;
  const int clamped = min(b, p.num_seqs);
  const int64_t q0 = p.cu_seqlens_q[0], k0 = p.cu_seqlens_k[0];
  const int64_t q = p.cu_seqlens_q[clamped] - q0, k = p.cu_seqlens_k[clamped] - k0;
  // Offsets count from the tensors' base pointers, which the launcher moves to token
  // cu_seqlens[0].
  p.q_offsets[b] = static_cast<int32_t>(q * p.q_token_stride);
  p.k_offsets[b] = static_cast<int32_t>(k * p.k_token_stride);
  p.v_offsets[b] = static_cast<int32_t>(k * p.v_token_stride);
  p.o_offsets[b] = static_cast<int32_t>(q * p.o_token_stride);
  p.stats_offsets[b] = static_cast<int32_t>(q * p.stats_token_stride);
  if (b < p.padded_seqs) {
    const bool real = b < p.num_seqs;
    p.seq_len_q[b] = real ? p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b] : 0;
    p.seq_len_k[b] = real ? p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b] : 0;
  }
}

__global__ void SdpaFinishKernel(const SdpaFinishParams p) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.total_q * p.num_heads) return;
  const int64_t token = row / p.num_heads;  // packed index from cu_seqlens_q[0]
  const int head = static_cast<int>(row % p.num_heads);
  // Sequence s with cu_q[s] <= first_q + token < cu_q[s + 1] (empty sequences skipped).
  const int64_t global = p.first_q + token;
  int lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.cu_seqlens_q[mid] <= global) lo = mid; else hi = mid - 1;
  }
  const int len_q = p.cu_seqlens_q[lo + 1] - p.cu_seqlens_q[lo];
  const int len_k = p.cu_seqlens_k[lo + 1] - p.cu_seqlens_k[lo];
  const int query = static_cast<int>(global - p.cu_seqlens_q[lo]);
  const int keys = p.causal ? min(len_k, len_k - len_q + query + 1) : len_k;
  const bool empty = keys <= 0;

  // 4-wide chunks: every lane busy at v_dim 128 (8-byte loads, 16-byte fp32 / 8-byte bf16
  // stores).
  const int64_t offset = token * p.out_token_stride + head * p.out_head_stride;
  const __nv_bfloat16* o = p.o + row * p.v_dim;
  if (p.out_dtype == DType::kBF16) {
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + offset;
    const bool aligned = (reinterpret_cast<uintptr_t>(out) & 7) == 0;
    for (int c = lane * 4; c < p.v_dim; c += 32 * 4) {
      uint2 raw = make_uint2(0u, 0u);  // bf16 zeros
      if (!empty) raw = *reinterpret_cast<const uint2*>(o + c);
      if (aligned) {
        *reinterpret_cast<uint2*>(out + c) = raw;
      } else {
        const auto* values = reinterpret_cast<const __nv_bfloat16*>(&raw);
        for (int i = 0; i < 4; ++i) out[c + i] = values[i];
      }
    }
  } else {
    float* out = static_cast<float*>(p.out) + offset;
    const bool aligned = (reinterpret_cast<uintptr_t>(out) & 15) == 0;
    for (int c = lane * 4; c < p.v_dim; c += 32 * 4) {
      float4 values = make_float4(0.f, 0.f, 0.f, 0.f);
      if (!empty) {
        const uint2 raw = *reinterpret_cast<const uint2*>(o + c);
        const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
        const float2 a = __bfloat1622float2(pairs[0]), b = __bfloat1622float2(pairs[1]);
        values = make_float4(a.x, a.y, b.x, b.y);
      }
      if (aligned) {
        *reinterpret_cast<float4*>(out + c) = values;
      } else {
        out[c] = values.x, out[c + 1] = values.y, out[c + 2] = values.z, out[c + 3] = values.w;
      }
    }
  }
  if (p.lse != nullptr && lane == 0) {
    p.lse[token * p.lse_token_stride + head] = empty ? -INFINITY : p.stats[row];
  }
}

}  // namespace

absl::Status LaunchSdpaIndex(const SdpaIndexParams& p, cudaStream_t stream) {
  const int threads = 128, blocks = (p.padded_seqs + 1 + threads - 1) / threads;
  SdpaIndexKernel<<<blocks, threads, 0, stream>>>(p);
  DCP_CUDA_LAUNCH_CHECK("SdpaIndexKernel");
  return absl::OkStatus();
}

absl::Status LaunchSdpaFinish(const SdpaFinishParams& p, cudaStream_t stream) {
  const int64_t rows = p.total_q * p.num_heads;
  if (rows == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.v_dim % 8 == 0 && p.num_seqs > 0, "SdpaFinish: v_dim %d must be a multiple of 8",
                p.v_dim);
  const int threads = 256;
  const int64_t blocks = (rows * 32 + threads - 1) / threads;
  SdpaFinishKernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(p);
  DCP_CUDA_LAUNCH_CHECK("SdpaFinishKernel");
  return absl::OkStatus();
}

}  // namespace dcp::cuda
