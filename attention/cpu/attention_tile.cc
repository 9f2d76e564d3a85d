#include "attention/cpu/attention_tile.h"

#include <algorithm>

#include "attention/cpu/cpu_kernel_utils.h"

namespace dcp::cpu::internal {

AttentionTile::AttentionTile(int max_queries, int qk_dim, int v_dim)
    : max_queries_(max_queries),
      qk_dim_(qk_dim),
      v_dim_(v_dim),
      value_stride_(RoundUp(v_dim, kPanelCols)),
      q_packed_(PackedBSize(qk_dim, max_queries)),
      keys_(int64_t{kKeyBlock + kPanelRows} * qk_dim, 0.0f),
      values_(int64_t{kKeyBlock} * value_stride_, 0.0f),
      scores_(RoundUp(max_queries, kPanelRows) * kKeyBlock, 0.0f),
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
  alignas(64) float tile[kPanelRows * kPanelCols];
  float* scores = scores_.data();
  // Scores, transposed: tile = K rows (6 keys) @ Q^T panel (16 queries), stored as s[query][key].
  for (int q0 = 0; q0 < num_queries_; q0 += kPanelCols) {
    const float* q_panel = q_packed_.data() + int64_t{q0 / kPanelCols} * qk_dim_ * kPanelCols;
    const int queries = std::min(kPanelCols, num_queries_ - q0);
    for (int k0 = 0; k0 < num_keys; k0 += kPanelRows) {
      MicroKernel(qk_dim_, keys_.data() + int64_t{k0} * qk_dim_, qk_dim_, 1, q_panel, kPanelCols,
                  tile);
      const int keys = std::min(kPanelRows, num_keys - k0);
      for (int r = 0; r < keys; ++r) {
        for (int c = 0; c < queries; ++c) {
          scores[int64_t{q0 + c} * kKeyBlock + k0 + r] = tile[r * kPanelCols + c];
        }
      }
    }
  }
  SoftmaxBlockUpdate(num_queries_, num_keys, kKeyBlock, visible, scale, scores, row_max_.data(),
                     row_sum_.data(), out_.data(), v_dim_);
  // out += P @ V: P rows (6 queries) in place against 16-column strips of the V rows.
  float* out = out_.data();
  for (int c0 = 0; c0 < v_dim_; c0 += kPanelCols) {
    const int cols = std::min(kPanelCols, v_dim_ - c0);
    for (int i0 = 0; i0 < num_queries_; i0 += kPanelRows) {
      MicroKernel(num_keys, scores + int64_t{i0} * kKeyBlock, kKeyBlock, 1, values_.data() + c0,
                  value_stride_, tile);
      const int rows = std::min(kPanelRows, num_queries_ - i0);
      for (int r = 0; r < rows; ++r) {
        float* dst = out + int64_t{i0 + r} * v_dim_ + c0;
        const float* src = tile + r * kPanelCols;
        for (int c = 0; c < cols; ++c) dst[c] += src[c];
      }
    }
  }
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
