// The per-rank worker behind DcpContext: owns the rank's KV cache (block tables on the host,
// rows on its Device), its heads' weights and the workspace, and runs each batch's plan.
//
// Per batch (DESIGN.md sections 4-7):
//   validate (every rank; the top-k on the device, each rank a share of its rows; agreed)
//   -> plan (rank 0, broadcast, checked) -> write owned new tokens
//   -> sparse MQA for the MQA tokens: absorb q, all-gather q' over heads, top-k positions ->
//      local slots, local sparse MQA per source rank's heads, combine (ag_rs | a2a), w_uv
//   -> dense MHA for the prefills (dense route): per context chunk gather local rows,
//      all-gather, reorganize, up-project, non-causal attention, merge; new tokens causal; merge
//   -> outputs back in the caller's token order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "collectives/communicator.h"
#include "runtime/block_tables.h"
#include "runtime/dcp.h"
#include "runtime/device.h"
#include "runtime/plan.h"
#include "runtime/planner.h"

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
  // Scratch buffers, grown on demand and reused across batches.
  enum Scratch : int {
    // inputs: staged in the storage dtype (caller order), then in execution order
    kKvNew, kCacheSlots, kQNope, kQRope, kTopk, kTopkCheckPosition, kPerm, kQNopeExec,
    kQRopeExec, kKvNewExec, kTopkExec,
    // sparse MQA
    kSlots, kTokenRequest, kTokenPosition, kBlockTables, kQLatent, kQAll, kPartial, kLsePartial,
    kQHeads, kOutHeads, kLseHeads, kLseAll, kLseTotal, kReceived, kLseReceived, kCombined, kOLatStorage,
    // dense MHA
    kQDense, kKNew, kVNew, kOutNew, kLseNew, kOutCtx, kLseCtx, kOutChunk, kLseChunk,
    kRopeIndex, kLocalSlots, kChunkIndex, kChunkRows, kKChunk, kVChunk, kCuSeqlensQ, kCuSeqlensK,
    // outputs
    kOutExec, kLseExec, kOutCaller, kLseCaller, kNumScratch
  };

  Worker(const DcpOptions& options, Communicator& comm, Device& device);

  absl::StatusOr<void*> scratch(Scratch which, size_t bytes);
  template <typename T>
  absl::StatusOr<T*> upload(Scratch which, const std::vector<T>& values);
  // A device copy of `view` converted to `dtype`, `count` elements.
  absl::StatusOr<void*> stage(Scratch which, const TensorView& view, DType dtype);

  // Shapes, dtypes and the batch against the cache; the top-k contents are StageTopk's.
  absl::Status ValidateInputs(absl::Span<const BatchRequest> batch, const BatchInputs& inputs,
                              const BatchOutputs& outputs);
  // Stages the top-k (caller order) into scratch kTopk and, with attention.validate_topk,
  // checks this rank's share of its rows on the device: rank r of W takes rows
  // [r*T/W, (r+1)*T/W) of the T (every rank holds the same top-k). The caller agrees on the
  // result before anything reads the top-k.
  absl::Status StageTopk(absl::Span<const BatchRequest> batch, const TensorView& topk);
  absl::Status WriteNewTokens(const Plan& plan, const void* kv_new);
  // One GEMM per head of this rank, batched over the heads: C[h] [m, n] = A[h] [m, k] @ W[h],
  // W[h] the head's weight matrix (stored [k, n], or [n, k] and transposed when trans_weights).
  // A[h] starts at a + h * stride_a, C[h] at c + h * stride_c (elements); A and the weights are
  // in the storage dtype.
  struct HeadGemmArgs {
    const void* a;
    int64_t lda, stride_a;
    const void* weights;  // [Hl, k, n] (or [Hl, n, k] with trans_weights)
    bool trans_weights;
    void* c;
    DType c_dtype;
    int64_t ldc, stride_c;
    int64_t m;
    int n, k;
  };
  absl::Status HeadGemm(const HeadGemmArgs& args);
  // Up-projects rows [n, R + Dr] of the latent cache into k [n, Hl, Dn + Dr] and v [n, Hl, Dv].
  absl::Status UpProject(const void* rows, int64_t n, void* k, void* v);
  absl::Status RunSparseMqa(const Plan& plan, const BatchInputs& inputs, const void* q_nope,
                            const void* q_rope, int64_t num_tokens, float* out, float* lse);
  absl::Status RunDenseMha(const Plan& plan, const void* q_nope, const void* q_rope,
                           const void* kv_new, float* out, float* lse);

  DcpOptions options_;
  Communicator& comm_;
  Device& device_;
  int heads_ = 0;  // H/W, this rank's heads
  int width_ = 0;  // R + Dr
  DType storage_ = DType::kF32;
  size_t element_ = 4;
  float scale_ = 1.0f;
  KvLayout layout_;
  PlannerConfig planner_;
  std::unique_ptr<BlockTables> tables_;
  Buffer cache_;  // [num_slots, R + Dr] of storage_
  int64_t num_slots_ = 0;
  Buffer w_uk_;   // [Hl, Dn, R] of storage_
  Buffer w_uv_;   // [Hl, R, Dv] of storage_
  Buffer workspace_;  // [S + S/W, R + Dr] of storage_: local gather region, then all-gather
  absl::flat_hash_map<int64_t, int64_t> cached_;  // request id -> cached tokens
  std::vector<Buffer> scratch_;
  ForwardStats stats_;
  bool damage_next_plan_ = false;
  int64_t broadcast_rows_ = 0;  // rows the k_pe broadcast index (kRopeIndex: i / Hl) covers
};

}  // namespace dcp
