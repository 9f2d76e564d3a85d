// The MLA projections of this rank's heads (DESIGN.md section 3), each one batched GEMM over
// the heads on the rank's Device, in its storage dtype:
//   Absorb:     q'[t][h] = [w_uk[h]^T q_nope[t][h] | q_rope[t][h]]          (sparse route)
//   UpProject:  kv[t][h] = [k_pe[t] | w_uk[h] kv_c[t] | w_uv[h]^T kv_c[t]]       (dense)
//   ProjectOut: out[t][h] = w_uv[h]^T o_lat[t][h]                           (sparse route)
// The weights are the caller's (device memory, storage dtype), bound per layer with Bind.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/dtype.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "runtime/scratch.h"

namespace dcp {

class MlaProjections {
 public:
  MlaProjections(Device& device, const ModelDims& model, int heads)
      : device_(device), model_(model), heads_(heads), storage_(device.storage_dtype()) {}

  // At plan time: UpProject will see at most `max_rows` rows.
  absl::Status Prepare(int64_t max_rows);
  // At plan time: lets the device choose its algorithm for an UpProject of `rows` rows
  // (Device::PrepareGemm; the one-GEMM form of a bound w_kv_b, which every in-tree caller
  // binds). Once per shape class; may wait for the device the first time.
  absl::Status TuneUpProject(int64_t rows);
  // The layer's weights: w_uk [Hl, Dn, R], w_uv [Hl, R, Dv], storage dtype, on the device;
  // w_kv_b (optional, may be null) the same weights as vLLM's kv_b_proj holds them (see
  // CombineKvB): UpProject then runs one GEMM instead of two.
  void Bind(const void* w_uk, const void* w_uv, const void* w_kv_b = nullptr) {
    w_uk_ = w_uk;
    w_uv_ = w_uv;
    w_kv_b_ = w_kv_b;
  }
  // w_kv_b [Hl, Dn + Dv, R] from w_uk [Hl, Dn, R] and w_uv [Hl, R, Dv] (device, storage dtype):
  // per head rows [0, Dn) are w_uk[h], rows [Dn, Dn + Dv) are w_uv[h]^T. This is vLLM's
  // kv_b_proj.weight ([H (Dn + Dv), R], out x in) restricted to the rank's heads. Exact (a
  // permutation of the elements); waits for the device.
  static absl::StatusOr<Buffer> CombineKvB(Device& device, const ModelDims& model, int heads,
                                           const void* w_uk, const void* w_uv);

