#include "runtime/mla_projections.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/environment.h"
#include "core/status.h"

namespace dcp {

absl::Status MlaProjections::Prepare(int64_t max_rows) {
  DCP_CHECK_ARG(max_rows >= 0, "UpProject rows %d must be >= 0", max_rows);
  broadcast_rows_ = std::max(broadcast_rows_, max_rows * heads_);
  return absl::OkStatus();
}

absl::Status MlaProjections::TuneUpProject(int64_t rows) {
  if (rows <= 0) return absl::OkStatus();
  return device_.PrepareGemm(UpProjectGemm(nullptr, rows, nullptr));
}

GemmParams MlaProjections::UpProjectGemm(const void* rows, int64_t n, void* kv) const {
  const int dn = model_.qk_nope_head_dim, dr = model_.qk_rope_head_dim, dv = model_.v_head_dim;
  const int kv_width = KvWidth(model_);
  // kv[:, :, Dr:]. For TuneUpProject kv is null and nope the bare offset: the tuner reads only
  // an address's alignment, and kv itself is a scratch allocation (256-byte aligned).
  void* nope = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(kv) +
                                       uintptr_t(dr) * dtype_size(storage_));
  // [k_nope | v][t][h] = w_kv_b[h] kv_c[t]: per head [n, R] x [R, Dn + Dv] (w_kv_b[h] stored
  // [Dn + Dv, R]), one batched GEMM into kv[t][h][Dr:].
  return HeadGemmParams({rows, model_.latent_width(), 0, w_kv_b_, true, nope, storage_,
                         int64_t{heads_} * kv_width, kv_width, n, dn + dv, model_.kv_lora_rank});
}

GemmParams MlaProjections::HeadGemmParams(const HeadGemmArgs& g) const {
  GemmParams p;
  p.a = g.a;
  p.b = g.weights;
  p.c = g.c;
  p.a_dtype = p.b_dtype = storage_;
  p.c_dtype = g.c_dtype;
  p.trans_b = g.trans_weights;
  p.m = static_cast<int>(g.m);
  p.n = g.n;
  p.k = g.k;
  p.batch = heads_;
  p.lda = g.lda;
  p.ldb = g.trans_weights ? g.k : g.n;
  p.ldc = g.ldc;
  p.stride_a = g.stride_a;
  p.stride_b = int64_t{g.k} * g.n;
  p.stride_c = g.stride_c;
  return p;
}

absl::Status MlaProjections::HeadGemm(const HeadGemmArgs& g) {
  return device_.Gemm(HeadGemmParams(g));
}

GemmParams MlaProjections::AbsorbGemm(const void* q_nope, const void* q_rope, int64_t tx,
                                      void* q_latent) const {
  const int hl = heads_, r = model_.kv_lora_rank, dn = model_.qk_nope_head_dim;
  const int dr = model_.qk_rope_head_dim, width = model_.latent_width();
  const size_t element = dtype_size(storage_);
  // Per head [tx, Dn] x [Dn, R] (w_uk[h] as stored), written into q'[t][h][:R]; q_rope goes
  // behind it as the GEMM's side copy (inside the GEMM's launch where the device can).
  GemmParams::SideCopy rope;
  rope.dst = static_cast<std::byte*>(q_latent) + size_t(r) * element;
  rope.src = q_rope;
  rope.dst_pitch = int64_t(width) * element;
  rope.src_pitch = rope.row_bytes = int64_t(dr) * element;
  rope.rows = tx * hl;
  GemmParams p = HeadGemmParams({q_nope, int64_t{hl} * dn, dn, w_uk_, false, q_latent, storage_,
                                 int64_t{hl} * width, width, tx, r, dn});
  p.side = rope;
  return p;
}

absl::Status MlaProjections::Absorb(const void* q_nope, const void* q_rope, int64_t tx,
                                    void* q_latent, const TopkToSlotsParams* slots) {
  GemmParams p = AbsorbGemm(q_nope, q_rope, tx, q_latent);
  p.side_slots = slots;
  return device_.Gemm(p);
}

bool MlaProjections::AbsorbOverlapsSlots(const void* q_nope, const void* q_rope, int64_t tx,
                                         void* q_latent, const TopkToSlotsParams& slots) const {
  GemmParams p = AbsorbGemm(q_nope, q_rope, tx, q_latent);
  p.side_slots = &slots;
  return device_.GemmOverlapsSlots(p);
}

