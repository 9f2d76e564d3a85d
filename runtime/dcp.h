// The public API an inference engine embeds: one DcpContext per rank of a DCP group, created
// from the configs, a Communicator and the rank's Device. No file formats, no MPI types.
//
//   auto ctx = dcp::DcpContext::Create(options, comm, device, weights);   // every rank
//   ctx->AddRequest(id);                           // same calls, same order, on every rank
//   ctx->Forward(batch, inputs, outputs);           // one attention layer for the batch
//   ctx->ForkRequest(id, from, n);                 // prefix caching: share from's first n tokens
//   ctx->TruncateRequest(id, n);                   // speculative decoding: drop rejected drafts
//   ctx->FreeRequest(id);
//
// Every call is collective: all ranks make it with the same batch description (request ids,
// seq_lens, query_lens, in the same order). A call that fails on any rank fails on every rank
// with the same error, so no rank is left waiting in a collective. Ranks that make different
// calls are the caller's bug and not detected as such: the agreements carry statuses, not the
// call, so two different calls can pair up (one rank's Forward then times out waiting for its
// peers' collectives). A failed call gives back the blocks it took (a Forward refused for want
// of blocks, a LoadCachedKv that failed after dropping the old rows, which leaves the request
// with nothing cached).
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
#include "runtime/forward_stats.h"
#include "runtime/layer_io.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace dcp {

class Worker;

// One request's cached rows for DcpContext::LoadCachedKv over many requests.
struct CachedKv {
  int64_t request_id = 0;
  int64_t num_tokens = 0;  // cached tokens of the request
  TensorView local_rows;   // [local_length(num_tokens, rank), R + Dr], this rank's rows
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
  // Speculative decoding's rollback: keeps the request's first num_tokens cached tokens
  // (0 <= num_tokens <= cached) and drops the rest (the drafts the engine rejected); the next
  // Forward gives the request seq_len - query_len == num_tokens. Blocks past the kept tokens go
  // back to the pool. A request shorter than num_tokens, or not registered: InvalidArgument.
  absl::Status TruncateRequest(int64_t request_id, int64_t num_tokens);
  // Prefix caching: registers request_id holding from_id's first num_tokens cached tokens
  // without copying them (the blocks are shared until both requests free them). num_tokens
  // must be a multiple of block_size x world size (whole blocks on every rank) and at most
  // from_id's cached tokens. Either request may then run, truncate (not into a shared block:
  // InvalidArgument) or be freed independently.
  absl::Status ForkRequest(int64_t request_id, int64_t from_id, int64_t num_tokens);
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
