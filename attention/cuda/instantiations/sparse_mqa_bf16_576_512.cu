// Sparse MQA, bf16, head_dim 576 / v_dim 512 (DeepSeek-V3.2 latent rows): the mma.sync kernel.
#include "attention/cuda/sparse_mqa_kernel.cuh"

namespace dcp::cuda {
template absl::Status LaunchSparseMqa<576, 512>(const SparseMqaParams&, const SparseMqaSplit&,
                                                cudaStream_t);
}  // namespace dcp::cuda
