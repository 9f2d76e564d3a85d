#include "attention/cuda/cudnn/dense_backend_table.h"

#include <algorithm>

namespace dcp::cuda {
namespace {

struct Threshold {
  int qk_dim, v_dim;
  // The native kernel runs shapes whose score count, heads x query tokens x longest key range,
  // is below this (0: never).
  double native_below;
};

// Measured on the H200 (dcp_bench --mode kernels, docs/dense_prefill_cudnn.md).
constexpr Threshold kTable[] = {
    {192, 128, 0.0},
    {256, 256, 0.0},
};

}  // namespace

bool PreferCudnn(const DenseShape& shape) {
  const double scores =
      double(shape.num_heads) * double(shape.total_q) * double(std::max(shape.max_k, 1));
  for (const Threshold& t : kTable) {
    if (t.qk_dim == shape.qk_dim && t.v_dim == shape.v_dim) return scores >= t.native_below;
  }
  return true;
}

}  // namespace dcp::cuda
