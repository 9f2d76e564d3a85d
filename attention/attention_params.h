// Parameters of every attention kernel family, shared by the CPU (attention/cpu/) and CUDA
// (attention/cuda/) implementations. Flat POD structs: each pointer carries its shape, strides
// are in elements, and nullability is stated. Pointers are host memory for the CPU functions and
// device memory for the CUDA launchers. The math is DESIGN.md section 3; outputs are fp32.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/kv_cache_format.h"

namespace dcp {

// The widest top-k selection a token may carry (keys per token of the sparse route): the kernels
// count keys in int, and every layer (the engine's step and inputs, the plan, the launchers,
// dcp_run and dcp_bench) refuses wider ones with this one bound.
inline constexpr int kMaxTopkWidth = 1 << 20;

// Row-major strided batched GEMM with fp32 accumulation, the one shape behind every
// up-projection: for b in [0, batch): C[b] = alpha * op(A[b]) @ op(B[b]) (+ beta * C[b]).
// op(A) is [m, k] (A stored [k, m] when trans_a), op(B) is [k, n] (B stored [n, k] when
// trans_b). Batch strides of A and B may be 0 (the same matrix for every b). BLAS rules:
// beta == 0 means C is not read (NaN in it does not survive); k == 0 gives C = beta * C;
// m, n or batch == 0 is a no-op. C must not overlap A or B.
struct TopkToSlotsParams;

struct GemmParams {
  const void* a = nullptr;  // A of dtype a_dtype, leading dimension lda, batch stride stride_a
  const void* b = nullptr;  // B of dtype b_dtype
  void* c = nullptr;        // C of dtype c_dtype
  DType a_dtype = DType::kF32, b_dtype = DType::kF32, c_dtype = DType::kF32;
  bool trans_a = false, trans_b = false;
  int m = 0, n = 0, k = 0, batch = 1;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  float alpha = 1.0f, beta = 0.0f;
  // Optional: a 2-D byte copy done by the same call, `rows` rows of `row_bytes` bytes from src
  // (row pitch src_pitch bytes) to dst (pitch dst_pitch), whatever the GEMM's shape (the absorb
  // puts q_rope beside q' with it). The CUDA small-M kernel does it inside its launch, saving a
  // launch; elsewhere it is a copy of its own. It must not overlap A, B or the C written.
  // rows == 0: none.
  struct SideCopy {
    void* dst = nullptr;
    const void* src = nullptr;
    int64_t dst_pitch = 0, src_pitch = 0, row_bytes = 0, rows = 0;
  } side;
  // Optional (splits > 1): A is merged from split-KV partials on the fly, the LSE merge of
  // MergeSplits folded into the GEMM that consumes its result. A (F32, not transposed) then
  // names split 0; split s's element is at the same index plus s * split_stride, and the value
  // used is the merge over the splits with weights exp(lse_s) / sum_s exp(lse_s), lse_s at
  // part_lse[(s * m + i) * batch + b] for row i of batch entry b ([splits, m, batch]; NaN and
  // +inf count as -inf; a split of weight 0 is never read into the sum, so its values may be
  // anything). The merged LSE of (i, b) goes to lse[i * lse_ld + b] (-inf where no split has
  // a finite one; that row of A is 0). Taken by the CUDA small-M kernel only (m 1, B stored
  // [K, N], splits <= 64): Device::GemmSupports says where; elsewhere Gemm refuses it.
  struct SplitMerge {
    int splits = 0;
    int64_t split_stride = 0;         // elements
    const float* part_lse = nullptr;  // [splits, m, batch]
    float* lse = nullptr;             // [m, batch], row stride lse_ld
    int64_t lse_ld = 0;
  } merge_a;
  // Optional: a top-k -> slots step (TopkToSlotsParams) done by the same call, independent of
  // the GEMM (the sparse route computes its slots with the absorb). Where the device runs it
  // inside the GEMM's launch, beside the GEMM's blocks (Device::GemmOverlapsSlots: the CUDA
  // small-M kernel, compacting form), the two overlap without a second stream; elsewhere it
  // runs first, in stream order. Its outputs must not overlap A, B or C. null: none.
  const TopkToSlotsParams* side_slots = nullptr;
};

// Dense multi-head attention over packed variable-length sequences (the prefill backend).
// Sequence s has query tokens [cu_seqlens_q[s], cu_seqlens_q[s+1]) and key tokens
// [cu_seqlens_k[s], cu_seqlens_k[s+1]). causal: query i of a sequence with Lq queries and Lk
// keys sees keys [0, Lk - Lq + i] (bottom-right aligned: new tokens after their context);
// otherwise every key. A query that sees no key gets out 0, lse -inf. Sequences may have 0
// queries or 0 keys; max_seqlen_q/k, when > 0, are checked against the actual lengths.
struct DenseMhaParams {
  const void* q = nullptr;  // [Tq, H, qk_dim], strides q_token_stride / q_head_stride
  const void* k = nullptr;  // [Tk, H, qk_dim], strides k_token_stride / k_head_stride
  const void* v = nullptr;  // [Tk, H, v_dim], strides v_token_stride / v_head_stride
  void* out = nullptr;      // [Tq, H, v_dim] out_dtype, strides out_token_stride / out_head_stride
  float* lse = nullptr;     // [Tq, H] natural log, stride lse_token_stride; may be null
  const int32_t* cu_seqlens_q = nullptr;  // [num_seqs + 1], host for CPU, device for CUDA
  const int32_t* cu_seqlens_k = nullptr;  // [num_seqs + 1]
  // Optional host copies of cu_seqlens_q / cu_seqlens_k (CUDA ranks: checks, launch sizing and
  // the cuDNN graph choice without a copy back); must equal the device arrays when set.
  const int32_t* host_cu_seqlens_q = nullptr;  // [num_seqs + 1] host
  const int32_t* host_cu_seqlens_k = nullptr;  // [num_seqs + 1] host
  DType dtype = DType::kF32;              // of q, k, v
  DType out_dtype = DType::kF32;          // of out: F32 or BF16 (rounded once, from fp32)
  int num_seqs = 0, num_heads = 0, qk_dim = 0, v_dim = 0;
  int max_seqlen_q = 0, max_seqlen_k = 0;  // upper bounds (launch sizing on CUDA)
  int64_t q_token_stride = 0, q_head_stride = 0;
  int64_t k_token_stride = 0, k_head_stride = 0;
  int64_t v_token_stride = 0, v_head_stride = 0;
  int64_t out_token_stride = 0, out_head_stride = 0;
  int64_t lse_token_stride = 0;
  bool causal = true;
  float scale = 1.0f;
};

// Sparse top-k MQA in the latent space: one KV head (the cache row [kv_c | k_pe]) shared by
// every query head. Token t attends over the cache rows indices[t][0..topk) that are in
// [0, num_slots) (-1 and anything else out of range is skipped; the checked entry points reject
// out-of-range values before this runs). The value of row j is its first v_dim columns (kv_c).
// kv_format kFp8DsMla: the cache holds 656-byte fp8_ds_mla rows (core/kv_cache_format.h),
// dequantized on the way in (head_dim 576 / v_dim 512 only), kv_row_stride counts bytes and must
// be 656, and dtype is that of q alone.
struct SparseMqaParams {
  const void* q = nullptr;         // [T, H, head_dim] absorbed queries [ql | q_rope], dtype
  const void* kv_cache = nullptr;  // [num_slots, head_dim] latent rows, row stride kv_row_stride
  const int32_t* indices = nullptr;  // [T, topk] slots, row stride indices_token_stride
  float* out = nullptr;            // [T, H, v_dim] o_lat, strides out_token_stride / out_head_stride
  float* lse = nullptr;            // [T, H], stride lse_token_stride; never null
  // CUDA only, optional: o_lat as bf16 (the same element strides as out) instead of fp32 into
  // out, which may then be null and is not written: the fp32 values rounded to nearest even,
  // bit for bit what converting out would give. For a consumer that reads bf16 (the output
  // projection on cuBLAS) one conversion launch fewer. CPU ranks refuse it; so does a call with
  // deferred_merge (its partials are fp32 by contract).
  void* out_bf16 = nullptr;
  DType dtype = DType::kF32;       // of q and kv_cache
  KvCacheDType kv_format = KvCacheDType::kBF16;  // kBF16: rows of dtype
  int num_tokens = 0, num_heads = 0, head_dim = 0, v_dim = 0, topk = 0;
  int64_t num_slots = 0;
  int64_t q_token_stride = 0, q_head_stride = 0;
  int64_t kv_row_stride = 0;
  int64_t indices_token_stride = 0;
  int64_t out_token_stride = 0, out_head_stride = 0;
  int64_t lse_token_stride = 0;
  float scale = 1.0f;
  // Optional [T]: token t's keys are indices[t][0, valid_counts[t]) (clamped to [0, topk]), the
  // rows compacted by TopkToSlots (valid_slots); later columns are not read. Entries inside the
  // count are still skipped when outside [0, num_slots). Null: every one of the topk columns.
  const int32_t* valid_counts = nullptr;
  // CUDA only (the CPU functions ignore these). Splits of each token's key list over CTAs,
  // merged by LSE afterwards: 0 = chosen from the SM count and the sizes
  // (cuda::SparseMqaChooseSplits), >= 1 forced (clamped to what the kernel can use).
  int num_splits = 0;
  // CUDA only, a hint for those choices (the split count, the heads per CTA, the consumer
  // schedule): the valid keys a token is expected to have, where valid_counts leaves fewer than
  // topk (a rank's share of the selection under DCP, about topk / W; a context shorter than
  // topk). 0 = topk. The kernels still walk each token's own count, whatever it is: a wrong
  // hint costs time, never results.
  int expected_keys = 0;
  // CUDA only, the wgmma kernel (the mma.sync kernel ignores it): query heads per CTA, 16, 32
  // or 64. A CTA computes a 64-row tile either way; below 64 the rows past block_heads are zero
  // padding, neither loaded nor stored, so a few tokens' Q, K and partial-output bytes spread
  // over more SMs. 0 = chosen with the split count (cuda::SparseMqaChooseTiling).
  int block_heads = 0;
  // CUDA only. Device scratch for the split partials: cuda::SparseMqaWorkspaceBytes(params,
  // splits) bytes. Null or too small: the split count is lowered until it fits (1 needs none).
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  // CUDA only, optional (host memory): when set and the launch splits the keys, the partials
  // are left unmerged in the workspace for the caller to merge (GemmParams::merge_a), out and
  // lse are not written, and *deferred_merge says where they are. Otherwise (no split, or a
  // device without split-KV) deferred_merge->splits is 1 and out/lse are written as usual.
  struct DeferredMerge {
    int splits = 1;
    float* parts = nullptr;     // [splits, num_tokens, num_heads, v_dim] contiguous
    float* part_lse = nullptr;  // [splits, num_tokens, num_heads]
  }* deferred_merge = nullptr;
  // CUDA only. 0: the best kernel of the device (sm_90: warp-specialised wgmma); 1: the
  // mma.sync kernel (sm_80+); 2: the wgmma kernel (Unimplemented where not compiled / not sm_90).
  int kernel = 0;
  // CUDA only, the wgmma kernel: its grid. n > 0: at most n CTAs, each walking the work items
  // (token x head block x split) blockIdx.x, + gridDim.x, ...: the next item's first gathers
  // and Q tile load under the current one's last PV and epilogue. 0: chosen (one CTA per SM
  // for roles-schedule launches of at least 8 waves of items, SparseMqaChoosePersistentCtas;
  // else one CTA per item; DCP_SPARSE_MQA_PERSISTENT=0 / 1 in the environment forces one CTA
  // per item / per SM, for measurements).
  int sm90_ctas = 0;
  // CUDA only, the wgmma kernel with split keys: where the splits are merged. 0: chosen (inside
  // the kernel, across a thread-block cluster of a token's splits, where 2 <= splits <= 16, the
  // grid is not persistent, no deferred_merge is asked, the launch is one token of at most 16
  // heads (where it was measured faster) and the device holds its cluster; else the MergeSplits
  // kernel;
  // DCP_SPARSE_MQA_CLUSTER_MERGE=0 in the environment makes 0 mean 1);
  // 1: the MergeSplits kernel; 2: in the cluster (Unimplemented where it cannot be, InvalidArgument
  // beside sm90_ctas or deferred_merge). Both give the same bits.
  int split_merge = 0;
  // CUDA only, the wgmma kernel: how its two consumer warpgroups share a pair of 64-key blocks.
  // 1: pairs (each scores one block; row maxima and P exchanged between them twice a pair);
  // 2: roles (WG0 scores every block and runs the softmax, WG1 only its half of P V; no
  // exchange of maxima), bf16 rows only (fp8 rows and the cluster merge run pairs);
  // 0: chosen (cuda::SparseMqaChooseSchedule: roles where every split walks two pairs or more;
  // DCP_SPARSE_MQA_SCHEDULE=1 or 2 in the environment overrides it, for measurements).
  // Both give the float64 reference's result within bf16 tolerance, not the same bits.
  int sm90_schedule = 0;
};

// merge_attn_states of two partials over disjoint key sets, per (token, head):
// lse = log(e^lse_a + e^lse_b), out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b.
// NaN or +inf LSE count as -inf; both -inf gives out 0, lse -inf. out/lse may alias a or b.
struct MergeStatesParams {
  const float* out_a = nullptr;  // [T, H, dim] contiguous
  const float* lse_a = nullptr;  // [T, H]
  const float* out_b = nullptr;  // [T, H, dim]
  const float* lse_b = nullptr;  // [T, H]
  float* out = nullptr;          // [T, H, dim]
  float* lse = nullptr;          // [T, H]
  int num_tokens = 0, num_heads = 0, dim = 0;
};

// DCP combine, ag_rs form, step 1 on each rank: given every rank's LSE of the same (token,
// head) grid, scale this rank's partial in place by e^(lse_rank - lse_total) (0 where
// lse_rank is -inf) and write lse_total. A reduce-scatter sum of the scaled partials then
// gives the combined output of each rank's heads.
struct DcpCorrectParams {
  float* out = nullptr;              // [T, H, dim] this rank's partial, scaled in place
  const float* lse_all = nullptr;    // [W, T, H] every rank's LSE (all-gathered)
  float* lse_total = nullptr;        // [T, H] combined LSE; may be null
  int world_size = 1, rank = 0, num_tokens = 0, num_heads = 0, dim = 0;
};

// DCP combine, a2a form: W partials of the same (token, head) grid, received by head group,
// combined into one. Empty everywhere gives out 0, lse -inf.
struct DcpCombineParams {
  const float* outs = nullptr;  // [W, T, H, dim] partial of each rank
  const float* lses = nullptr;  // [W, T, H]
  float* out = nullptr;         // [T, H, dim]
  float* lse = nullptr;         // [T, H]; may be null
  int world_size = 1, num_tokens = 0, num_heads = 0, dim = 0;
};

// Top-k request-local positions -> this rank's cache slots. Token t belongs to batch request
// token_request[t] at position token_position[t]; a position another rank owns becomes -1.
struct TopkToSlotsParams {
  const int32_t* topk = nullptr;            // [T, topk_width] positions, -1 = none
  const int32_t* token_request = nullptr;   // [T] request index in the batch
  // [T] request-local position of the token; may be null. When given, a position beyond the
  // token's own (invalid input) also becomes -1.
  const int32_t* token_position = nullptr;
  // [num_requests, max_blocks] physical block ids; a negative id (unallocated) gives -1
  const int32_t* block_tables = nullptr;
  // [T, topk_width] out: slot or -1. May be null when valid_slots is given.
  int32_t* slots = nullptr;
  // topk_width: columns of topk/slots (the pointer above already owns the name `topk`).
  int num_tokens = 0, topk_width = 0, num_requests = 0, max_blocks = 0;
  int world_size = 1, interleave = 1, rank = 0, block_size = 1;
  // Optional outputs, both or neither: per token the valid entries of its slots row (slot >= 0)
  // in top-k order, compacted to the front of the row and padded with -1 ([T, topk_width]),
  // and how many there are ([T]). SparseMqaParams::valid_counts then walks only those keys.
  int32_t* valid_slots = nullptr;
  int32_t* valid_counts = nullptr;
};

// The checked entry for top-k positions (DESIGN.md section 3): every index of token t is -1 or
// a request-local position in [0, token_position[t]], and none repeats within the row. The
// first error (lowest token, then lowest column) names the token, the column and the value.
struct TopkValidateParams {
  const int32_t* topk = nullptr;            // [T, topk_width] request-local positions, -1 = none
  const int32_t* token_position = nullptr;  // [T] request-local position of each token
  int num_tokens = 0, topk_width = 0;
  int64_t topk_token_stride = 0;  // elements between rows of topk, >= topk_width
  // > every token_position (the CUDA check's bitmap size); a token at or past it is an error.
  int max_positions = 0;
  // Errors name token first_token + t: the row's index in the caller's batch when these rows
  // are a slice of it.
  int first_token = 0;
};

}  // namespace dcp
