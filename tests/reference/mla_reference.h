// A float64 reference of one MLA attention layer, written from DESIGN.md section 3 directly:
// per token, per head, the selected set, the per-head key/value from the up-projection
// weights, softmax, sum. It shares no code with attention/ or core/kv_layout.h (a shared
// indexing helper would hide shared bugs) and is deliberately naive: loops in index order.
#pragma once

#include <cstdint>
#include <vector>

namespace dcp::reference {

// One MLA attention problem of a whole DCP group (all heads). Requests in order; token t of
// request b sits at position seq_lens[b]-query_lens[b]+i. kv rows of request b are rows
// [sum(seq_lens[<b]), ...+seq_lens[b]) of kv_c/k_pe (the whole sequence, new tokens last).
struct MlaProblem {
  int num_heads = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  double softmax_scale = 0;  // 0 = 1/sqrt(Dn+Dr)
  std::vector<int> seq_lens, query_lens;
  std::vector<double> q_nope;  // [T, H, Dn]
  std::vector<double> q_rope;  // [T, H, Dr]
  std::vector<double> kv_c;    // [N, R]
  std::vector<double> k_pe;    // [N, Dr]
  std::vector<double> w_uk;    // [H, Dn, R]
  std::vector<double> w_uv;    // [H, R, Dv]
  // [T, topk_width] request-local positions, -1 = none; empty = every causal position
  std::vector<int32_t> topk;
  int topk_width = 0;
};

struct MlaResult {
  std::vector<double> out;  // [T, H, Dv]
  std::vector<double> lse;  // [T, H], natural log, -inf when the selected set is empty
};

// Per token, per head: selected set, k/v from the weights, softmax, sum. Throws
// std::invalid_argument on malformed input (sizes that disagree, a top-k index outside
// [0, position] or repeated): the reference never guesses.
MlaResult ReferenceAttention(const MlaProblem& problem);

// Lower-level references for kernel tests: attention of one query vector over explicit
// key/value rows. out = sum_j softmax_j(scale * q . k_j) v_j, lse = log sum_j e^(scale q . k_j);
// n = 0 gives out 0, lse -inf.
void ReferenceSoftmaxAttention(const double* q, const double* keys /*[n, d]*/,
                               const double* values /*[n, dv]*/, int n, int d, int dv, double scale,
                               double* out /*[dv]*/, double* lse);

}  // namespace dcp::reference
