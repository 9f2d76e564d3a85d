// The per-layer engine API (DESIGN.md section 10): plan once per step, run every layer on the
// engine's stream over the engine's paged KV cache.
//
//   auto engine = dcp::DcpEngine::Create(options, comm, device);        // once per rank
//   per step:  engine->Plan(batch, tables);        // host, collective: rank 0 plans, every
//                                                  // rank checks; metadata uploaded once
//   per layer: engine->Run(weights, cache, inputs, outputs, stream);   // launches only
//
// Plan is collective (every rank, same batch) and may allocate and exchange host messages: three
// host collectives at W > 1 (ExchangePlan, runtime/planner.h), none at W = 1. Run
// enqueues kernels and collectives on `stream` and returns: no host synchronisation, no
// allocation, no host collective (unless stats are on: their marks are read on the host at
// the layer's end, so a stats Run cannot be captured). Exception: a dense step through cuDNN
// builds a graph and may grow cuDNN's scratch the first time it meets a shape bucket (run
// such a step eagerly before capturing one like it). A step's plan stays valid until the next
// Plan; every layer of the step runs against it.
//
// CUDA graphs. A graph captured from Run is bound to the plan it was captured under: Plan
// rewrites the step's device metadata in place and sizes the scratch for its own step, while
// the graph keeps the capture's launch parameters (request and block-table extents, split
// counts) and buffer addresses. Replay it only until the next Plan, then capture again (an
// engine that replays one graph across steps needs a plan of fixed capacities; not built).
//
// Streams. Plan enqueues its metadata upload on the stream last bound (the device's own if
// none): bind another (or nullptr) before destroying that stream. Run's first kernels read the
// layer's weights before waiting for earlier work on the stream (programmatic dependent
// launch): weights must be written before the kernel that precedes Run on the stream starts.
//
// Errors. Plan's errors (bad batch, bad tables, tables that put a new token on a slot the step
// reads as context or that another new token writes, ranks that differ in the batch or the top-k
// width, ranks created with different options: SettingsFingerprint, config.h) come back on
// every rank. Run checks its arguments on the host (dtypes, the cache
// against the plan, the alignment the device's kernels need of the cache and a BF16 out, outputs
// that overlap its inputs or the cache) and returns InvalidArgument
// before enqueueing anything, this rank's cache untouched. Run takes no host collective, so such
// an error is this rank's alone: a caller that passes one rank a different cache view than the
// others gets InvalidArgument there while its peers, whose caches are already written, wait in
// the layer's first collective and see DeadlineExceeded after dcp.comm_timeout_s. A collective
// that fails or times out surfaces through the communicator (collectives/communicator.h): that
// rank's Run returns the error and its peers see it as DeadlineExceeded after
// dcp.comm_timeout_s, or as the communicator's error on their next call.
//
// What Run trusts (device data it cannot see without a wait): the layer tensors hold the planned
// step's T tokens (LayerTensors carries pointers, not shapes), and the top-k rows are what an
// indexer writes: request-local positions in [0, seq_len) that the token may see, or -1. An entry
// outside [0, seq_len) is skipped like -1 and a repeated one counts once per occurrence; nothing
// is checked here (DcpContext checks the rows a step reads, attention.validate_topk).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "collectives/communicator.h"
#include "runtime/batch.h"
#include "runtime/config.h"
#include "runtime/dense_route.h"
#include "runtime/device.h"
#include "runtime/forward_stats.h"
#include "runtime/kv_cache.h"
#include "runtime/layer_io.h"
#include "runtime/mla_projections.h"
#include "runtime/plan.h"
#include "runtime/planner.h"
#include "runtime/scratch.h"
#include "runtime/sparse_route.h"
#include "runtime/step.h"

