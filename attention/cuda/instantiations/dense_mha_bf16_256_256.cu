// Dense MHA, bf16, qk_dim 256 / v_dim 256 (GLM-5 per-head K/V).
#include "attention/cuda/dense_mha_kernel.cuh"

namespace dcp::cuda {
template absl::Status LaunchDenseMha<256, 256>(const DenseMhaParams&, cudaStream_t);
}  // namespace dcp::cuda
