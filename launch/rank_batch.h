// What one rank feeds its DcpContext: the layer weights of its heads and, per batch, the
// queries of its heads, every new token's KV, the top-k indices and the cached rows it owns.
// Built by the synthetic generator (each rank its own shard) or sliced from a problem file
// on rank 0 and scattered. A "whole" view (world 1, every head) feeds the single-rank reference.
#pragma once

#include <cstdint>
#include <vector>

#include "launch/batch_spec.h"
#include "runtime/config.h"
#include "runtime/dcp.h"
#include "core/kv_layout.h"

namespace dcp::launch {

// Which part of the problem one rank holds.
struct RankView {
  KvLayout layout;  // world_size, interleave
  int rank = 0;
  int head_begin = 0, head_end = 0;  // [head_begin, head_end) of H

  int num_heads() const { return head_end - head_begin; }
  // Rank r of a group of `world_size` over `model.num_heads` heads.
  static RankView Of(const ModelDims& model, int world_size, int interleave, int rank);
};

struct RankWeights {
  std::vector<float> w_uk;  // [Hl, Dn, R]
  std::vector<float> w_uv;  // [Hl, R, Dv]
};

struct RankBatch {
  std::vector<BatchRequest> requests;  // the caller's order (file or spec order)
  std::vector<float> q_nope;           // [T, Hl, Dn]
  std::vector<float> q_rope;           // [T, Hl, Dr]
  std::vector<float> kv_new;           // [T, R + Dr] rows [kv_c | k_pe] of the new tokens
  std::vector<int32_t> topk;           // [T, topk_width]; empty = every causal position
  int topk_width = 0;
  // Per request: this rank's rows of its seq_len - query_len cached tokens, in local order,
  // [local_length(context), R + Dr].
  std::vector<std::vector<float>> cached_rows;

  int64_t num_tokens() const;
};

// Views of the host vectors for DcpContext (host memory, F32 / I32).
LayerWeights WeightViews(const RankWeights& weights, const ModelDims& model, int num_heads);
BatchInputs InputViews(const RankBatch& batch, const ModelDims& model, int num_heads);

// Every request's shape, in order.
std::vector<RequestShape> ShapesOf(const RankBatch& batch);

}  // namespace dcp::launch
