// Sparse MQA, bf16 rows, head_dim 576 / v_dim 512: the warp-specialised wgmma kernel (sm_90a)
// with the roles schedule (SparseMqaSplit::roles, sparse_mqa_sm90_roles.cuh) and fp32 output
// rows (Sm90Epilogue::kF32).
#include "attention/cuda/sparse_mqa_sm90_kernel.cuh"

namespace dcp::cuda {

template absl::Status LaunchSparseMqaSm90<576, 512, KvCacheDType::kBF16, Sm90Epilogue::kF32,
                                          /*kRoles=*/true>(const SparseMqaParams&,
                                                           const SparseMqaSplit&, cudaStream_t);

}  // namespace dcp::cuda
