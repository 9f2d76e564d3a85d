// The tensors one attention layer takes and gives back on a rank: its heads' weights, the
// batch's queries, new KV rows and top-k, and the outputs. Views of caller-owned memory.
#pragma once

#include "core/tensor.h"

namespace dcp {

// The layer's up-projection weights for this rank's heads [rank*H/W, (rank+1)*H/W).
struct LayerWeights {
  TensorView w_uk;  // [H/W, Dn, R]: k_nope[h][j] = w_uk[h] @ kv_c[j]
  TensorView w_uv;  // [H/W, R, Dv]: v[h][j] = w_uv[h]^T @ kv_c[j]
};

// Inputs of one layer for a batch; T = sum of query_lens, tokens in the batch's request order.
struct BatchInputs {
  TensorView q_nope;  // [T, H/W, Dn] this rank's heads
  TensorView q_rope;  // [T, H/W, Dr] RoPE applied
  TensorView kv_new;  // [T, R + Dr] the new tokens' [kv_c | k_pe], identical on every rank
  // [T, K] I32 request-local positions, -1 = none; empty = every causal key. Identical on every
  // rank (the indexer runs replicated): each rank checks only its share of the rows
  // (AttentionConfig::validate_topk) and the ranks agree on the verdict.
  TensorView topk;
};

struct BatchOutputs {
  MutableTensorView out;  // [T, H/W, Dv] F32, or BF16 (each value rounded once from fp32)
  MutableTensorView lse;  // [T, H/W] F32, natural log; -inf where a token selected no key
};

}  // namespace dcp
