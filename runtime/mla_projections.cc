#include "runtime/mla_projections.h"

#include <cstddef>
#include <utility>
#include <vector>

#include "core/status.h"
#include "runtime/input_checks.h"

namespace dcp {

absl::StatusOr<std::unique_ptr<MlaProjections>> MlaProjections::Create(
    Device& device, const ModelDims& m, int heads, const LayerWeights& weights) {
  const int64_t hl = heads;
  DCP_RETURN_IF_ERROR(CheckView("weights.w_uk", weights.w_uk,
                                {hl, m.qk_nope_head_dim, m.kv_lora_rank}, true,
                                device.memory_space()));
  DCP_RETURN_IF_ERROR(CheckView("weights.w_uv", weights.w_uv, {hl, m.kv_lora_rank, m.v_head_dim},
                                true, device.memory_space()));
  auto projections = std::unique_ptr<MlaProjections>(new MlaProjections(device, m, heads));
  const size_t element = dtype_size(projections->storage_);
  for (auto [view, buffer] : {std::pair{&weights.w_uk, &projections->w_uk_},
                              std::pair{&weights.w_uv, &projections->w_uv_}}) {
    DCP_ASSIGN_OR_RETURN(*buffer, device.Allocate(view->num_elements() * element));
    Buffer staging;
    const void* source = view->data;
    if (view->memory != device.memory_space()) {
      DCP_ASSIGN_OR_RETURN(staging,
                           device.Allocate(view->num_elements() * dtype_size(view->dtype)));
      DCP_RETURN_IF_ERROR(device.CopyFromHost(staging.data(), view->data, staging.bytes()));
      source = staging.data();
    }
    DCP_RETURN_IF_ERROR(device.Convert(buffer->data(), projections->storage_, source,
                                       view->dtype, view->num_elements()));
    DCP_RETURN_IF_ERROR(device.Synchronize());
  }
  return projections;
}

absl::Status MlaProjections::HeadGemm(const HeadGemmArgs& g) {
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
  return device_.Gemm(p);
}

absl::Status MlaProjections::Absorb(const void* q_nope, const void* q_rope, int64_t tx,
                                    void* q_latent) {
  const int hl = heads_, r = model_.kv_lora_rank, dn = model_.qk_nope_head_dim;
  const int dr = model_.qk_rope_head_dim, width = model_.latent_width();
  const size_t element = dtype_size(storage_);
  // Per head [tx, Dn] x [Dn, R] (w_uk[h] as stored), written into q'[t][h][:R].
  DCP_RETURN_IF_ERROR(HeadGemm({q_nope, int64_t{hl} * dn, dn, w_uk_.data(), false, q_latent,
                                storage_, int64_t{hl} * width, width, tx, r, dn}));
  return device_.Copy2D(static_cast<std::byte*>(q_latent) + size_t(r) * element,
                        size_t(width) * element, q_rope, size_t(dr) * element,
                        size_t(dr) * element, size_t(tx) * hl);
}

absl::Status MlaProjections::UpProject(const void* rows, int64_t n, void* k, void* v) {
  const int dn = model_.qk_nope_head_dim, dr = model_.qk_rope_head_dim, dv = model_.v_head_dim;
  const int r = model_.kv_lora_rank, hl = heads_, qk = dn + dr, width = model_.latent_width();
  const size_t element = dtype_size(storage_);
  // k_nope[t][h] = w_uk[h] @ kv_c[t]: per head [n, R] x [R, Dn] (w_uk[h] stored [Dn, R]),
  // written into k[t][h][:Dn].
  DCP_RETURN_IF_ERROR(HeadGemm({rows, width, 0, w_uk_.data(), true, k, storage_,
                                int64_t{hl} * qk, qk, n, dn, r}));
  // v[t][h] = w_uv[h]^T kv_c[t]: per head [n, R] x [R, Dv].
  DCP_RETURN_IF_ERROR(HeadGemm({rows, width, 0, w_uv_.data(), false, v, storage_,
                                int64_t{hl} * dv, dv, n, dv, r}));
  // k_pe is shared by the heads: one gather copies row t's k_pe behind each head's k_nope
  // (row t * Hl + h of k[:, :, Dn:] takes source row t), instead of a copy per head.
  const int64_t targets = n * hl;
  if (broadcast_rows_ < targets) {
    std::vector<int32_t> index(targets);
    for (int64_t i = 0; i < targets; ++i) index[i] = static_cast<int32_t>(i / hl);
    DCP_RETURN_IF_ERROR(Upload(device_, rope_index_, index).status());
    broadcast_rows_ = targets;
  }
  return device_.GatherRows({static_cast<const std::byte*>(rows) + size_t(r) * element,
                             rope_index_.as<int32_t>(),
                             static_cast<std::byte*>(k) + size_t(dn) * element, storage_,
                             targets, n, dr, width, qk});
}

absl::Status MlaProjections::ProjectOut(const void* o_lat, int64_t tx, float* out) {
  const int hl = heads_, r = model_.kv_lora_rank, dv = model_.v_head_dim;
  // out[t][h] = w_uv[h]^T o_lat[t][h]: per head [tx, R] x [R, Dv].
  return HeadGemm({o_lat, int64_t{hl} * r, r, w_uv_.data(), false, out, DType::kF32,
                   int64_t{hl} * dv, dv, tx, dv, r});
}

}  // namespace dcp
