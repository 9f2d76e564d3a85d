#include "runtime/mla_projections.h"

#include <cstddef>
#include <vector>

#include "core/status.h"

namespace dcp {

absl::Status MlaProjections::Prepare(int64_t max_rows) {
  const int64_t targets = max_rows * heads_;
  if (broadcast_rows_ >= targets) return absl::OkStatus();
  std::vector<int32_t> index(targets);
  for (int64_t i = 0; i < targets; ++i) index[i] = static_cast<int32_t>(i / heads_);
  DCP_RETURN_IF_ERROR(Upload(device_, rope_index_, index).status());
  broadcast_rows_ = targets;
  return absl::OkStatus();
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

absl::Status MlaProjections::HeadGemm(const HeadGemmArgs& g, const GemmParams::SideCopy& side) {
  GemmParams p = HeadGemmParams(g);
  p.side = side;
  return device_.Gemm(p);
}

absl::Status MlaProjections::Absorb(const void* q_nope, const void* q_rope, int64_t tx,
                                    void* q_latent) {
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
  return HeadGemm({q_nope, int64_t{hl} * dn, dn, w_uk_, false, q_latent, storage_,
                   int64_t{hl} * width, width, tx, r, dn}, rope);
}

absl::Status MlaProjections::UpProject(const void* rows, int64_t n, void* k, void* v) {
  const int dn = model_.qk_nope_head_dim, dr = model_.qk_rope_head_dim, dv = model_.v_head_dim;
  const int r = model_.kv_lora_rank, hl = heads_, qk = dn + dr, width = model_.latent_width();
  const size_t element = dtype_size(storage_);
  // k_nope[t][h] = w_uk[h] @ kv_c[t]: per head [n, R] x [R, Dn] (w_uk[h] stored [Dn, R]),
  // written into k[t][h][:Dn].
  DCP_RETURN_IF_ERROR(HeadGemm({rows, width, 0, w_uk_, true, k, storage_,
                                int64_t{hl} * qk, qk, n, dn, r}));
  // v[t][h] = w_uv[h]^T kv_c[t]: per head [n, R] x [R, Dv].
  DCP_RETURN_IF_ERROR(HeadGemm({rows, width, 0, w_uv_, false, v, storage_,
                                int64_t{hl} * dv, dv, n, dv, r}));
  // k_pe is shared by the heads: one gather copies row t's k_pe behind each head's k_nope
  // (row t * Hl + h of k[:, :, Dn:] takes source row t), instead of a copy per head.
  const int64_t targets = n * hl;
  DCP_CHECK_ARG(targets <= broadcast_rows_,
                "up-projection of %d rows, but the plan prepared %d", n, broadcast_rows_ / hl);
  return device_.GatherRows({static_cast<const std::byte*>(rows) + size_t(r) * element,
                             rope_index_.as<int32_t>(),
                             static_cast<std::byte*>(k) + size_t(dn) * element, storage_,
                             targets, n, dr, width, qk});
}

absl::Status MlaProjections::ProjectOut(const float* o_lat, void* o_lat_storage, int64_t tx,
                                        float* out) {
  const int hl = heads_, r = model_.kv_lora_rank, dv = model_.v_head_dim;
  // out[t][h] = w_uv[h]^T o_lat[t][h]: per head [tx, R] x [R, Dv].
  GemmParams p = HeadGemmParams({o_lat, int64_t{hl} * r, r, w_uv_, false, out, DType::kF32,
                                 int64_t{hl} * dv, dv, tx, dv, r});
  p.a_dtype = DType::kF32;
  if (storage_ != DType::kF32 && !device_.GemmSupports(p)) {
    const size_t count = size_t(tx) * hl * r;
    DCP_CHECK_ARG(o_lat_storage != nullptr, "ProjectOut needs a %s copy of o_lat here",
                  dtype_name(storage_));
    DCP_RETURN_IF_ERROR(device_.Convert(o_lat_storage, storage_, o_lat, DType::kF32, count));
    p.a = o_lat_storage;
    p.a_dtype = storage_;
  }
  return device_.Gemm(p);
}

}  // namespace dcp
