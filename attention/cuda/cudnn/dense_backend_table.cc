#include "attention/cuda/cudnn/dense_backend_table.h"

#include <algorithm>

namespace dcp::cuda {
namespace {

struct Threshold {
  int qk_dim, v_dim;
  // The native kernel runs shapes whose score count, heads x query tokens x longest key range,
  // is below native_below, and every shape whose longest key range is <= native_max_keys
  // (many short sequences: cuDNN's fixed cost per launch, its length buckets and the fp32
  // output pass outweigh its faster math there).
  double native_below;
  int native_max_keys;
};

// Measured on the H200 (dcp_bench --mode kernels --prefill_backend native,cudnn, 2026-12-01;
// docs/dense_prefill_cudnn.md). DeepSeek-V3.2: native wins up to ~17M scores (q1k at 16
// heads is a tie: 86 vs 83 us) and on every shape with <= 256 keys (64q64s128 at 128 heads:
// 404 vs 569 us); GLM-5: the 256/256 native kernel spills registers and wins only below ~2M
// scores (q256 at 16 heads: 53 vs 60 us; q512 at 16 heads, 4.2M: cuDNN 69 vs 80 us).
constexpr Threshold kTable[] = {
    {192, 128, 3.2e7, 256},
    {256, 256, 3.0e6, 0},
};

}  // namespace

bool PreferCudnn(const DenseShape& shape) {
  const double scores =
      double(shape.num_heads) * double(shape.total_q) * double(std::max(shape.max_k, 1));
  for (const Threshold& t : kTable) {
    if (t.qk_dim == shape.qk_dim && t.v_dim == shape.v_dim) {
      return scores >= t.native_below && shape.max_k > t.native_max_keys;
    }
  }
  return true;
}

}  // namespace dcp::cuda
