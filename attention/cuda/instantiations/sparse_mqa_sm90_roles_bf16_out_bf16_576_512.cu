// Sparse MQA, bf16 rows, head_dim 576 / v_dim 512: the warp-specialised wgmma kernel (sm_90a)
// with the roles schedule (SparseMqaSplit::roles, sparse_mqa_sm90_roles.cuh) writing bf16
// output rows at one split (Sm90Epilogue::kBf16, SparseMqaParams::out_bf16).
#include "attention/cuda/sparse_mqa_sm90_kernel.cuh"

namespace dcp::cuda {

template absl::Status LaunchSparseMqaSm90<576, 512, KvCacheDType::kBF16, Sm90Epilogue::kBf16,
                                          /*kRoles=*/true>(const SparseMqaParams&,
                                                           const SparseMqaSplit&, cudaStream_t);

}  // namespace dcp::cuda
