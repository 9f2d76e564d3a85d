#include "tests/reference/mla_reference.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace dcp::reference {
namespace {

void Require(bool condition, const std::string& message) {
  if (!condition) throw std::invalid_argument("ReferenceAttention: " + message);
}

}  // namespace

void ReferenceSoftmaxAttention(const double* q, const double* keys, const double* values, int n,
                               int d, int dv, double scale, double* out, double* lse) {
  for (int e = 0; e < dv; ++e) out[e] = 0.0;
  if (n <= 0) {
    *lse = -std::numeric_limits<double>::infinity();
    return;
  }
  std::vector<double> logits(n);
  double max_logit = -std::numeric_limits<double>::infinity();
  for (int j = 0; j < n; ++j) {
    double dot = 0.0;
    for (int i = 0; i < d; ++i) dot += q[i] * keys[static_cast<size_t>(j) * d + i];
    logits[j] = scale * dot;
    if (logits[j] > max_logit) max_logit = logits[j];
  }
  double sum = 0.0;
  for (int j = 0; j < n; ++j) sum += std::exp(logits[j] - max_logit);
  for (int j = 0; j < n; ++j) {
    const double weight = std::exp(logits[j] - max_logit) / sum;
    for (int e = 0; e < dv; ++e) out[e] += weight * values[static_cast<size_t>(j) * dv + e];
  }
  *lse = max_logit + std::log(sum);
}

MlaResult ReferenceAttention(const MlaProblem& pb) {
  const int num_heads = pb.num_heads, rank = pb.kv_lora_rank, nope = pb.qk_nope_head_dim;
  const int rope = pb.qk_rope_head_dim, v_dim = pb.v_head_dim;
  Require(num_heads > 0 && rank > 0 && nope >= 0 && rope >= 0 && nope + rope > 0 && v_dim > 0,
          "non-positive dimension");
  Require(pb.seq_lens.size() == pb.query_lens.size(), "seq_lens and query_lens differ in size");
  size_t num_tokens = 0, num_rows = 0;
  for (size_t b = 0; b < pb.seq_lens.size(); ++b) {
    Require(pb.query_lens[b] >= 0 && pb.query_lens[b] <= pb.seq_lens[b],
            "request " + std::to_string(b) + ": query_len outside [0, seq_len]");
    num_tokens += pb.query_lens[b];
    num_rows += pb.seq_lens[b];
  }
  Require(pb.q_nope.size() == num_tokens * num_heads * nope, "q_nope size");
  Require(pb.q_rope.size() == num_tokens * num_heads * rope, "q_rope size");
  Require(pb.kv_c.size() == num_rows * rank, "kv_c size");
  Require(pb.k_pe.size() == num_rows * rope, "k_pe size");
  Require(pb.w_uk.size() == static_cast<size_t>(num_heads) * nope * rank, "w_uk size");
  Require(pb.w_uv.size() == static_cast<size_t>(num_heads) * rank * v_dim, "w_uv size");
  Require(pb.topk.empty() || pb.topk.size() == num_tokens * pb.topk_width, "topk size");
  const double scale =
      pb.softmax_scale != 0 ? pb.softmax_scale : 1.0 / std::sqrt(static_cast<double>(nope + rope));
  const int qk_dim = nope + rope;

  MlaResult result;
  result.out.assign(num_tokens * num_heads * v_dim, 0.0);
  result.lse.assign(num_tokens * num_heads, 0.0);

  size_t token = 0, first_row = 0;
  std::vector<double> head_keys, head_values, keys, values, query(qk_dim);
  for (size_t b = 0; b < pb.seq_lens.size(); ++b) {
    const int seq_len = pb.seq_lens[b], query_len = pb.query_lens[b];
    // Per head, per row j of the request: k[h][j] = [w_uk[h] @ kv_c[j] | k_pe[j]] and
    // v[h][j] = w_uv[h]^T @ kv_c[j].
    head_keys.assign(static_cast<size_t>(num_heads) * seq_len * qk_dim, 0.0);
    head_values.assign(static_cast<size_t>(num_heads) * seq_len * v_dim, 0.0);
    for (int h = 0; h < num_heads; ++h) {
      for (int j = 0; j < seq_len; ++j) {
        const double* latent = &pb.kv_c[(first_row + j) * rank];
        double* key = &head_keys[(static_cast<size_t>(h) * seq_len + j) * qk_dim];
        double* value = &head_values[(static_cast<size_t>(h) * seq_len + j) * v_dim];
        for (int d = 0; d < nope; ++d) {
          double sum = 0.0;
          for (int r = 0; r < rank; ++r) {
            sum += pb.w_uk[(static_cast<size_t>(h) * nope + d) * rank + r] * latent[r];
          }
          key[d] = sum;
        }
        for (int d = 0; d < rope; ++d) key[nope + d] = pb.k_pe[(first_row + j) * rope + d];
        for (int e = 0; e < v_dim; ++e) {
          double sum = 0.0;
          for (int r = 0; r < rank; ++r) {
            sum += pb.w_uv[(static_cast<size_t>(h) * rank + r) * v_dim + e] * latent[r];
          }
          value[e] = sum;
        }
      }
    }
    for (int i = 0; i < query_len; ++i, ++token) {
      const int position = seq_len - query_len + i;
      // The selected set S(t): the given top-k minus -1, or every causal position.
      std::vector<int> selected;
      if (pb.topk.empty()) {
        for (int j = 0; j <= position; ++j) selected.push_back(j);
      } else {
        std::vector<bool> seen(position + 1, false);
        for (int c = 0; c < pb.topk_width; ++c) {
          const int j = pb.topk[token * pb.topk_width + c];
          if (j == -1) continue;
          Require(j >= 0 && j <= position, "token " + std::to_string(token) + ": top-k index " +
                                               std::to_string(j) + " outside [0, " +
                                               std::to_string(position) + "]");
          Require(!seen[j], "token " + std::to_string(token) + ": top-k index " +
                                std::to_string(j) + " repeated");
          seen[j] = true;
          selected.push_back(j);
        }
      }
      const int n = static_cast<int>(selected.size());
      for (int h = 0; h < num_heads; ++h) {
        for (int d = 0; d < nope; ++d) query[d] = pb.q_nope[(token * num_heads + h) * nope + d];
        for (int d = 0; d < rope; ++d) {
          query[nope + d] = pb.q_rope[(token * num_heads + h) * rope + d];
        }
        keys.resize(static_cast<size_t>(n) * qk_dim);
        values.resize(static_cast<size_t>(n) * v_dim);
        for (int s = 0; s < n; ++s) {
          const size_t j = static_cast<size_t>(h) * seq_len + selected[s];
          for (int d = 0; d < qk_dim; ++d) {
            keys[static_cast<size_t>(s) * qk_dim + d] = head_keys[j * qk_dim + d];
          }
          for (int e = 0; e < v_dim; ++e) {
            values[static_cast<size_t>(s) * v_dim + e] = head_values[j * v_dim + e];
          }
        }
        ReferenceSoftmaxAttention(query.data(), keys.data(), values.data(), n, qk_dim, v_dim, scale,
                                  &result.out[(token * num_heads + h) * v_dim],
                                  &result.lse[token * num_heads + h]);
      }
    }
    first_row += seq_len;
  }
  return result;
}

}  // namespace dcp::reference
