#include "launch/synthetic.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace dcp::launch {
namespace {

// Streams: one per tensor; batch-dependent tensors add the batch number above bit 8.
enum Stream : int {
  kQNope = 1,
  kQRope = 2,
  kKvC = 3,
  kKPe = 4,
  kWUk = 5,
  kWUv = 6,
  kIndexProjQ = 7,
  kIndexProjK = 8,
};

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Offsets of each request's first token and first sequence row in the batch.
struct Offsets {
  std::vector<int64_t> token, row;
};

Offsets OffsetsOf(const std::vector<RequestShape>& requests) {
  Offsets offsets;
  int64_t token = 0, row = 0;
  for (const RequestShape& r : requests) {
    offsets.token.push_back(token);
    offsets.row.push_back(row);
    token += r.query_len;
    row += r.seq_len;
  }
  return offsets;
}

}  // namespace

float SyntheticWorkload::Value(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t bits = SplitMix64(SplitMix64(seed ^ (stream * 0xd1b54a32d192ed03ull)) ^ index);
  // 24 random bits -> [-1, 1).
  return static_cast<float>(static_cast<int64_t>(bits >> 40) - (1 << 23)) / float(1 << 23);
}

SyntheticWorkload::SyntheticWorkload(const ModelDims& model, int index_topk, uint64_t seed)
    : model_(model), index_topk_(index_topk), seed_(seed) {}

float SyntheticWorkload::At(int batch_index, int tensor, uint64_t index) const {
  return Value(seed_, (uint64_t(batch_index) << 8) | uint64_t(tensor), index);
}

RankWeights SyntheticWorkload::Weights(const RankView& view) const {
  const int64_t dn = model_.qk_nope_head_dim, r = model_.kv_lora_rank, dv = model_.v_head_dim;
  // Scaled by 1/sqrt(fan-in) so projected keys and values stay O(1).
  const float uk_scale = 1.0f / std::sqrt(float(r)), uv_scale = 1.0f / std::sqrt(float(r));
  RankWeights weights;
  weights.w_uk.resize(size_t(view.num_heads()) * dn * r);
  weights.w_uv.resize(size_t(view.num_heads()) * r * dv);
  for (int h = view.head_begin; h < view.head_end; ++h) {
    const int64_t local = h - view.head_begin;
    for (int64_t i = 0; i < dn * r; ++i) {
      weights.w_uk[local * dn * r + i] = uk_scale * Value(seed_, kWUk, uint64_t(h * dn * r + i));
    }
    for (int64_t i = 0; i < r * dv; ++i) {
      weights.w_uv[local * r * dv + i] = uv_scale * Value(seed_, kWUv, uint64_t(h * r * dv + i));
    }
  }
  return weights;
}

RankBatch SyntheticWorkload::Batch(const std::vector<RequestShape>& requests, int batch_index,
                                   int64_t first_request_id, const RankView& view) const {
  const int64_t heads = model_.num_heads, dn = model_.qk_nope_head_dim,
                dr = model_.qk_rope_head_dim, r = model_.kv_lora_rank;
  const int64_t width = model_.latent_width(), local_heads = view.num_heads();
  const Offsets offsets = OffsetsOf(requests);
  // Row `row` of the batch's sequences, [kv_c | k_pe].
  const auto fill_row = [&](int64_t row, float* out) {
    for (int64_t c = 0; c < r; ++c) out[c] = At(batch_index, kKvC, uint64_t(row * r + c));
    for (int64_t c = 0; c < dr; ++c) out[r + c] = At(batch_index, kKPe, uint64_t(row * dr + c));
  };

  RankBatch batch;
  int64_t tokens = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    batch.requests.push_back(
        BatchRequest{first_request_id + int64_t(i), requests[i].seq_len, requests[i].query_len});
    tokens += requests[i].query_len;
  }
  batch.q_nope.resize(size_t(tokens * local_heads * dn));
  batch.q_rope.resize(size_t(tokens * local_heads * dr));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = view.head_begin; h < view.head_end; ++h) {
      const int64_t local = t * local_heads + (h - view.head_begin);
      for (int64_t d = 0; d < dn; ++d) {
        batch.q_nope[local * dn + d] = At(batch_index, kQNope, uint64_t((t * heads + h) * dn + d));
      }
      for (int64_t d = 0; d < dr; ++d) {
        batch.q_rope[local * dr + d] = At(batch_index, kQRope, uint64_t((t * heads + h) * dr + d));
      }
    }
  }

  batch.kv_new.resize(size_t(tokens * width));
  batch.cached_rows.resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const int64_t context = requests[i].seq_len - requests[i].query_len;
    for (int64_t k = 0; k < requests[i].query_len; ++k) {
      fill_row(offsets.row[i] + context + k, &batch.kv_new[(offsets.token[i] + k) * width]);
    }
    const int64_t local_rows = view.layout.local_length(context, view.rank);
    std::vector<float>& rows = batch.cached_rows[i];
    rows.resize(size_t(local_rows * width));
    for (int64_t j = 0; j < local_rows; ++j) {
      fill_row(offsets.row[i] + view.layout.global_index(j, view.rank), &rows[j * width]);
    }
  }
  batch.topk = TopK(requests, batch_index);
  batch.topk_width = index_topk_;
  return batch;
}

