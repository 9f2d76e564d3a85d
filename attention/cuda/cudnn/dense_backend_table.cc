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

// Measured on the H200 (dcp_bench --mode kernels --prefill_backend native,cudnn, 2026-12-01,
// third run: host cu_seqlens passed, uniform cuDNN graphs; docs/dense_prefill_cudnn.md).
// DeepSeek-V3.2: native wins below ~8M scores (q256 at 16 heads 20.0 vs 22.2 us; ties at q512 /
// 16 heads, 4.2M: 27.9 vs 28.1, and q256 / 128 heads, 8.4M: 40.5 vs 39.5; cuDNN wins from q1k /
// 16 heads, 16.8M: 35.7 vs 63.6) and on every shape with <= 256 keys (64q64s128 at 128 heads:
// 382 vs 508 us; 16q64 at 128 heads: 89 vs 137); GLM-5 (second run, not re-measured): the
// 256/256 native kernel spills registers and wins only below ~2M scores (q256 at 16 heads: 53
// vs 60 us; q512 at 16 heads, 4.2M: cuDNN 69 vs 80 us).
constexpr Threshold kTable[] = {
    {192, 128, 8.0e6, 256},
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
