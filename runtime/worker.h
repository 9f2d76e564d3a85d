// The per-rank worker behind DcpContext: the convenience layer over DcpEngine (runtime/engine.h)
// for callers that let dcp own the KV cache and the weights and hand over host or device
// tensors of any float dtype (the launcher, the tests, simple embeddings).
//
// Per batch: check the inputs and stage the top-k (validated on the device, each rank a share
// of its rows) -> agree -> grow the requests' blocks -> DcpEngine::Plan over the self-owned
// cache's block tables -> stage the inputs in the storage dtype -> DcpEngine::Run -> outputs
// back to the caller -> agree on the outcome -> commit the cached lengths.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "collectives/communicator.h"
#include "runtime/dcp.h"
#include "runtime/device.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"
#include "runtime/scratch.h"

namespace dcp {

class Worker {
 public:
  static absl::StatusOr<std::unique_ptr<Worker>> Create(const DcpOptions& options,
                                                        Communicator& comm, Device& device,
                                                        const LayerWeights& weights);

  absl::Status AddRequest(int64_t request_id);
  absl::Status FreeRequest(int64_t request_id);
  absl::Status TruncateRequest(int64_t request_id, int64_t num_tokens);
  absl::Status ForkRequest(int64_t request_id, int64_t from_id, int64_t num_tokens);
  absl::Status LoadCachedKv(int64_t request_id, int64_t num_tokens, const TensorView& local_rows);
  absl::Status Forward(absl::Span<const BatchRequest> batch, const BatchInputs& inputs,
                       const BatchOutputs& outputs);
  absl::StatusOr<std::string> PlanJson(absl::Span<const BatchRequest> batch, bool has_topk);

  const ForwardStats& last_stats() const { return stats_; }
  Communicator& comm() { return comm_; }
  bool dense_mha_available() const { return engine_->dense_mha_available(); }
  void DamageNextPlanForTesting() { engine_->DamageNextPlanForTesting(); }

 private:
  Worker(const DcpOptions& options, Communicator& comm, Device& device)
      : options_(options), comm_(comm), device_(device) {}

  // The batch against the cached lengths, then the tensors' shapes.
  absl::Status CheckInputs(absl::Span<const BatchRequest> batch, const BatchInputs& inputs,
                           const BatchOutputs& outputs);
  // Stages the top-k (caller order) into topk_ and, with attention.validate_topk, checks this
  // rank's share of its rows on the device: rank r of W takes rows [r*T/W, (r+1)*T/W) of the T
  // (every rank holds the same top-k). The check is only begun (*checking then true): the
  // caller takes its verdict with Device::FinishValidateTopk and agrees on it before anything
  // reads the top-k.
  absl::Status StageTopk(absl::Span<const BatchRequest> batch, const TensorView& topk,
                         bool* checking);
  // The step's block tables from the self-owned cache, rows in batch order.
  StepTables Tables(absl::Span<const BatchRequest> batch);
  // Everything after the plan: inputs staged, the layer run, outputs to the caller.
  absl::Status Execute(const BatchInputs& inputs, const BatchOutputs& outputs);

  DcpOptions options_;
  Communicator& comm_;
  Device& device_;
  std::unique_ptr<DcpEngine> engine_;
  std::unique_ptr<KvCache> cache_;
  Buffer w_uk_, w_uv_;  // this rank's heads' weights in the storage dtype
  Buffer w_kv_b_;       // both as one [Hl, Dn + Dv, R] (the dense route's up-projection)
  const int32_t* topk_data_ = nullptr;  // the step's staged (or the caller's) top-k
  std::vector<int32_t> tables_;  // the step's block tables, [requests, max_blocks]
  std::vector<int32_t> topk_positions_host_;  // StageTopk's, kept for its capacity
  ScratchBuffer kv_new_, q_nope_, q_rope_, topk_, topk_positions_, out_, lse_;
  ForwardStats stats_;
};

}  // namespace dcp
