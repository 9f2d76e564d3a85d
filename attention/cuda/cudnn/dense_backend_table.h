// prefill_backend auto on CUDA ranks: which dense MHA implementation runs a shape when both
// the native kernel and cuDNN support it. A small table measured with `dcp_bench --mode
// kernels` on the H200 (docs/dense_prefill_cudnn.md): below a per-size-pair amount of work
// the native kernel's lower launch overhead wins; above it cuDNN's wgmma kernels do.
#pragma once

#include <cstdint>

namespace dcp::cuda {

struct DenseShape {
  int qk_dim = 0, v_dim = 0, num_heads = 0;
  int64_t total_q = 0;  // query tokens of the launch
  int max_q = 0, max_k = 0;
  bool causal = true;
};

// true: cuDNN SDPA; false: the native kernel.
bool PreferCudnn(const DenseShape& shape);

}  // namespace dcp::cuda
