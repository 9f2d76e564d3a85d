// The two small kernels around a cuDNN SDPA launch (cudnn_sdpa.h):
// - SdpaIndex writes cuDNN's per-sequence inputs from the device cu_seqlens: sequence lengths
//   and the ragged (THD) offsets of Q, K, V, O and Stats, in elements; sequences past num_seqs
//   (the graph's batch is bucketed) get length 0 and the end offset.
// - SdpaFinish turns cuDNN's bf16 O [Tq, H, v_dim] and fp32 Stats [Tq, H] into DenseMha's
//   contract: fp32 or bf16 out and natural-log lse at the caller's strides, out 0 / lse -inf for a
//   query that sees no key (an empty key range, or causal with more queries than keys), which
//   cuDNN leaves undefined.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"

namespace dcp::cuda {

struct SdpaIndexParams {
  const int32_t* cu_seqlens_q = nullptr;  // [num_seqs + 1] device
  const int32_t* cu_seqlens_k = nullptr;  // [num_seqs + 1] device
  int num_seqs = 0;
  int padded_seqs = 0;  // the graph's batch, >= num_seqs
  // Elements per token of each tensor (the ragged offset of sequence b is cu[b] * stride).
  int64_t q_token_stride = 0, k_token_stride = 0, v_token_stride = 0;
  int64_t o_token_stride = 0, stats_token_stride = 0;
  int32_t* seq_len_q = nullptr;     // [padded_seqs]
  int32_t* seq_len_k = nullptr;     // [padded_seqs]
  int32_t* q_offsets = nullptr;     // [padded_seqs + 1]
  int32_t* k_offsets = nullptr;     // [padded_seqs + 1]
  int32_t* v_offsets = nullptr;     // [padded_seqs + 1]
  int32_t* o_offsets = nullptr;     // [padded_seqs + 1]
  int32_t* stats_offsets = nullptr; // [padded_seqs + 1]
};

struct SdpaFinishParams {
  const __nv_bfloat16* o = nullptr;  // [total_q, H, v_dim] packed, cuDNN's output
  const float* stats = nullptr;      // [total_q, H] natural-log LSE of the scaled scores
  const int32_t* cu_seqlens_q = nullptr;  // [num_seqs + 1] device
  const int32_t* cu_seqlens_k = nullptr;  // [num_seqs + 1] device
  int num_seqs = 0, num_heads = 0, v_dim = 0;
  int64_t total_q = 0;  // cu_seqlens_q[num_seqs] - cu_seqlens_q[0]
  int first_q = 0;      // cu_seqlens_q[0]
  void* out = nullptr;  // [total_q, H, v_dim] of out_dtype at out_token_stride / out_head_stride
  DType out_dtype = DType::kF32;  // F32 or BF16
  int64_t out_token_stride = 0, out_head_stride = 0;
  float* lse = nullptr;  // [total_q, H] at lse_token_stride; may be null
  int64_t lse_token_stride = 0;
  bool causal = true;
};

absl::Status LaunchSdpaIndex(const SdpaIndexParams& params, cudaStream_t stream);
absl::Status LaunchSdpaFinish(const SdpaFinishParams& params, cudaStream_t stream);

}  // namespace dcp::cuda
