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

// DeepSeek-V3.2 (192 / 128), H200. Third run (2026-12-01, kernels mode, native against our
// cuDNN with the fp32 out): native below ~8M scores (q256 at 16 heads 20.0 vs 22.2 us; ties at
// q512 / 16 heads, 4.2M, and q256 / 128 heads, 8.4M; cuDNN from q1k / 16 heads, 16.8M: 35.7 vs
// 63.6) and with few keys (16q64 at 128 heads: 89 vs 137 us). Ninth run (2026-12-02, routes at
// 128 heads with the bf16 out, docs/dense_prefill_cudnn.md): the native kernel lost to torch's
// cuDNN SDPA (the configuration of our uniform graphs) on many sequences of 128-256 keys where
// torch's time is well above its ~60 us floor: 16q128 0.83x, 32q128 0.74x, 64q128 0.78x, 8q256
// 0.71x, 16q256 0.60x, 32q256 0.58x, 64q256 0.53x; it kept winning with 64 keys (16q64 / 32q64 /
// 64q64: 1.4-2.1x). So native below 8M scores or with <= 64 keys (it was <= 256 keys, fitted
// when cuDNN still paid a finish pass over an fp32 out). Not yet re-measured as native against
// our own cuDNN path with the bf16 out (`dcp_bench --mode kernels --prefill_backend
// native,cudnn,auto --output_dtype bf16`). GLM-5 (second run, not re-measured): the 256/256
// native kernel spills registers and wins only below ~2M scores (q256 at 16 heads: 53 vs 60 us;
// q512 at 16 heads, 4.2M: cuDNN 69 vs 80 us).
constexpr Threshold kTable[] = {
    {192, 128, 8.0e6, 64},
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
