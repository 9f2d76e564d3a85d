// The dense MHA route for the prefills of a plan (DESIGN.md sections 5-6): the new tokens
// attend causally to themselves; the cached context streams through the chunked-prefill
// workspace chunk by chunk (gather this rank's rows, all-gather, reorganize into global order,
// up-project, non-causal attention), each chunk merged by LSE, and the two halves merged last.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "collectives/communicator.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "runtime/forward_stats.h"
#include "runtime/kv_cache.h"
#include "runtime/mla_projections.h"
#include "runtime/plan.h"
#include "runtime/scratch.h"

namespace dcp {

struct DenseRouteInputs {
  const void* q_nope;  // [Tp, Hl, Dn] storage dtype: the prefill tokens, execution order
  const void* q_rope;  // [Tp, Hl, Dr]
  const void* kv_new;  // [Tp, R + Dr] the prefill tokens' fresh latent rows
};

class DenseRoute {
 public:
  // workspace: [total_rows, R + Dr] of the storage dtype (the plan's WorkspaceSize).
  DenseRoute(Device& device, Communicator& comm, const ModelDims& model, float scale,
             const KvCache& cache, MlaProjections& projections, void* workspace)
      : device_(device), comm_(comm), model_(model), scale_(scale), cache_(cache),
        projections_(projections), workspace_(workspace) {}

  // out [Tp, Hl, Dv] F32, lse [Tp, Hl] F32 of the plan's prefill tokens.
  absl::Status Run(const Plan& plan, const DenseRouteInputs& in, float* out, float* lse,
                   ForwardStats* stats);

 private:
  // Keys of one context chunk, up-projected: k [num_keys, Hl, Dn + Dr], v [num_keys, Hl, Dv].
  absl::Status ChunkKeys(const Plan& plan, const ContextChunk& chunk, void** k, void** v,
                         ForwardStats* stats);

  Device& device_;
  Communicator& comm_;
  ModelDims model_;
  float scale_;
  const KvCache& cache_;
  MlaProjections& projections_;
  void* workspace_;
  ScratchBuffer q_, k_new_, v_new_, cu_seqlens_q_, cu_seqlens_k_;
  ScratchBuffer out_new_, lse_new_, out_context_, lse_context_, out_chunk_, lse_chunk_;
  ScratchBuffer local_slots_, reorganize_index_, chunk_rows_, k_chunk_, v_chunk_;
};

}  // namespace dcp
