#include "attention/cpu/attention_tile.h"

#include <algorithm>

#include "attention/cpu/cpu_kernel_utils.h"

namespace dcp::cpu::internal {

AttentionTile::AttentionTile(int max_queries, int qk_dim, int v_dim)
    : max_queries_(max_queries),
      qk_dim_(qk_dim),
      v_dim_(v_dim),
      q_packed_(PackedASize(max_queries, qk_dim)),
      k_packed_(PackedBSize(qk_dim, kKeyBlock)),
      v_packed_(PackedBSize(kKeyBlock, v_dim)),
      p_packed_(PackedASize(max_queries, kKeyBlock)),
      scores_(int64_t{max_queries} * kKeyBlock),
      row_max_(max_queries),
      row_sum_(max_queries),
      out_(int64_t{max_queries} * v_dim) {}

void AttentionTile::Reset(int num_queries) {
  num_queries_ = std::min(num_queries, max_queries_);
  std::fill(row_max_.begin(), row_max_.begin() + num_queries_, kNegInf);
  std::fill(row_sum_.begin(), row_sum_.begin() + num_queries_, 0.0f);
  std::fill(out_.begin(), out_.begin() + int64_t{num_queries_} * v_dim_, 0.0f);
}

void AttentionTile::AddKeyBlock(int num_keys, const int* visible, float scale) {
  if (num_keys <= 0) return;
  float* scores = scores_.data();
  MultiplyPacked(num_queries_, num_keys, qk_dim_, q_packed_.data(), k_packed_.data(),
                 [&](int i0, int j0, int rows, int cols, const float* tile) {
                   for (int r = 0; r < rows; ++r) {
                     std::copy(tile + r * kPanelCols, tile + r * kPanelCols + cols,
                               scores + int64_t{i0 + r} * kKeyBlock + j0);
                   }
                 });
  SoftmaxBlockUpdate(num_queries_, num_keys, kKeyBlock, visible, scale, scores, row_max_.data(),
                     row_sum_.data(), out_.data(), v_dim_);
  PackA(num_queries_, num_keys,
        [&](int i, int j) { return scores[int64_t{i} * kKeyBlock + j]; }, p_packed_.data());
  float* out = out_.data();
  MultiplyPacked(num_queries_, v_dim_, num_keys, p_packed_.data(), v_packed_.data(),
                 [&](int i0, int j0, int rows, int cols, const float* tile) {
                   for (int r = 0; r < rows; ++r) {
                     float* dst = out + int64_t{i0 + r} * v_dim_ + j0;
                     const float* src = tile + r * kPanelCols;
                     for (int c = 0; c < cols; ++c) dst[c] += src[c];
                   }
                 });
}

DCP_CPU_MULTIVERSION
void SoftmaxBlockUpdate(int nq, int num_keys, int64_t ld_s, const int* visible, float scale,
                        float* s, float* row_max, float* row_sum, float* out, int v_dim) {
  for (int i = 0; i < nq; ++i) {
    float* row = s + i * ld_s;
    const int seen = visible == nullptr ? num_keys : std::clamp(visible[i], 0, num_keys);
    float block_max = kNegInf;
    for (int j = 0; j < seen; ++j) {
      row[j] *= scale;
      block_max = std::max(block_max, row[j]);
    }
    const float new_max = std::max(row_max[i], block_max);
    if (new_max == kNegInf) {  // nothing seen yet: p = 0, state unchanged
      std::fill(row, row + num_keys, 0.0f);
      continue;
    }
    for (int j = 0; j < seen; ++j) row[j] = FastExp(row[j] - new_max);  // vectorizes
    float sum = 0.0f;
    for (int j = 0; j < seen; ++j) sum += row[j];
    std::fill(row + seen, row + num_keys, 0.0f);
    const float correction = FastExp(row_max[i] - new_max);  // 0 when the old max was -inf
    row_sum[i] = row_sum[i] * correction + sum;
    row_max[i] = new_max;
    if (correction != 1.0f) {
      float* acc = out + int64_t{i} * v_dim;
      for (int c = 0; c < v_dim; ++c) acc[c] *= correction;
    }
  }
}

}  // namespace dcp::cpu::internal