absl::Status MlaProjections::UpProject(const void* rows, int64_t n, void* kv,
                                       absl::Span<const RowCopy> also) {
  const int dn = model_.qk_nope_head_dim, dr = model_.qk_rope_head_dim, dv = model_.v_head_dim;
  const int r = model_.kv_lora_rank, hl = heads_, width = model_.latent_width();
  const int kv_width = KvWidth(model_);
  const int64_t ldc = int64_t{hl} * kv_width;
  const size_t element = dtype_size(storage_);
  auto* nope = static_cast<std::byte*>(kv) + size_t(dr) * element;  // kv[t][h][Dr:]
  const int64_t targets = n * hl;
  DCP_CHECK_ARG(targets <= broadcast_rows_,
                "up-projection of %d rows, but the plan prepared %d", n, broadcast_rows_ / hl);
  DCP_CHECK_ARG(also.size() < size_t{CopyRowsParams::kMaxCopies},
                "UpProject: %d extra copies, at most %d", also.size(),
                CopyRowsParams::kMaxCopies - 1);
  if (w_kv_b_ != nullptr) {
    DCP_RETURN_IF_ERROR(device_.Gemm(UpProjectGemm(rows, n, kv)));
  } else {
    // k_nope[t][h] = w_uk[h] @ kv_c[t]: per head [n, R] x [R, Dn] (w_uk[h] stored [Dn, R]).
    DCP_RETURN_IF_ERROR(
        HeadGemm({rows, width, 0, w_uk_, true, nope, storage_, ldc, kv_width, n, dn, r}));
    // v[t][h] = w_uv[h]^T kv_c[t]: per head [n, R] x [R, Dv].
    DCP_RETURN_IF_ERROR(HeadGemm({rows, width, 0, w_uv_, false, nope + size_t(dn) * element,
                                  storage_, ldc, kv_width, n, dv, r}));
  }
  // k_pe is shared by the heads: one copy puts row t's k_pe in front of each head's k_nope
  // (row t * Hl + h of kv[:, :, :Dr] takes source row t: a source row repeated Hl times), with
  // the caller's copies in the same launch.
  CopyRowsParams copies;
  copies.dtype = storage_;
  RowCopy& k_pe = copies.copies[copies.num_copies++];
  k_pe.src = static_cast<const std::byte*>(rows) + size_t(r) * element;
  k_pe.dst = kv;
  k_pe.rows = targets;
  k_pe.width = dr;
  k_pe.src_row_stride = width;
  k_pe.dst_row_stride = kv_width;
  k_pe.src_row_repeat = hl;
  for (const RowCopy& copy : also) copies.copies[copies.num_copies++] = copy;
  return device_.CopyRows(copies);
}

absl::StatusOr<Buffer> MlaProjections::CombineKvB(Device& device, const ModelDims& m, int heads,
                                                  const void* w_uk, const void* w_uv) {
  const int64_t dn = m.qk_nope_head_dim, dv = m.v_head_dim, r = m.kv_lora_rank, hl = heads;
  const DType dtype = device.storage_dtype();
  const size_t element = dtype_size(dtype);
  const int64_t uk_count = hl * dn * r, uv_count = hl * r * dv;
  // Both weights side by side, then one element gather into the combined order.
  DCP_ASSIGN_OR_RETURN(Buffer both, device.Allocate(size_t(uk_count + uv_count) * element));
  DCP_RETURN_IF_ERROR(device.Copy(both.data(), w_uk, size_t(uk_count) * element));
  DCP_RETURN_IF_ERROR(device.Copy(static_cast<std::byte*>(both.data()) + uk_count * element,
                                  w_uv, size_t(uv_count) * element));
  const int64_t total = uk_count + uv_count;
  DCP_CHECK_ARG(total <= std::numeric_limits<int32_t>::max(),
                "kv_b of %d elements exceeds the int32 gather index", total);
  std::vector<int32_t> index(total);
  for (int64_t h = 0; h < hl; ++h) {
    int32_t* head = index.data() + h * (dn + dv) * r;
    for (int64_t j = 0; j < dn; ++j) {  // rows [0, Dn): w_uk[h][j][:]
      for (int64_t c = 0; c < r; ++c) head[j * r + c] = int32_t(h * dn * r + j * r + c);
    }
    for (int64_t j = 0; j < dv; ++j) {  // rows [Dn, Dn + Dv): w_uv[h][:][j]
      for (int64_t c = 0; c < r; ++c) {
        head[(dn + j) * r + c] = int32_t(uk_count + h * r * dv + c * dv + j);
      }
    }
  }
  ScratchBuffer index_buffer;
  DCP_ASSIGN_OR_RETURN(int32_t* d_index, Upload(device, index_buffer, index));
  DCP_ASSIGN_OR_RETURN(Buffer combined, device.Allocate(size_t(total) * element));
  DCP_RETURN_IF_ERROR(
      device.GatherRows({both.data(), d_index, combined.data(), dtype, total, total, 1, 1, 1}));
  DCP_RETURN_IF_ERROR(device.Synchronize());
  return combined;
}