  // q_nope [T, Hl, Dn], q_rope [T, Hl, Dr] -> q_latent [T, Hl, R + Dr]. With `slots`, the
  // sparse route's top-k -> slots step goes with the GEMM (GemmParams::side_slots): inside its
  // launch where AbsorbOverlapsSlots says so, else first, in stream order.
  absl::Status Absorb(const void* q_nope, const void* q_rope, int64_t num_tokens, void* q_latent,
                      const TopkToSlotsParams* slots = nullptr);
  // Whether Absorb with these arguments runs `slots` inside the GEMM's own launch, overlapping
  // the two (Device::GemmOverlapsSlots: the CUDA ranks' one-token decode).
  bool AbsorbOverlapsSlots(const void* q_nope, const void* q_rope, int64_t num_tokens,
                           void* q_latent, const TopkToSlotsParams& slots) const;
  // rows [n, R + Dr] -> kv [n, Hl, Dr + Dn + Dv]: per head [k_pe | k_nope | v], the layout the
  // dense attention reads: k = kv[:, :, :Dr + Dn] (rope dims first: the queries are built as
  // [q_rope | q_nope]), v = kv[:, :, Dr + Dn:]. With w_kv_b bound, one GEMM batched over the
  // heads ([n, R] x [R, Dn + Dv] per head) writes k_nope and v; else one GEMM each. k_pe is
  // broadcast to the heads by one Device::CopyRows, which also does the caller's `also` copies
  // (at most CopyRowsParams::kMaxCopies - 1, same dtype: the dense route's query assembly).
  static int KvWidth(const ModelDims& m) {
    return m.qk_rope_head_dim + m.qk_nope_head_dim + m.v_head_dim;
  }
  absl::Status UpProject(const void* rows, int64_t n, void* kv,
                         absl::Span<const RowCopy> also = {});
  // o_lat [T, Hl, R] F32 -> out [T, Hl, Dv] F32. Read as F32 where the device's GEMM takes
  // F32 with storage-dtype weights (Device::GemmSupports: no conversion launch), else first
  // converted into o_lat_storage ([T, Hl, R] of the storage dtype, scratch).
  // out [T, Hl, Dv] of out_dtype (F32 or BF16: the GEMM writes it).
  // `storage_filled`: o_lat is already in o_lat_storage (written there in the storage dtype by
  // the attention kernel, SparseMqaParams::out_bf16); o_lat is not read and may be null.
  absl::Status ProjectOut(const float* o_lat, void* o_lat_storage, int64_t num_tokens, void* out,
                          DType out_dtype, bool storage_filled = false);
  // Whether ProjectOut at num_tokens reads o_lat in the storage dtype (converting fp32 first):
  // the device's GEMM does not take fp32 A there (cuBLAS, from 2 decode tokens up on CUDA
  // ranks). Then the attention kernel can write o_lat in that dtype itself.
  bool ProjectOutReadsStorage(int64_t num_tokens) const;
  // The same, with o_lat merged on the fly from split-KV partials (SparseMqaParams::
  // DeferredMerge: [splits, T, Hl, R] and their LSEs) and the merged LSE written to lse
  // ([T, Hl], row stride lse_ld): one launch instead of the split merge and the projection.
  // Only where ProjectOutMergesSplits(num_tokens) holds: the device's GEMM takes it and the
  // environment sets DCP_MERGE_IN_PROJECTION (opt-in: slower than the split merge kernel on the
  // H200 so far, docs/engine_decode_latency.md).
  absl::Status ProjectOutMerged(const SparseMqaParams::DeferredMerge& parts, int64_t num_tokens,
                                float* out, float* lse, int64_t lse_ld);
  bool ProjectOutMergesSplits(int64_t num_tokens) const;

  int heads() const { return heads_; }

 private:
  // One GEMM per head, batched over the heads: C[h] [m, n] = A[h] [m, k] @ W[h], W[h] the
  // head's weight matrix (stored [k, n], or [n, k] and transposed when trans_weights). A[h]
  // starts at a + h * stride_a, C[h] at c + h * stride_c (elements); A and the weights are in
  // the storage dtype.
  struct HeadGemmArgs {
    const void* a;
    int64_t lda, stride_a;
    const void* weights;  // [Hl, k, n] (or [Hl, n, k] with trans_weights)
    bool trans_weights;
    void* c;
    DType c_dtype;
    int64_t ldc, stride_c;
    int64_t m;
    int n, k;
  };
  // UpProject's one GEMM (w_kv_b bound): [rows, R] x [R, Dn + Dv] per head into kv[:, :, Dr:].
  GemmParams UpProjectGemm(const void* rows, int64_t n, void* kv) const;
  // `side`: a byte copy done by the same call (GemmParams::SideCopy); none by default.
  absl::Status HeadGemm(const HeadGemmArgs& args);
  GemmParams HeadGemmParams(const HeadGemmArgs& args) const;
  GemmParams AbsorbGemm(const void* q_nope, const void* q_rope, int64_t num_tokens,
                        void* q_latent) const;

  Device& device_;
  ModelDims model_;
  int heads_;
  DType storage_;
  const void* w_uk_ = nullptr;  // [Hl, Dn, R] of storage_
  const void* w_uv_ = nullptr;  // [Hl, R, Dv] of storage_
  const void* w_kv_b_ = nullptr;  // [Hl, Dn + Dv, R] of storage_, optional
  int64_t broadcast_rows_ = 0;  // Prepare's max_rows x Hl
};

}  // namespace dcp