namespace dcp {

// Weights of one layer for Run: device memory in the rank's storage dtype.
struct LayerWeightsView {
  const void* w_uk = nullptr;  // [H/W, Dn, R]
  const void* w_uv = nullptr;  // [H/W, R, Dv]
  // Optional: the same weights as vLLM's kv_b_proj.weight holds them ([H (Dn + Dv), R], out x
  // in), this rank's heads: [H/W, Dn + Dv, R], per head rows [0, Dn) = w_uk[h] and rows
  // [Dn, Dn + Dv) = w_uv[h]^T (MlaProjections::CombineKvB builds it). When set, the dense
  // route's up-projection is one GEMM instead of two.
  const void* w_kv_b = nullptr;
};

// One layer's tensors for Run, in the batch's (caller) token order, device memory:
struct LayerTensors {
  const void* q_nope = nullptr;  // [T, H/W, Dn] storage dtype
  const void* q_rope = nullptr;  // [T, H/W, Dr] storage dtype
  const void* kv_new = nullptr;  // [T, R + Dr] storage dtype, the same on every rank (CUDA
                                 // ranks with fp8_ds_mla rows: 16-byte aligned)
  const int32_t* topk = nullptr; // [T, K] request-local positions, -1 = none; nullptr iff the
                                 // step was planned with topk_width 0 (every causal key)
  void* out = nullptr;           // [T, H/W, Dv] of out_dtype
  float* lse = nullptr;          // [T, H/W] F32, natural log, -inf where no key was selected
  // F32, or BF16 (each value rounded once from the fp32 result; an engine's next op usually
  // reads bf16, and the dense route's cuDNN prefill then writes the caller's buffer itself).
  DType out_dtype = DType::kF32;
};

class DcpEngine {
 public:
  // Refuses options the device cannot run: a prefill backend it lacks (explicitly asked for),
  // and a model whose latent rows its sparse MQA kernels are not built for (CUDA ranks: R + Dr
  // = 576, R = 512), since every decode takes that route.
  static absl::StatusOr<std::unique_ptr<DcpEngine>> Create(const DcpOptions& options,
                                                           Communicator& comm, Device& device);

  // Plans a step: `batch` (caller order; the token order of every layer's tensors), this
  // rank's block tables (rows in batch order), and the layers' top-k width (0: no top-k, every
  // causal key, which needs every seq_len <= index_topk). Collective.
  absl::Status Plan(absl::Span<const BatchRequest> batch, const StepTables& tables,
                    int topk_width);
  // Runs one layer of the planned step: writes the new tokens this rank owns into `cache`,
  // attention by the planned route, outputs for this rank's heads. `stream` is the CUDA stream
  // (cudaStream_t) to enqueue on; nullptr = the device's own, with collectives that complete
  // on the host. A stream other than the last one is bound first (BindStream), which must not
  // happen during a graph capture: run once eagerly on the stream before capturing.
  absl::Status Run(const LayerWeightsView& weights, const KvCacheView& cache,
                   const LayerTensors& tensors, void* stream = nullptr);
  // Binds the device and the communicator to `stream` (collectives then complete in stream
  // order: no host wait, capturable). Not during a capture. If the communicator refuses the
  // stream, the device goes back to the stream bound before and the error is returned.
  absl::Status BindStream(void* stream);

  // With stats on, Run times its phases with events on the stream, read on the host at the
  // layer's end (one wait a layer; not capturable), into last_stats(); off by default.
  void set_collect_stats(bool on) { collect_stats_ = on; }
  const ForwardStats& last_stats() const { return stats_; }
  // The step of the last successful Plan; empty (no requests) after a failed one.
  const dcp::Plan& plan() const { return plan_; }
  bool dense_mha_available() const { return planner_.dense_mha_available; }
  const PlannerConfig& planner() const { return planner_; }
  int heads() const { return heads_; }
  void DamageNextPlanForTesting() { damage_next_plan_ = true; }

 private:
  DcpEngine(const DcpOptions& options, Communicator& comm, Device& device);
  absl::Status CheckRunArguments(const LayerWeightsView& weights, const KvCacheView& cache,
                                 const LayerTensors& tensors) const;

  DcpOptions options_;
  Communicator& comm_;
  Device& device_;
  int heads_ = 0;
  PlannerConfig planner_;
  MlaProjections projections_;
  Buffer workspace_;  // [S + S/W, R + Dr] of the storage dtype: local region, then all-gather
  std::unique_ptr<SparseRoute> sparse_;
  std::unique_ptr<DenseRoute> dense_;
  // The planned step.
  dcp::Plan plan_;
  bool planned_ = false;
  int topk_width_ = 0;
  bool identity_order_ = false;  // the caller's token order is the execution order
  int64_t min_cache_blocks_ = 0;  // the tables' block count: a layer's cache holds at least
  ScratchBuffer write_slots_, perm_;
  ScratchBuffer q_nope_exec_, q_rope_exec_, kv_new_exec_, topk_exec_, out_exec_, lse_exec_;
  std::vector<int32_t> perm_host_, write_slots_host_;  // Plan's, kept for their capacity
  std::vector<uint8_t> block_marks_;  // Plan's check: a byte per block id up to the largest new
                                      // token's (below 2^22), zero between Plans
  void* bound_stream_ = nullptr;
  bool stream_bound_ = false;
  bool collect_stats_ = false;
  ForwardStats stats_;
  bool damage_next_plan_ = false;
};

}  // namespace dcp
