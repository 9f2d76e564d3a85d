// The sparse MQA route (DESIGN.md section 7) for the first num_tokens tokens of a plan (in
// execution order): absorb this rank's heads into q', all-gather q' over heads, map each
// token's top-k positions to this rank's slots, one sparse MQA launch over all H heads and this
// rank's keys, the LSE combine back to this rank's heads, and the w_uv projection.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "collectives/communicator.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "runtime/forward_stats.h"
#include "runtime/kv_cache.h"
#include "runtime/lse_combine.h"
#include "runtime/mla_projections.h"
#include "runtime/plan.h"
#include "runtime/scratch.h"

namespace dcp {

struct SparseRouteInputs {
  const void* q_nope;    // [T, Hl, Dn] storage dtype, execution order
  const void* q_rope;    // [T, Hl, Dr]
  const int32_t* topk;   // [T, topk_width] request-local positions, -1 = none; or nullptr
                         // for every causal key
  int topk_width = 0;
  int64_t num_tokens = 0;  // the first num_tokens tokens of the plan (execution order)
};

class SparseRoute {
 public:
  SparseRoute(Device& device, Communicator& comm, const ModelDims& model, float scale,
              CombineBackend combine, const KvCache& cache, MlaProjections& projections)
      : device_(device), comm_(comm), model_(model), scale_(scale), cache_(cache),
        projections_(projections), combine_(device, comm, combine) {}

  // out [T, Hl, Dv] F32, lse [T, Hl] F32.
  absl::Status Run(const Plan& plan, const SparseRouteInputs& in, float* out, float* lse,
                   ForwardStats* stats);

 private:
  // The top-k of the tokens as this rank's slots: [T, *width] (-1 = not here / none).
  absl::StatusOr<int32_t*> LocalSlots(const Plan& plan, const SparseRouteInputs& in, int* width);

  Device& device_;
  Communicator& comm_;
  ModelDims model_;
  float scale_;
  const KvCache& cache_;
  MlaProjections& projections_;
  LseCombine combine_;
  // Slot mapping: per-token request and position, the requests' block tables, causal top-k.
  ScratchBuffer token_request_, token_position_, block_tables_, causal_topk_, slots_;
  // q' of this rank's heads, of all heads (rank-major), and rearranged token-major.
  ScratchBuffer q_latent_, q_all_, q_heads_;
  // Partials: rank-major [W, T, Hl, R] for the combine, token-major from the kernel.
  ScratchBuffer partial_, lse_partial_, out_heads_, lse_heads_;
  ScratchBuffer combined_, o_lat_storage_;
};

}  // namespace dcp
