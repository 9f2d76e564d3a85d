// Dense MHA on the GPU (attention_params.h, DenseMhaParams): packed variable-length sequences,
// causal (bottom-right aligned) or not (context chunks), bf16 q/k/v, fp32 out and natural-log
// LSE. Compiled for qk_dim 192 / v_dim 128 (DeepSeek-V3.2's [nope | rope] / v heads) and
// 256 / 256 (GLM-5); other sizes, other dtypes and q/k/v strides that are not multiples of 8 elements are
// InvalidArgument. cu_seqlens_q / cu_seqlens_k are device memory; every sequence's query count
// must be <= max_seqlen_q (the grid covers ceil(max_seqlen_q / 64) query blocks; 0 means no
// queries at all here: CudaDevice::DenseMha fills it in from cu_seqlens_q when 0).
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "attention/attention_params.h"

namespace dcp::cuda {

absl::Status DenseMha(const DenseMhaParams& params, cudaStream_t stream);

// The kernel for one compiled (qk_dim, v_dim); params already checked. Defined in
// dense_mha_kernel.cuh, instantiated in instantiations/.
template <int kQkDim, int kVDim>
absl::Status LaunchDenseMha(const DenseMhaParams& params, cudaStream_t stream);

}  // namespace dcp::cuda
