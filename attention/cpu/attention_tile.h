// Flash-style attention of a tile of queries over key blocks, the shared core of DenseMha
// (queries = one head's query block) and SparseMqa (queries = a token's heads). The caller
// packs Q once and each key block's K^T and V into the tile's buffers (packed_gemm.h layouts);
// AddKeyBlock computes the scores, the online-softmax update (running max, so logits of any
// size are safe) and the P @ V accumulation, all in fp32.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attention/cpu/packed_gemm.h"

namespace dcp::cpu::internal {

inline constexpr int kKeyBlock = 64;  // keys per block: K^T (576 x 64) and V stay in L2

class AttentionTile {
 public:
  // Sizes the buffers for up to max_queries queries of width qk_dim and values of width v_dim.
  AttentionTile(int max_queries, int qk_dim, int v_dim);

  // Starts num_queries fresh queries (max -inf, sum 0, out 0); Q must be packed after this.
  void Reset(int num_queries);

  float* q_packed() { return q_packed_.data(); }  // PackedASize(num_queries, qk_dim)
  float* k_packed() { return k_packed_.data(); }  // PackedBSize(qk_dim, kKeyBlock): K^T
  float* v_packed() { return v_packed_.data(); }  // PackedBSize(kKeyBlock, v_dim)

  // Adds a block of num_keys <= kKeyBlock keys. visible: per query, how many leading keys of
  // the block it sees (the causal mask); null = all.
  void AddKeyBlock(int num_keys, const int* visible, float scale);

  // out_row(i) -> float* of v_dim; writes out = sum p_j v_j / sum p_j and lse = max + log(sum),
  // or 0 and -inf for a query that saw no key.
  template <typename OutRow, typename WriteLse>
  void Finish(OutRow&& out_row, WriteLse&& write_lse) const;

 private:
  int max_queries_, qk_dim_, v_dim_, num_queries_ = 0;
  std::vector<float> q_packed_, k_packed_, v_packed_, p_packed_;
  std::vector<float> scores_;               // [max_queries][kKeyBlock]
  std::vector<float> row_max_, row_sum_;    // [max_queries], row_max in scaled-logit units
  std::vector<float> out_;                  // [max_queries][v_dim], unnormalized
};

// One query block's online-softmax step over scores s[nq][ld_s] (raw q.k): masks keys past
// visible[i], turns s into p = e^(scale*s - new_max), rescales the running sum and the
// unnormalized out rows [nq][v_dim] by e^(old_max - new_max).
void SoftmaxBlockUpdate(int nq, int num_keys, int64_t ld_s, const int* visible, float scale,
                        float* s, float* row_max, float* row_sum, float* out, int v_dim);

template <typename OutRow, typename WriteLse>
void AttentionTile::Finish(OutRow&& out_row, WriteLse&& write_lse) const {
  for (int i = 0; i < num_queries_; ++i) {
    float* dst = out_row(i);
    const float sum = row_sum_[i];
    const float* acc = out_.data() + int64_t{i} * v_dim_;
    if (sum > 0.0f) {
      const float inv = 1.0f / sum;
      for (int c = 0; c < v_dim_; ++c) dst[c] = acc[c] * inv;
      write_lse(i, row_max_[i] + std::log(sum));
    } else {
      for (int c = 0; c < v_dim_; ++c) dst[c] = 0.0f;
      write_lse(i, -std::numeric_limits<float>::infinity());
    }
  }
}

}  // namespace dcp::cpu::internal
