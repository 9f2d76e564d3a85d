// LSE merge of attention partials and the two DCP combines on the GPU (attention_params.h:
// MergeStatesParams, DcpCorrectParams, DcpCombineParams), fp32 throughout, natural-log LSE.
// NaN and +inf LSE count as -inf; a (token, head) with no finite LSE gets out 0, lse -inf.
// MergeStates may run in place (out/lse aliasing a or b). Pointers are device memory.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "attention/attention_params.h"

namespace dcp::cuda {

absl::Status MergeStates(const MergeStatesParams& params, cudaStream_t stream);
absl::Status DcpCorrect(const DcpCorrectParams& params, cudaStream_t stream);
absl::Status DcpCombine(const DcpCombineParams& params, cudaStream_t stream);

}  // namespace dcp::cuda
