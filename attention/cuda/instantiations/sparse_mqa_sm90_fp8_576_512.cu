// Sparse MQA, bf16 q over fp8_ds_mla cache rows, head_dim 576 / v_dim 512: the warp-specialised
// wgmma kernel (sm_90a) with fp32 output rows (Sm90Epilogue::kF32), its producer dequantizing
// the 656-byte rows into the bf16 tiles.
#include "attention/cuda/sparse_mqa_sm90_kernel.cuh"

namespace dcp::cuda {
template absl::Status LaunchSparseMqaSm90<576, 512, KvCacheDType::kFp8DsMla,
                                          Sm90Epilogue::kF32>(
    const SparseMqaParams&, const SparseMqaSplit&, cudaStream_t);
}  // namespace dcp::cuda
