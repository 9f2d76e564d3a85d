// Dense MHA, bf16, qk_dim 192 / v_dim 128 (DeepSeek-V3.2 per-head K/V).
#include "attention/cuda/dense_mha_kernel.cuh"

namespace dcp::cuda {
template absl::Status LaunchDenseMha<192, 128>(const DenseMhaParams&, cudaStream_t);
}  // namespace dcp::cuda
