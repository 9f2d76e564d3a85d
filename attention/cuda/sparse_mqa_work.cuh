// What one work item of a sparse MQA kernel is, shared by the mma.sync (sm_80) and wgmma (sm_90a)
// kernels: which token, which block of heads (64, or 16 / 32 for the wgmma kernel:
// SparseMqaSplit::block_heads), which range of the token's key list, and where its output goes
// (the final out/lse, or a split partial that MergeSplits combines).
//
// Items: num_tokens x num_splits x head_blocks, head block fastest (the head blocks of one
// (token, split) gather the same rows at about the same time: the second gather hits L2), then
// split; with SparseMqaSplit::cluster_merge split fastest, then head block (the splits of one
// (token, head block) are consecutive CTAs: one cluster). A token with `count` keys has ceil(count / 64) blocks; split s takes blocks
// [s * per, (s + 1) * per) with per = ceil(blocks / num_splits) rounded up to `block_align`
// (a pair for the wgmma kernel), so a short list leaves the last splits empty (out 0,
// lse -inf: the merge gives them weight 0). A CTA does item blockIdx.x, and with a grid smaller
// than the items (the wgmma kernel's SparseMqaSplit::persistent_ctas) also blockIdx.x +
// gridDim.x, + 2 gridDim.x, ...
#pragma once

#include <cstdint>

#include "attention/attention_params.h"
#include "attention/cuda/sparse_mqa.h"

namespace dcp::cuda {

// Where the split partials live (num_splits > 1): [splits, T, H, v_dim] and [splits, T, H].
struct SparseMqaSplit {
  int num_splits = 1;
  int block_heads = 64;  // heads per CTA (the wgmma kernel: 16, 32 or 64; mma.sync: 64)
  // The wgmma kernel's producer prefetches the rows of the pair this many pairs ahead into L2
  // (0: none), so that a refill, issued when a buffer frees, hits L2 rather than HBM.
  int prefetch_pairs = 1;
  // The wgmma kernel's running max moves only when a block's max passes it by more than this
  // (log2 units; 0 = whenever it grows): P stays <= 2^slack and most pairs skip rescaling O.
  float rescale_slack = 8.f;
  // The wgmma kernel's grid: 0 = one CTA per item; n > 0 = min(n, items) CTAs, each walking
  // items blockIdx.x, + gridDim.x, ...: the next item's first gathers and Q tile load under the
  // current item's last PV and epilogue (SparseMqaParams::sm90_ctas).
  int persistent_ctas = 0;
  // With persistent_ctas: the producer (bf16 rows) also prefetches the CTA's next item into L2,
  // its Q tile and its first pair's rows, once the current item's last prefetch is issued, so
  // that item's first gathers and Q load under this item's epilogue read L2, not HBM.
  bool prefetch_next_item = true;
  // The wgmma kernel merges the splits itself (sparse_mqa_sm90_cluster_merge.cuh): the splits of
  // a (token, head block) are one thread-block cluster and write the final out / lse; part_out
  // and part_lse are not used. Needs 2 <= num_splits <= 16 and persistent_ctas == 0.
  bool cluster_merge = false;
  // The wgmma kernel's consumer schedule (SparseMqaParams::sm90_schedule): false = pairs (each
  // consumer WG scores one block of a pair, maxima and P exchanged), true = roles (WG0 scores
  // every block and runs the softmax, WG1 only its half of P V; sparse_mqa_sm90_roles.cuh).
  // Roles needs bf16 rows and no cluster merge.
  bool roles = false;
  float* part_out = nullptr;
  float* part_lse = nullptr;
};

struct SparseMqaWork {
  int token, head0, split;
  int heads;               // heads of this CTA: min(block_heads, num_heads - head0)
  int key_begin, key_end;  // [key_begin, key_end) of the token's list; key_end <= count
  float* out;              // row of head0 (head stride out_head_stride); not for writing
                           // when SparseMqaParams::out_bf16 is set and there is one split
                           // (the kernels then find the bf16 row from the params)
  int64_t out_head_stride;
  float* lse;  // entry of head0 (heads contiguous)
};

// The wgmma kernel's epilogue for a launch (sparse_mqa.h, Sm90Epilogue).
inline Sm90Epilogue ChooseSm90Epilogue(const SparseMqaParams& p, const SparseMqaSplit& split) {
  if (split.cluster_merge) return Sm90Epilogue::kCluster;
  return p.out_bf16 != nullptr && split.num_splits == 1 ? Sm90Epilogue::kBf16
                                                        : Sm90Epilogue::kF32;
}

// The number of work items (tokens x splits x head blocks).
__host__ __device__ __forceinline__ int64_t SparseMqaItems(const SparseMqaParams& p, int num_splits,
                                                           int block_heads) {
  return int64_t(p.num_tokens) * num_splits * ((p.num_heads + block_heads - 1) / block_heads);
}

// Work item `item` (< SparseMqaItems). Index: the arithmetic's type (the wgmma kernel walks
// items in 32 bits, its launcher keeps them below 2^31; the mma.sync kernel's one item is
// blockIdx.x in 64 bits, the code its registers were tuned with). kClusterMerge: the order and
// rows of SparseMqaSplit::cluster_merge, a compile-time choice (the wgmma kernel's cluster
// instantiation), so the other kernels carry no trace of it.
template <class Index, bool kClusterMerge = false>
__device__ __forceinline__ SparseMqaWork GetSparseMqaWork(const SparseMqaParams& p,
                                                          const SparseMqaSplit& split,
                                                          int block_heads, int block_keys,
                                                          int block_align, Index item) {
  SparseMqaWork w;
  const int head_blocks = (p.num_heads + block_heads - 1) / block_heads;
  if constexpr (kClusterMerge) {
    w.split = static_cast<int>(item % Index(split.num_splits));
    const Index token_block = item / Index(split.num_splits);
    w.head0 = static_cast<int>(token_block % Index(head_blocks)) * block_heads;
    w.token = static_cast<int>(token_block / Index(head_blocks));
  } else {
    w.head0 = static_cast<int>(item % Index(head_blocks)) * block_heads;
    const Index token_split = item / Index(head_blocks);
    w.split = static_cast<int>(token_split % Index(split.num_splits));
    w.token = static_cast<int>(token_split / Index(split.num_splits));
  }
  w.heads = min(block_heads, p.num_heads - w.head0);
  int count = p.topk;
  if (p.valid_counts != nullptr) count = min(max(p.valid_counts[w.token], 0), p.topk);
  const int blocks = (count + block_keys - 1) / block_keys;
  int per = (blocks + split.num_splits - 1) / split.num_splits;
  per = (per + block_align - 1) / block_align * block_align;
  w.key_begin = min(count, w.split * per * block_keys);
  w.key_end = min(count, w.key_begin + per * block_keys);
  if (split.num_splits == 1 || kClusterMerge) {  // the final rows
    w.out = p.out + int64_t(w.token) * p.out_token_stride + int64_t(w.head0) * p.out_head_stride;
    w.out_head_stride = p.out_head_stride;
    w.lse = p.lse + int64_t(w.token) * p.lse_token_stride + w.head0;
  } else {
    const int64_t row = (int64_t(w.split) * p.num_tokens + w.token) * p.num_heads + w.head0;
    w.out = split.part_out + row * p.v_dim;
    w.out_head_stride = p.v_dim;
    w.lse = split.part_lse + row;
  }
  return w;
}

}  // namespace dcp::cuda
