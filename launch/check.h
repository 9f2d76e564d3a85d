// --check: the same batch through a single-rank DcpContext (LocalCommunicator, CPU device,
// every head) on rank 0, compared with what the group gathered.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "collectives/local_communicator.h"
#include "launch/rank_batch.h"
#include "runtime/dcp.h"

namespace dcp::launch {

struct CheckResult {
  double out_max_abs = 0, out_max_rel = 0;  // rel: max |error| / max |reference|
  double lse_max_abs = 0, lse_max_rel = 0;  // rel: max of |error| / max(|reference|, 1)
  double tolerance = 0;
  bool passed = true;
  std::string first_failure;  // where the worst error is, when !passed
};

// Errors of (out, lse) against the reference (same shapes [T, H, Dv] and [T, H]). An LSE of
// -inf must match -inf exactly; NaN anywhere fails.
CheckResult CompareOutputs(const std::vector<float>& out, const std::vector<float>& lse,
                           const std::vector<float>& ref_out, const std::vector<float>& ref_lse,
                           int num_heads, int v_head_dim, double tolerance);

// The default tolerance for a storage dtype: F32 1e-4, BF16 5e-2.
double DefaultTolerance(DType storage);

class Reference {
 public:
  // `options` are the group's; the reference keeps model, scheduler and attention and runs
  // them as a world of one. `weights`: every head's.
  static absl::StatusOr<std::unique_ptr<Reference>> Create(const DcpOptions& options,
                                                           const RankWeights& weights);
  // `batch`: the whole batch (every head, world-of-one cached rows).
  absl::Status Run(const RankBatch& batch, std::vector<float>* out, std::vector<float>* lse);

 private:
  Reference() = default;
  DcpOptions options_;
  RankWeights weights_;
  LocalCommunicator comm_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<DcpContext> context_;
};

}  // namespace dcp::launch
