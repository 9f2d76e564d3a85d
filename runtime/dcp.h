// The public API an inference engine embeds: one DcpContext per rank of a DCP group, created
// from the configs, a Communicator and the rank's Device. No file formats, no MPI types.
//
//   auto ctx = dcp::DcpContext::Create(options, comm, device, weights);   // every rank
//   ctx->AddRequest(id);                           // same calls, same order, on every rank
//   ctx->Forward(batch, inputs, outputs);           // one attention layer for the batch
//   ctx->FreeRequest(id);
//
// Every call is collective: all ranks make it with the same batch description (request ids,
// seq_lens, query_lens, in the same order). A call that fails on any rank fails on every rank
// with the same error, so no rank is left waiting in a collective.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "collectives/communicator.h"
#include "runtime/batch.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace dcp {

// A caller-owned tensor: pointer, dtype, shape (row-major, contiguous) and where it lives.
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  MemorySpace memory = MemorySpace::kHost;
  int64_t num_elements() const;
};

struct MutableTensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  MemorySpace memory = MemorySpace::kHost;
  int64_t num_elements() const;
};

class Worker;

// One request's cached rows for DcpContext::LoadCachedKv over many requests.
struct CachedKv {
  int64_t request_id = 0;
  int64_t num_tokens = 0;  // cached tokens of the request
  TensorView local_rows;   // [local_length(num_tokens, rank), R + Dr], this rank's rows
};

struct DcpOptions {
  ModelDims model;
  DcpConfig dcp;  // world_size and rank must match the communicator's
  SchedulerConfig scheduler;
  AttentionConfig attention;
  // Rows S of the chunked-prefill workspace; 0 = the seed's formula (DESIGN.md section 6).
  // Rounded up to lcm(B, W*I). For tests that force several chunks, and for tuning.
  int64_t workspace_rows_override = 0;
};

// The layer's up-projection weights for this rank's heads [rank*H/W, (rank+1)*H/W).
struct LayerWeights {
  TensorView w_uk;  // [H/W, Dn, R]: k_nope[h][j] = w_uk[h] @ kv_c[j]
  TensorView w_uv;  // [H/W, R, Dv]: v[h][j] = w_uv[h]^T @ kv_c[j]
};

// Inputs of one layer for a batch; T = sum of query_lens, tokens in the batch's request order.
struct BatchInputs {
  TensorView q_nope;  // [T, H/W, Dn] this rank's heads
  TensorView q_rope;  // [T, H/W, Dr] RoPE applied
  TensorView kv_new;  // [T, R + Dr] the new tokens' [kv_c | k_pe], identical on every rank
  // [T, K] I32 request-local positions, -1 = none; empty = every causal key. Identical on every
  // rank (the indexer runs replicated): each rank checks only its share of the rows
  // (AttentionConfig::validate_topk) and the ranks agree on the verdict.
  TensorView topk;
};

struct BatchOutputs {
  MutableTensorView out;  // [T, H/W, Dv] F32
  MutableTensorView lse;  // [T, H/W] F32, natural log; -inf where a token selected no key
};

// Wall time of each phase of the last Forward, seconds, and the bytes each collective moved.
struct ForwardStats {
  Route route = Route::kSparseMqa;
  int num_decodes = 0, num_prefills = 0, num_chunks = 0;
  int64_t num_tokens = 0, num_context_rows = 0;
  double plan_s = 0, cache_write_s = 0, gather_s = 0, up_projection_s = 0, attention_s = 0,
         combine_s = 0, total_s = 0;
  // Time inside the collectives alone (within gather_s / combine_s), and the bytes they moved
  // through this rank (sent + received): the all-gathers of q' and of the workspace, and the
  // combine's all-gather/reduce-scatter or all-to-alls.
  double all_gather_comm_s = 0, combine_comm_s = 0;
  int64_t all_gather_bytes = 0, combine_bytes = 0;
  double flops = 0;  // attention + projection FLOPs of this rank
};

class DcpContext {
 public:
  static absl::StatusOr<std::unique_ptr<DcpContext>> Create(const DcpOptions& options,
                                                            Communicator& comm, Device& device,
                                                            const LayerWeights& weights);
  ~DcpContext();

  // Registers a request with no cached tokens.
  absl::Status AddRequest(int64_t request_id);
  absl::Status FreeRequest(int64_t request_id);
  // Places the request's first num_tokens cached tokens, as earlier steps would have left them:
  // local_rows are this rank's rows of them, [local_length(num_tokens, rank), R + Dr] in local
  // order. Replaces whatever was cached.
  absl::Status LoadCachedKv(int64_t request_id, int64_t num_tokens, const TensorView& local_rows);
  // The same three calls for many requests at once, with one agreement across the ranks for
  // the whole batch (the single forms agree once per request). They stop at the first request
  // that fails; that error comes back on every rank.
  absl::Status AddRequests(absl::Span<const int64_t> request_ids);
  absl::Status FreeRequests(absl::Span<const int64_t> request_ids);
  absl::Status LoadCachedKv(absl::Span<const CachedKv> requests);

  // One attention layer: writes the new tokens this rank owns into its cache, plans (rank 0),
  // runs the planned route and writes outputs for this rank's heads. Each request's cached
  // length must equal seq_len - query_len.
  absl::Status Forward(absl::Span<const BatchRequest> batch, const BatchInputs& inputs,
                       const BatchOutputs& outputs);

  // The plan of a batch as rank 0 would make it, as one line of JSON (FORMATS.md plan dump);
  // collective like Forward, nothing is run.
  absl::StatusOr<std::string> PlanJson(absl::Span<const BatchRequest> batch, bool has_topk);

  const ForwardStats& last_stats() const;
  // The prefill route available after start-up resolution (false: sparse MQA only).
  bool dense_mha_available() const;

  // Test hook: damages rank 0's next plan broadcast (the plan-mismatch tests).
  void DamageNextPlanForTesting();

 private:
  explicit DcpContext(std::unique_ptr<Worker> worker);
  std::unique_ptr<Worker> worker_;
};

}  // namespace dcp
