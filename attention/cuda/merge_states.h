// LSE merge of attention partials and the two DCP combines on the GPU (attention_params.h:
// MergeStatesParams, DcpCorrectParams, DcpCombineParams), fp32 throughout, natural-log LSE.
// NaN and +inf LSE count as -inf; a (token, head) with no finite LSE gets out 0, lse -inf.
// MergeStates may run in place (out/lse aliasing a or b). Pointers are device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "attention/attention_params.h"
#include "core/cuda/programmatic_launch.h"

namespace dcp::cuda {

absl::Status MergeStates(const MergeStatesParams& params, cudaStream_t stream);
absl::Status DcpCorrect(const DcpCorrectParams& params, cudaStream_t stream);
absl::Status DcpCombine(const DcpCombineParams& params, cudaStream_t stream);

// The split-KV merge of the sparse MQA launcher: `splits` partials [splits, T, H, dim] and
// their LSEs [splits, T, H] (contiguous, device memory) into out (strided, [T, H, dim]) and
// lse ([T, H], row stride lse_token_stride). 1 <= splits <= kMaxMergeSplits, dim % 4 == 0.
// With out_bf16 set, out is bf16 (the same element strides; the fp32 result rounded to nearest
// even) instead of fp32.
// Every split's partial is read (an empty one, lse -inf, is selected out, its values may be
// anything). On sm_90 it is launched as a programmatic dependent of the previous kernel in the
// stream (it waits for that kernel's completion on the device; core/cuda/programmatic_launch.h).
constexpr int kMaxMergeSplits = 64;
absl::Status MergeSplits(const float* parts, const float* part_lse, int splits, int num_tokens,
                         int num_heads, int dim, void* out, int64_t out_token_stride,
                         int64_t out_head_stride, float* lse, int64_t lse_token_stride,
                         cudaStream_t stream, bool out_bf16 = false);

}  // namespace dcp::cuda