bool MlaProjections::ProjectOutReadsStorage(int64_t tx) const {
  if (storage_ == DType::kF32 || w_uv_ == nullptr) return false;
  const int hl = heads_, r = model_.kv_lora_rank, dv = model_.v_head_dim;
  // Shapes and dtypes only: the pointers stand in for the ones Run will pass (16-byte aligned
  // scratch, as those are).
  alignas(16) static float probe[4];
  GemmParams p = HeadGemmParams({probe, int64_t{hl} * r, r, w_uv_, false, probe, DType::kF32,
                                 int64_t{hl} * dv, dv, tx, dv, r});
  p.a_dtype = DType::kF32;
  return !device_.GemmSupports(p);
}

absl::Status MlaProjections::ProjectOut(const float* o_lat, void* o_lat_storage, int64_t tx,
                                        void* out, DType out_dtype, bool storage_filled) {
  const int hl = heads_, r = model_.kv_lora_rank, dv = model_.v_head_dim;
  // out[t][h] = w_uv[h]^T o_lat[t][h]: per head [tx, R] x [R, Dv].
  GemmParams p = HeadGemmParams({o_lat, int64_t{hl} * r, r, w_uv_, false, out, out_dtype,
                                 int64_t{hl} * dv, dv, tx, dv, r});
  p.a_dtype = DType::kF32;
  if (storage_filled) {
    DCP_CHECK_ARG(o_lat_storage != nullptr && storage_ != DType::kF32,
                  "ProjectOut: storage_filled needs a %s o_lat_storage", dtype_name(storage_));
    p.a = o_lat_storage;
    p.a_dtype = storage_;
    return device_.Gemm(p);
  }
  if (ProjectOutReadsStorage(tx)) {
    const size_t count = size_t(tx) * hl * r;
    DCP_CHECK_ARG(o_lat_storage != nullptr, "ProjectOut needs a %s copy of o_lat here",
                  dtype_name(storage_));
    DCP_RETURN_IF_ERROR(device_.Convert(o_lat_storage, storage_, o_lat, DType::kF32, count));
    p.a = o_lat_storage;
    p.a_dtype = storage_;
  }
  return device_.Gemm(p);
}

namespace {

GemmParams::SplitMerge SplitMergeOf(const SparseMqaParams::DeferredMerge& parts, int64_t tx,
                                    int heads, int r, float* lse, int64_t lse_ld) {
  GemmParams::SplitMerge merge;
  merge.splits = parts.splits;
  merge.split_stride = tx * heads * int64_t{r};
  merge.part_lse = parts.part_lse;
  merge.lse = lse;
  merge.lse_ld = lse_ld;
  return merge;
}

}  // namespace

bool MlaProjections::ProjectOutMergesSplits(int64_t tx) const {
  // Opt-in (DCP_MERGE_IN_PROJECTION set): measured slower on the H200 than the split merge
  // kernel followed by the projection (1 decode token x 128 heads: 35.8 against 33.5 us
  // replayed), whose weight stream overlaps the merge (docs/engine_decode_latency.md).
  static const bool enabled = EnvSwitch("DCP_MERGE_IN_PROJECTION", false);
  if (!enabled) return false;
  const int hl = heads_, r = model_.kv_lora_rank, dv = model_.v_head_dim;
  // Shapes and dtypes only: the pointers stand in for the ones Run will pass.
  static float probe[4];
  GemmParams p = HeadGemmParams({probe, int64_t{hl} * r, r, w_uv_, false, probe, DType::kF32,
                                 int64_t{hl} * dv, dv, tx, dv, r});
  p.a_dtype = DType::kF32;
  p.merge_a = SplitMergeOf({2, probe, probe}, tx, hl, r, probe, hl);
  return w_uv_ != nullptr && device_.GemmSupports(p);
}

absl::Status MlaProjections::ProjectOutMerged(const SparseMqaParams::DeferredMerge& parts,
                                              int64_t tx, float* out, float* lse,
                                              int64_t lse_ld) {
  const int hl = heads_, r = model_.kv_lora_rank, dv = model_.v_head_dim;
  GemmParams p = HeadGemmParams({parts.parts, int64_t{hl} * r, r, w_uv_, false, out, DType::kF32,
                                 int64_t{hl} * dv, dv, tx, dv, r});
  p.a_dtype = DType::kF32;
  p.merge_a = SplitMergeOf(parts, tx, hl, r, lse, lse_ld);
  DCP_CHECK_ARG(device_.GemmSupports(p),
                "ProjectOutMerged: the device's GEMM does not merge split partials at %d tokens",
                tx);
  return device_.Gemm(p);
}

}  // namespace dcp
