// Sparse top-k MQA on the GPU (attention_params.h, SparseMqaParams): bf16 q and latent cache,
// fp32 out and natural-log LSE. Compiled for head_dim 576 / v_dim 512 (DeepSeek-V3.2's
// [kv_c | k_pe] rows); other sizes, other dtypes and strides that are not multiples of 8
// elements (16 bytes) are InvalidArgument. Any num_heads >= 1 (up to 128 in practice: the grid
// has ceil(H / 64) blocks per token), any topk >= 0. Indices outside [0, num_slots) are skipped.
// kv_format kFp8DsMla reads 656-byte fp8_ds_mla rows directly (kv_row_stride 656 bytes, 16-byte
// aligned cache), dequantizing them on the way into shared memory; q stays bf16.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "attention/attention_params.h"

namespace dcp::cuda {

absl::Status SparseMqa(const SparseMqaParams& params, cudaStream_t stream);

// The kernel for one compiled (head_dim, v_dim, cache row format); params already checked.
// Defined in sparse_mqa_kernel.cuh, instantiated in instantiations/.
template <int kHeadDim, int kVDim, KvCacheDType kFormat = KvCacheDType::kBF16>
absl::Status LaunchSparseMqa(const SparseMqaParams& params, cudaStream_t stream);

}  // namespace dcp::cuda
