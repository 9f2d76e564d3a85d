// Synthetic workloads: every value is a pure function of (seed, tensor, global index), so each
// rank builds exactly its shard (its heads, the cached rows it owns) and the single-rank
// reference builds the whole, with no scatter code in between.
//
// Top-k indices: every causal position when seq_len <= K; otherwise a deterministic indexer
// picks them: index queries and keys are a small random projection (kIndexDim wide) of the
// token's first-head q_nope and of each position's kv_c; a token keeps its newest position
// (itself) and the K - 1 best-scoring earlier ones (ties to the lower position). Identical on
// every rank.
#pragma once

#include <cstdint>
#include <vector>

#include "launch/batch_spec.h"
#include "launch/rank_batch.h"
#include "runtime/config.h"

namespace dcp::launch {

class SyntheticWorkload {
 public:
  static constexpr int kIndexDim = 16;

  // index_topk: K, the width of the top-k rows.
  SyntheticWorkload(const ModelDims& model, int index_topk, uint64_t seed);

  RankWeights Weights(const RankView& view) const;
  // Batch number `batch_index` of a run (values differ between batches); request ids are
  // first_request_id + i.
  RankBatch Batch(const std::vector<RequestShape>& requests, int batch_index,
                  int64_t first_request_id, const RankView& view) const;

  // The top-k rows of the whole batch, [T, K], as every rank computes them.
  std::vector<int32_t> TopK(const std::vector<RequestShape>& requests, int batch_index) const;

  // One generated value in [-1, 1): the generator every tensor is made of.
  static float Value(uint64_t seed, uint64_t stream, uint64_t index);

 private:
  float At(int batch_index, int tensor, uint64_t index) const;

  ModelDims model_;
  int index_topk_;
  uint64_t seed_;
};

}  // namespace dcp::launch
