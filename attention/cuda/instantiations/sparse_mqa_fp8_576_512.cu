// Sparse MQA, bf16 q over fp8_ds_mla cache rows, head_dim 576 / v_dim 512.
#include "attention/cuda/sparse_mqa_kernel.cuh"

namespace dcp::cuda {
template absl::Status LaunchSparseMqa<576, 512, KvCacheDType::kFp8DsMla>(const SparseMqaParams&,
                                                                          const SparseMqaSplit&,
                                                                          cudaStream_t);
}  // namespace dcp::cuda
