// Sparse MQA, bf16 rows, head_dim 576 / v_dim 512: the wgmma kernel's one-way schedule (sm_90a;
// SparseMqaParams::sm90_schedule 2). Its own translation unit: the builds compile it in parallel.
#include "attention/cuda/sparse_mqa_sm90_kernel.cuh"

namespace dcp::cuda {

template absl::Status LaunchSparseMqaSm90<576, 512, KvCacheDType::kBF16, 1>(
    const SparseMqaParams&, const SparseMqaSplit&, cudaStream_t);

}  // namespace dcp::cuda
