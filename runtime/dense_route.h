// The dense MHA route for the prefills of a plan (DESIGN.md sections 5-6): the new tokens
// attend causally to themselves; the cached context streams through the chunked-prefill
// workspace chunk by chunk (gather this rank's rows, all-gather, reorganize into global order,
// up-project, non-causal attention), each chunk merged by LSE, and the two halves merged last.
// When the whole context is one chunk (the common case) the reorganize leaves each prefill
// room for its new tokens' fresh latent rows right after its context, one up-projection makes
// every prefill's keys [context | new] contiguous, and one bottom-right causal DenseMha writes
// the caller's out and lse: no second attention launch, no LSE merge, no fp32 states.
//
// Prepare (host, once per step) computes every chunk's index arrays and uploads them, and sizes
// the buffers; Run (per layer) only launches kernels and collectives.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "collectives/communicator.h"
#include "core/kv_layout.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "runtime/forward_stats.h"
#include "runtime/kv_cache.h"
#include "runtime/mla_projections.h"
#include "runtime/plan.h"
#include "runtime/route_outputs.h"
#include "runtime/scratch.h"
#include "runtime/step.h"
#include "workspace/chunk_plan.h"

namespace dcp {

struct DenseRouteInputs {
  const void* q_nope;  // [Tp, Hl, Dn] storage dtype: the prefill tokens, execution order
  const void* q_rope;  // [Tp, Hl, Dr]
  const void* kv_new;  // [Tp, R + Dr] the prefill tokens' fresh latent rows
};

class DenseRoute {
 public:
  // workspace: [total_rows, R + Dr] of the storage dtype (the plan's WorkspaceSize).
  // fp8_ds_mla caches: the context rows move as raw 656-byte rows through the paged gather and
  // the all-gather and are dequantized to the storage dtype by the reorganize; the new tokens
  // keep their fresh, unquantized kv_new (vLLM's semantics).
  DenseRoute(Device& device, Communicator& comm, const ModelDims& model, float scale,
             KvLayout layout, int rank, MlaProjections& projections, void* workspace)
      : device_(device), comm_(comm), model_(model), scale_(scale), layout_(layout),
        rank_(rank), projections_(projections), workspace_(workspace) {}

  // The plan's prefills (dense route); `tables` rows follow the caller's order.
  absl::Status Prepare(const Plan& plan, const StepTables& tables);
  // out [Tp, Hl, Dv], lse [Tp, Hl] of the plan's prefill tokens. stats may be null.
  absl::Status Run(const KvCacheView& cache, const DenseRouteInputs& in, const RouteOutputs& out,
                   StepStats* stats);

 private:
  // One context chunk as Prepare leaves it: where its index arrays start in the uploaded
  // buffers, and its sizes.
  struct ChunkSteps {
    int64_t slots_offset = 0, index_offset = 0, cu_k_offset = 0;
    int64_t num_keys = 0;
    int max_keys = 0;
    double flops = 0;
  };
  // Keys of one context chunk, up-projected: kv [num_keys, Hl, Dr + Dn + Dv] (UpProject's
  // layout). One chunk (fused_): kv [num_keys + Tp, ...], every prefill's context keys then its
  // new tokens' keys from new_rows (the fresh latent rows), and UpProject also does `also`.
  absl::Status ChunkKeys(const KvCacheView& cache, const ChunkSteps& chunk, void* kv,
                         StepStats* stats, const void* new_rows = nullptr,
                         absl::Span<const RowCopy> also = {});
  // Device::PrepareDenseMha for every DenseMha call of the step (Prepare's last step).
  absl::Status PrepareAttention();
  // The one-chunk case's maps (Prepare): `reorganize` and `cu_k`, the chunk's, become the
  // [context | new] ones; the new tokens' rows go to new_rows_index_.
  absl::Status PrepareFused(const ContextChunk& chunk, std::vector<int32_t>& reorganize,
                            std::vector<int32_t>& cu_k);
  // DenseMha's parameters of the prefills' queries q (strides of q, the kv buffers and out).
  DenseMhaParams QueryParams(const void* q) const;
  // QueryParams' `p` with the keys of one DenseMha call of the step (sizes, cu_seqlens,
  // causality; Run sets the buffers): the fused [context | new] keys, the new tokens' own, or
  // one context chunk's. Prepare and Run build their calls alike through these.
  DenseMhaParams FusedAttention(DenseMhaParams p) const;
  DenseMhaParams NewTokenAttention(DenseMhaParams p) const;
  DenseMhaParams ChunkAttention(DenseMhaParams p, const ChunkSteps& chunk) const;
  // One attention launch over [context | new] for the one-chunk case (see the top).
  absl::Status RunFused(const KvCacheView& cache, const DenseRouteInputs& in,
                        const RouteOutputs& outputs, void* q,
                        absl::Span<const RowCopy> query_copies, StepStats* stats);

  Device& device_;
  Communicator& comm_;
  ModelDims model_;
  float scale_;
  KvLayout layout_;
  int rank_;
  MlaProjections& projections_;
  void* workspace_;
  // The step.
  int64_t num_tokens_ = 0;  // Tp
  int num_prefills_ = 0, max_query_len_ = 0;
  int64_t local_rows_ = 0, max_chunk_keys_ = 0;
  double causal_flops_ = 0;
  std::vector<ChunkSteps> chunks_;
  // One chunk: its reorganize map covers [num_keys + Tp] rows (-1, a zero row, where the new
  // tokens go), new_rows_index_ places the Tp fresh rows, cu_seqlens_k_ is per prefill
  // [context | new], max_fused_keys_ the longest.
  bool fused_ = false;
  int max_fused_keys_ = 0;
  ScratchBuffer new_rows_index_;
  // Host copies of the cu_seqlens arrays (the kernels check them without a copy back).
  std::vector<int32_t> cu_q_host_, cu_k_host_;
  ScratchBuffer cu_seqlens_q_, local_slots_, reorganize_index_, cu_seqlens_k_;
  ScratchBuffer q_, kv_new_;
  ScratchBuffer out_new_, lse_new_, out_context_, lse_context_, out_chunk_, lse_chunk_;
  ScratchBuffer chunk_rows_, kv_chunk_;
};

}  // namespace dcp
