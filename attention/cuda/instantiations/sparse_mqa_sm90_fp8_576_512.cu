// Sparse MQA, bf16 q over fp8_ds_mla cache rows, head_dim 576 / v_dim 512: the warp-specialised
// wgmma kernel (sm_90a), its producer dequantizing the 656-byte rows into the bf16 tiles.
#include "attention/cuda/sparse_mqa_sm90_kernel.cuh"

namespace dcp::cuda {
template absl::Status LaunchSparseMqaSm90<576, 512, KvCacheDType::kFp8DsMla, false>(
    const SparseMqaParams&, const SparseMqaSplit&, cudaStream_t);
}  // namespace dcp::cuda
