// Sparse MQA, bf16, head_dim 576 / v_dim 512: the wgmma kernel's
// instantiation that writes bf16 output rows at one split (SparseMqaParams::out_bf16,
// Sm90Epilogue::kBf16; sm_90a).
#include "attention/cuda/sparse_mqa_sm90_kernel.cuh"

namespace dcp::cuda {
template absl::Status LaunchSparseMqaSm90<576, 512, KvCacheDType::kBF16,
                                          Sm90Epilogue::kBf16>(
    const SparseMqaParams&, const SparseMqaSplit&, cudaStream_t);
}  // namespace dcp::cuda
