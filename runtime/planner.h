// The rank-0 batch planner (DESIGN.md section 5): validates the batch, orders it decodes
// first, applies the seed's routing rule, plans the context chunks of the dense route, and
// shares the plan with every rank, which checks it against its own view of the batch.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "collectives/communicator.h"
#include "runtime/batch.h"
#include "runtime/config.h"
#include "core/kv_layout.h"
#include "runtime/plan.h"
#include "workspace/workspace_size.h"

namespace dcp {

struct PlannerConfig {
  SchedulerConfig scheduler;
  AttentionConfig attention;
  KvLayout layout;
  bool dense_mha_available = false;  // the prefill backend resolved at start-up
  WorkspaceSize workspace;
  // The step's top-k width (DcpEngine::Plan sets it per step; 0: no top-k, every causal key).
  // A row of K < index_topk entries cannot hold every causal key of a prefill longer than K,
  // so the dense route takes prefills up to min(index_topk, K).
  int topk_width = 0;
  uint64_t settings = 0;  // SettingsFingerprint of the rank's options (DcpEngine::Create)
};

// Start-up resolution of attention.prefill_backend: "none" -> false; "auto" -> whether the
// device's dense kernel supports the model (`device_support` OK), warning once when not;
// "native" (the dense MHA kernel of the rank's device) or "cudnn" (cuDNN's fused SDPA, CUDA
// ranks) -> true, or the device's error (Device::SelectPrefillBackend); any other name -> an
// error listing what is available.
absl::StatusOr<bool> ResolvePrefillBackend(const AttentionConfig& attention,
                                           const absl::Status& device_support);

// Request counts and lengths against the scheduler's limits; unique ids.
absl::Status ValidateBatch(absl::Span<const BatchRequest> batch, const SchedulerConfig& scheduler);

// The seed's rule, exactly:
//   use_mha = is_sparse && prefill backend && num_prefills > 0
//             && max(prefill seq_len) <= index_topk && !force_mqa
Route ChooseRoute(const AttentionConfig& attention, bool dense_mha_available, int num_prefills,
                  int max_prefill_seq_len);

// The caller's token rows [begin, end) of the top-k that a step over `batch` (valid:
// ValidateBatch) reads, by the rule BuildPlan applies: on the sparse route every token reads its
// row; on the dense route only the decodes do (the prefills attend to every causal key, which is
// what a top-k of width index_topk >= seq_len selects), so the range runs from the first decode
// token to the last one's end: exactly the decodes when the caller lists them first (as vLLM
// does), a superset otherwise, empty when the step reads no row. The Worker checks the top-k only
// there.
struct TopkRows {
  int64_t begin = 0, end = 0;
  bool empty() const { return begin == end; }
};
TopkRows TopkRowsRead(absl::Span<const BatchRequest> batch, const PlannerConfig& config);

// Deterministic: the same batch and config give the same plan on every rank.
absl::StatusOr<Plan> BuildPlan(absl::Span<const BatchRequest> batch, const PlannerConfig& config);

// Collective. Rank 0 builds the plan and broadcasts it; every rank checks version and checksum
// and that the plan equals the one it builds from its own view of the batch. Any failure, on
// any rank, is returned on every rank. `damage_for_testing` flips a byte of rank 0's broadcast
// after the checksum was taken (the plan-mismatch tests).
//
// The caller's own verdicts ride in the same agreements, so a step's plan costs three host
// collectives at W > 1 (one at W = 1: none): `local` (this rank's check of its inputs; an
// error skips its planning) is agreed together with this rank's BuildPlan, then rank 0's plan
// travels in one broadcast (two when it is over kPlanFrameBytes), then the check of the
// received plan is agreed together with `then(plan)`, which runs on every rank whose check
// passed (DcpEngine::Plan prepares the step's metadata there).
inline constexpr size_t kPlanFrameBytes = 32 << 10;
absl::StatusOr<Plan> ExchangePlan(Communicator& comm, absl::Span<const BatchRequest> batch,
                                  const PlannerConfig& config, const absl::Status& local,
                                  absl::FunctionRef<absl::Status(const Plan&)> then,
                                  bool damage_for_testing = false);
absl::StatusOr<Plan> ExchangePlan(Communicator& comm, absl::Span<const BatchRequest> batch,
                                  const PlannerConfig& config, bool damage_for_testing = false);

}  // namespace dcp
