// The per-rank worker behind DcpContext: puts the parts together and runs each batch.
//
// Per batch (DESIGN.md sections 4-7):
//   check the inputs and stage the top-k (validated on the device, each rank a share of its
//   rows) -> agree -> plan (rank 0, broadcast, checked) -> write the owned new tokens into the
//   cache (KvCache) -> inputs in execution order (decodes first)
//   -> SparseRoute for the MQA tokens -> DenseRoute for the prefills (dense route)
//   -> outputs back in the caller's token order -> agree on the outcome.
// The parts: KvCache (self-owned paged cache), MlaProjections (weights and their GEMMs),
// SparseRoute (+ LseCombine), DenseRoute (+ the workspace), input_checks, ForwardStats.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "collectives/communicator.h"
#include "runtime/dcp.h"
#include "runtime/dense_route.h"
#include "runtime/device.h"
#include "runtime/kv_cache.h"
#include "runtime/mla_projections.h"
#include "runtime/plan.h"
#include "runtime/planner.h"
#include "runtime/scratch.h"
#include "runtime/sparse_route.h"

namespace dcp {

class Worker {
 public:
  static absl::StatusOr<std::unique_ptr<Worker>> Create(const DcpOptions& options,
                                                        Communicator& comm, Device& device,
                                                        const LayerWeights& weights);

  absl::Status AddRequest(int64_t request_id);
  absl::Status FreeRequest(int64_t request_id);
  absl::Status LoadCachedKv(int64_t request_id, int64_t num_tokens, const TensorView& local_rows);
  absl::Status Forward(absl::Span<const BatchRequest> batch, const BatchInputs& inputs,
                       const BatchOutputs& outputs);
  absl::StatusOr<std::string> PlanJson(absl::Span<const BatchRequest> batch, bool has_topk);

  const ForwardStats& last_stats() const { return stats_; }
  Communicator& comm() { return comm_; }
  bool dense_mha_available() const { return planner_.dense_mha_available; }
  void DamageNextPlanForTesting() { damage_next_plan_ = true; }

 private:
  Worker(const DcpOptions& options, Communicator& comm, Device& device)
      : options_(options), comm_(comm), device_(device) {}

  // The batch against the cached lengths, then the tensors' shapes.
  absl::Status CheckInputs(absl::Span<const BatchRequest> batch, const BatchInputs& inputs,
                           const BatchOutputs& outputs);
  // Stages the top-k (caller order) into topk_ and, with attention.validate_topk, checks this
  // rank's share of its rows on the device: rank r of W takes rows [r*T/W, (r+1)*T/W) of the T
  // (every rank holds the same top-k). The caller agrees on the result before anything reads
  // the top-k.
  absl::Status StageTopk(absl::Span<const BatchRequest> batch, const TensorView& topk);
  // Everything after the plan: cache write, routes, outputs.
  absl::Status Execute(const Plan& plan, const BatchInputs& inputs, const BatchOutputs& outputs);

  DcpOptions options_;
  Communicator& comm_;
  Device& device_;
  int heads_ = 0;  // H/W, this rank's heads
  PlannerConfig planner_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<MlaProjections> projections_;
  Buffer workspace_;  // [S + S/W, R + Dr] of the storage dtype: local region, then all-gather
  std::unique_ptr<SparseRoute> sparse_;
  std::unique_ptr<DenseRoute> dense_;
  // Inputs staged in the storage dtype (caller order) and in execution order; the outputs in
  // execution order and, for host outputs, in caller order before the copy back.
  ScratchBuffer kv_new_, q_nope_, q_rope_, topk_, topk_positions_, perm_;
  ScratchBuffer kv_new_exec_, q_nope_exec_, q_rope_exec_, topk_exec_;
  ScratchBuffer out_exec_, lse_exec_, out_caller_, lse_caller_;
  ForwardStats stats_;
  bool damage_next_plan_ = false;
};

}  // namespace dcp
