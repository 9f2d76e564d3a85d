#include "launch/check.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"
#include "launch/batch_calls.h"
#include "core/status.h"

namespace dcp::launch {

double DefaultTolerance(DType storage) { return storage == DType::kF32 ? 1e-4 : 5e-2; }

CheckResult CompareOutputs(const std::vector<float>& out, const std::vector<float>& lse,
                           const std::vector<float>& ref_out, const std::vector<float>& ref_lse,
                           int num_heads, int v_head_dim, double tolerance) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  CheckResult result;
  result.tolerance = tolerance;
  if (out.size() != ref_out.size() || lse.size() != ref_lse.size()) {
    result.passed = false;
    result.out_max_abs = result.out_max_rel = result.lse_max_abs = result.lse_max_rel = kInf;
    result.first_failure = "output sizes differ from the reference";
    return result;
  }
  double ref_scale = 0;
  size_t worst_out = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    ref_scale = std::max(ref_scale, std::fabs(double(ref_out[i])));
    double error = std::fabs(double(out[i]) - double(ref_out[i]));
    if (!std::isfinite(error)) error = kInf;
    if (error > result.out_max_abs) {
      result.out_max_abs = error;
      worst_out = i;
    }
  }
  result.out_max_rel = result.out_max_abs / std::max(ref_scale, 1e-30);
  if (result.out_max_abs == 0) result.out_max_rel = 0;

  size_t worst_lse = 0;
  for (size_t i = 0; i < lse.size(); ++i) {
    const double a = lse[i], b = ref_lse[i];
    double error = 0, relative = 0;
    if (std::isinf(a) && a < 0 && std::isinf(b) && b < 0) {
      error = 0;
    } else if (!std::isfinite(a) || !std::isfinite(b)) {
      error = relative = kInf;
    } else {
      error = std::fabs(a - b);
      relative = error / std::max(std::fabs(b), 1.0);
    }
    if (relative > result.lse_max_rel || (relative == kInf && result.lse_max_rel != kInf)) {
      worst_lse = i;
    }
    result.lse_max_abs = std::max(result.lse_max_abs, error);
    result.lse_max_rel = std::max(result.lse_max_rel, relative);
  }
  const bool out_ok = result.out_max_rel <= tolerance;
  const bool lse_ok = result.lse_max_rel <= tolerance;
  result.passed = out_ok && lse_ok;
  if (!out_ok) {
    const size_t t = worst_out / (size_t(num_heads) * v_head_dim);
    const size_t h = worst_out / v_head_dim % num_heads, d = worst_out % v_head_dim;
    result.first_failure = absl::StrFormat("out[%d][%d][%d] = %g, reference %g", t, h, d,
                                           out[worst_out], ref_out[worst_out]);
  } else if (!lse_ok) {
    result.first_failure =
        absl::StrFormat("lse[%d][%d] = %g, reference %g", worst_lse / num_heads,
                        worst_lse % num_heads, lse[worst_lse], ref_lse[worst_lse]);
  }
  return result;
}

absl::StatusOr<std::unique_ptr<Reference>> Reference::Create(const DcpOptions& options,
                                                             const RankWeights& weights) {
  std::unique_ptr<Reference> reference(new Reference());
  reference->options_ = options;
  // A world of one holds every rank's share of the KV pool.
  reference->options_.scheduler.num_kv_blocks *= options.dcp.world_size;
  reference->options_.dcp.world_size = 1;
  reference->options_.dcp.rank = 0;
  reference->weights_ = weights;
  reference->device_ = MakeCpuDevice(DType::kF32);
  const ModelDims& model = reference->options_.model;
  DCP_ASSIGN_OR_RETURN(
      reference->context_,
      DcpContext::Create(reference->options_, reference->comm_, *reference->device_,
                         WeightViews(reference->weights_, model, model.num_heads)));
  return reference;
}

absl::Status Reference::Run(const RankBatch& batch, std::vector<float>* out,
                            std::vector<float>* lse) {
  const ModelDims& model = options_.model;
  DCP_RETURN_IF_ERROR(AddRequests(*context_, batch));
  absl::Status status = LoadContext(*context_, batch, model);
  if (status.ok()) status = ForwardBatch(*context_, batch, model, model.num_heads, out, lse);
  absl::Status freed = FreeRequests(*context_, batch);
  DCP_RETURN_IF_ERROR(status);
  return freed;
}

}  // namespace dcp::launch
