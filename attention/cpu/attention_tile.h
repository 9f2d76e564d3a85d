// Flash-style attention of a tile of queries over key blocks, the shared core of DenseMha
// (queries = one head's query block) and SparseMqa (queries = a token's heads). The caller
// packs Q^T once per tile and copies each key block's K and V rows into the tile as fp32 rows
// (a sequential copy, so gathered rows and bf16 cost little); AddKeyBlock then computes the
// scores (K rows in place against the Q^T panels), the online-softmax update (running max, so
// logits of any size are safe) and P @ V (P and V rows in place), all in fp32.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "attention/cpu/packed_gemm.h"
#include "core/dtype.h"

namespace dcp::cpu::internal {

inline constexpr int kKeyBlock = 64;  // keys per block: K (64 x 576) and V stay in L2

class AttentionTile {
 public:
  // Sizes the buffers for up to max_queries queries of width qk_dim and values of width v_dim.
  AttentionTile(int max_queries, int qk_dim, int v_dim);

  // Starts num_queries fresh queries (max -inf, sum 0, out 0); Q must be packed after this.
  void Reset(int num_queries);

  // Q^T as B panels: PackBFromColumns(qk_dim, num_queries, query_row, q_packed()).
  float* q_packed() { return q_packed_.data(); }

  // Row j < kKeyBlock of the current key block's keys / values, fp32.
  template <typename T>
  void SetKeyRow(int j, const T* key) {
    CopyRow(key, qk_dim_, keys_.data() + int64_t{j} * qk_dim_);
  }
  template <typename T>
  void SetValueRow(int j, const T* value) {
    CopyRow(value, v_dim_, values_.data() + int64_t{j} * value_stride_);
  }

  // Adds the block of num_keys <= kKeyBlock keys set above. visible: per query, how many leading
  // keys of the block it sees (the causal mask); null = all.
  void AddKeyBlock(int num_keys, const int* visible, float scale);

  // out_row(i) -> float* of v_dim; writes out = sum p_j v_j / sum p_j and lse = max + log(sum),
  // or 0 and -inf for a query that saw no key.
  template <typename OutRow, typename WriteLse>
  void Finish(OutRow&& out_row, WriteLse&& write_lse) const;

 private:
  static void CopyRow(const float* source, int n, float* dest) {
    std::memcpy(dest, source, sizeof(float) * n);
  }
  static void CopyRow(const bf16* source, int n, float* dest) {
    for (int i = 0; i < n; ++i) dest[i] = bf16_to_float(source[i]);
  }

  int max_queries_, qk_dim_, v_dim_, num_queries_ = 0;
  int64_t value_stride_;  // v_dim rounded up to whole register tiles: P @ V reads full tiles
  std::vector<float> q_packed_;
  // Rows past the block (up to a whole register tile) are read but their results dropped; the
  // buffers are zero-initialized so that those reads are of finite values.
  std::vector<float> keys_;    // [kKeyBlock + kPanelRows][qk_dim]
  std::vector<float> values_;  // [kKeyBlock][value_stride]
  std::vector<float> scores_;  // [round_up(max_queries, kPanelRows)][kKeyBlock]: scores, then p
  std::vector<float> row_max_, row_sum_;  // [max_queries], row_max in scaled-logit units
  std::vector<float> out_;                // [max_queries][v_dim], unnormalized
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
