// The sparse MQA route (DESIGN.md section 7) for the first num_tokens tokens of a plan (in
// execution order): absorb this rank's heads into q', all-gather q' over heads, map each
// token's top-k positions to this rank's slots, one sparse MQA launch over all H heads and this
// rank's keys, the LSE combine back to this rank's heads, and the w_uv projection.
//
// Prepare (host, once per step) uploads the slot-mapping metadata and sizes every buffer; Run
// (per layer) only launches kernels and collectives.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "collectives/communicator.h"
#include "core/kv_layout.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "runtime/forward_stats.h"
#include "runtime/kv_cache.h"
#include "runtime/lse_combine.h"
#include "runtime/mla_projections.h"
#include "runtime/plan.h"
#include "runtime/route_outputs.h"
#include "runtime/scratch.h"
#include "runtime/step.h"

namespace dcp {

struct SparseRouteInputs {
  const void* q_nope;   // [T, Hl, Dn] storage dtype, execution order
  const void* q_rope;   // [T, Hl, Dr]
  const int32_t* topk;  // [T, topk_width] request-local positions, -1 = none, execution
                        // order; nullptr when Prepare was told topk_width 0 (every causal key)
};

// The sparse MQA kernel's SparseMqaParams::expected_keys for `rank`: the most keys of the rank a
// token is expected to have, over tokens at positions token_position (a token at p sees
// positions 0..p): its selection, min(topk_width, p + 1), times the share of those positions
// the rank holds (layout.local_length), rounded up; at least 1, at most max(topk_width, 1).
// The kernel's split and tiling are planned for it rather than for the top-k width: at W ranks
// a rank walks about 1 / W of each selection.
int ExpectedSparseKeys(const KvLayout& layout, int rank, const std::vector<int32_t>& token_position,
                       int topk_width);

class SparseRoute {
 public:
  SparseRoute(Device& device, Communicator& comm, const ModelDims& model, float scale,
              CombineBackend combine, KvLayout layout, int rank, MlaProjections& projections,
              KvCacheDType kv_format = KvCacheDType::kBF16)
      : device_(device), comm_(comm), model_(model), scale_(scale), layout_(layout),
        rank_(rank), kv_format_(kv_format), projections_(projections),
        combine_(device, comm, combine) {}

  // The step's first num_tokens tokens (execution order) take this route; topk_width is the
  // layers' top-k width, 0 for every causal key. `tables` rows follow the caller's order.
  absl::Status Prepare(const Plan& plan, const StepTables& tables, int64_t num_tokens,
                       int topk_width);
  // out [T, Hl, Dv], lse [T, Hl]. stats may be null (no timing, no waits).
  absl::Status Run(const KvCacheView& cache, const SparseRouteInputs& in, const RouteOutputs& out,
                   StepStats* stats);

 private:
  // The kernel's parameters for the planned step (pointers as given). fp8_ds_mla caches: the
  // kernel reads the 656-byte rows (every key, the step's new tokens once written) directly.
  SparseMqaParams KernelParams(const KvCacheView& cache, const void* q, const int32_t* slots,
                               const int32_t* valid_counts, float* out, float* lse) const;

  Device& device_;
  Communicator& comm_;
  ModelDims model_;
  float scale_;
  KvLayout layout_;
  int rank_;
  KvCacheDType kv_format_;  // the cache's row format (attention.kv_cache_dtype)
  MlaProjections& projections_;
  LseCombine combine_;
  // The step: tokens, top-k width (the causal top-k's when none is given), slot-mapping inputs.
  int64_t num_tokens_ = 0;
  int topk_width_ = 0;
  int expected_keys_ = 0;  // ExpectedSparseKeys of the step
  bool causal_ = false;
  int num_requests_ = 0, max_blocks_ = 0, block_size_ = 0;
  ScratchBuffer token_request_, token_position_, block_tables_, causal_topk_, slots_;
  // q' of this rank's heads, of all heads (rank-major), and rearranged token-major.
  ScratchBuffer q_latent_, q_all_, q_heads_;
  // Partials: rank-major [W, T, Hl, R] for the combine, token-major from the kernel.
  ScratchBuffer partial_, lse_partial_, out_heads_, lse_heads_;
  ScratchBuffer combined_, o_lat_storage_;
  ScratchBuffer split_workspace_;  // split-KV partials of the kernel (Device-sized)
};

}  // namespace dcp
