// Sparse MQA, bf16, head_dim 576 / v_dim 512: the wgmma kernel's instantiation that merges the
// splits inside a thread-block cluster (SparseMqaSplit::cluster_merge; sm_90a).
#include "attention/cuda/sparse_mqa_sm90_kernel.cuh"

namespace dcp::cuda {
template absl::Status LaunchSparseMqaSm90<576, 512, KvCacheDType::kBF16,
                                          Sm90Epilogue::kCluster>(
    const SparseMqaParams&, const SparseMqaSplit&, cudaStream_t);
template int SparseMqaSm90MaxClusters<576, 512>(int);
}  // namespace dcp::cuda