std::vector<int32_t> SyntheticWorkload::TopK(const std::vector<RequestShape>& requests,
                                             int batch_index) const {
  const int64_t k_width = index_topk_, dn = model_.qk_nope_head_dim, r = model_.kv_lora_rank,
                heads = model_.num_heads;
  const Offsets offsets = OffsetsOf(requests);
  int64_t tokens = 0;
  for (const RequestShape& request : requests) tokens += request.query_len;
  std::vector<int32_t> topk(size_t(tokens * k_width), -1);

  // The indexer's random projections: [R, kIndexDim] for keys, [Dn, kIndexDim] for queries.
  std::vector<float> projection_k(size_t(r * kIndexDim)), projection_q(size_t(dn * kIndexDim));
  for (size_t i = 0; i < projection_k.size(); ++i) projection_k[i] = Value(seed_, kIndexProjK, i);
  for (size_t i = 0; i < projection_q.size(); ++i) projection_q[i] = Value(seed_, kIndexProjQ, i);
  std::vector<float> index_keys, scores;
  std::vector<int32_t> order;
  for (size_t i = 0; i < requests.size(); ++i) {
    const int64_t seq_len = requests[i].seq_len, query_len = requests[i].query_len;
    const int64_t context = seq_len - query_len;
    if (seq_len > k_width) {
      // Index keys of every position: projection of kv_c onto kIndexDim random directions.
      index_keys.assign(size_t(seq_len * kIndexDim), 0.0f);
      for (int64_t j = 0; j < seq_len; ++j) {
        const int64_t row = offsets.row[i] + j;
        for (int64_t c = 0; c < r; ++c) {
          const float value = At(batch_index, kKvC, uint64_t(row * r + c));
          for (int e = 0; e < kIndexDim; ++e) {
            index_keys[j * kIndexDim + e] += value * projection_k[c * kIndexDim + e];
          }
        }
      }
    }
    for (int64_t k = 0; k < query_len; ++k) {
      const int64_t t = offsets.token[i] + k, position = context + k;
      int32_t* row = &topk[size_t(t * k_width)];
      if (position + 1 <= k_width) {
        std::iota(row, row + position + 1, 0);
        continue;
      }
      float index_query[kIndexDim] = {};
      for (int64_t d = 0; d < dn; ++d) {
        const float value = At(batch_index, kQNope, uint64_t((t * heads + 0) * dn + d));
        for (int e = 0; e < kIndexDim; ++e) {
          index_query[e] += value * projection_q[d * kIndexDim + e];
        }
      }
      scores.resize(size_t(position));
      order.resize(size_t(position));
      for (int64_t j = 0; j < position; ++j) {
        float score = 0.0f;
        for (int e = 0; e < kIndexDim; ++e) score += index_query[e] * index_keys[j * kIndexDim + e];
        scores[j] = score;
        order[j] = int32_t(j);
      }
      const auto better = [&](int32_t a, int32_t b) {
        return scores[a] != scores[b] ? scores[a] > scores[b] : a < b;
      };
      std::nth_element(order.begin(), order.begin() + (k_width - 1), order.end(), better);
      std::sort(order.begin(), order.begin() + (k_width - 1));
      std::copy(order.begin(), order.begin() + (k_width - 1), row);
      row[k_width - 1] = int32_t(position);  // the newest token is always kept
    }
  }
  return topk;
}

}  // namespace dcp::launch
