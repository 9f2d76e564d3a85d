#include "runtime/dense_route.h"

#include <algorithm>
#include <cstddef>
#include <limits>

#include "core/status.h"
#include "workspace/chunk_plan.h"

namespace dcp {

absl::Status DenseRoute::ChunkKeys(const Plan& plan, const ContextChunk& chunk, void** k,
                                   void** v, ForwardStats* stats) {
  const int world = comm_.world_size(), rank = cache_.rank(), hl = projections_.heads();
  const int width = model_.latent_width(), qk = model_.qk_head_dim(), dv = model_.v_head_dim;
  const KvCacheView cache = cache_.view();
  const DType storage = device_.storage_dtype();
  const size_t element = dtype_size(storage);
  const PlannedRequest* prefills = plan.requests.data() + plan.num_decodes;
  const int64_t local_rows = plan.workspace.local_rows;
  std::byte* local_region = static_cast<std::byte*>(workspace_);
  std::byte* gathered_region =
      world > 1 ? local_region + size_t(local_rows) * width * element : local_region;

  // Gather this rank's rows of every segment into the local region (padding: zero rows).
  PhaseTimer timer;
  std::vector<int32_t> local_slots(local_rows, -1);
  for (const ChunkSegment& segment : chunk.segments) {
    const PlannedRequest& req = prefills[segment.request];
    DCP_ASSIGN_OR_RETURN(auto table, cache_.table(req.request_id));
    const LocalRange range = SegmentLocalRows(segment, cache_.layout(), rank);
    const int64_t offset = segment.padded_offset / world;
    for (int64_t x = 0; x < range.count; ++x) {
      local_slots[offset + x] = static_cast<int32_t>(
          slot_of_local_row(table.data(), cache.block_size, range.first + x));
    }
  }
  DCP_ASSIGN_OR_RETURN(int32_t* d_local_slots, Upload(device_, local_slots_, local_slots));
  DCP_RETURN_IF_ERROR(device_.GatherRows({cache.data, d_local_slots, local_region, storage,
                                          local_rows, cache.num_slots, width, cache.row_width,
                                          width}));
  if (world > 1) {
    DCP_RETURN_IF_ERROR(device_.Synchronize());  // the all-gather's own time, below
    PhaseTimer comm_timer;
    DCP_RETURN_IF_ERROR(comm_.AllGather(local_region, gathered_region,
                                        size_t(local_rows) * width, storage));
    stats->all_gather_comm_s += comm_timer.Elapsed();
    stats->all_gather_bytes += local_rows * width * int64_t(element) * world;
  }
  // Reorganize into per-request rows in global order.
  DCP_ASSIGN_OR_RETURN(int32_t* d_index,
                       Upload(device_, reorganize_index_,
                              ReorganizeIndex(chunk, local_rows, cache_.layout())));
  DCP_ASSIGN_OR_RETURN(void* rows,
                       chunk_rows_.Reserve(device_, size_t(chunk.num_keys) * width * element));
  DCP_RETURN_IF_ERROR(device_.GatherRows({gathered_region, d_index, rows, storage,
                                          chunk.num_keys, local_rows * world, width, width,
                                          width}));
  DCP_RETURN_IF_ERROR(timer.Stop(device_, &stats->gather_s));
  stats->num_context_rows += chunk.num_keys;

  timer.Restart();
  DCP_ASSIGN_OR_RETURN(*k, k_chunk_.Reserve(device_, size_t(chunk.num_keys) * hl * qk * element));
  DCP_ASSIGN_OR_RETURN(*v, v_chunk_.Reserve(device_, size_t(chunk.num_keys) * hl * dv * element));
  DCP_RETURN_IF_ERROR(projections_.UpProject(rows, chunk.num_keys, *k, *v));
  DCP_RETURN_IF_ERROR(timer.Stop(device_, &stats->up_projection_s));
  stats->flops += 2.0 * double(chunk.num_keys) * hl * model_.kv_lora_rank *
                  (model_.qk_nope_head_dim + dv);
  return absl::OkStatus();
}

absl::Status DenseRoute::Run(const Plan& plan, const DenseRouteInputs& in, float* out,
                             float* lse, ForwardStats* stats) {
  const ModelDims& m = model_;
  const int hl = projections_.heads(), dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim;
  const int dv = m.v_head_dim, qk = dn + dr;
  const DType storage = device_.storage_dtype();
  const size_t element = dtype_size(storage);
  const int64_t tp = plan.num_tokens - plan.num_decode_tokens;
  const int num_prefills = plan.num_prefills;
  const PlannedRequest* prefills = plan.requests.data() + plan.num_decodes;
  PhaseTimer timer;

  // Queries [tp, Hl, Dn + Dr] = [q_nope | q_rope] of the prefill tokens.
  DCP_ASSIGN_OR_RETURN(void* q, q_.Reserve(device_, size_t(tp) * hl * qk * element));
  DCP_RETURN_IF_ERROR(device_.Copy2D(q, size_t(qk) * element, in.q_nope, size_t(dn) * element,
                                     size_t(dn) * element, size_t(tp) * hl));
  DCP_RETURN_IF_ERROR(device_.Copy2D(static_cast<std::byte*>(q) + size_t(dn) * element,
                                     size_t(qk) * element, in.q_rope, size_t(dr) * element,
                                     size_t(dr) * element, size_t(tp) * hl));
  // The new tokens' K/V from their latent rows.
  DCP_ASSIGN_OR_RETURN(void* k_new, k_new_.Reserve(device_, size_t(tp) * hl * qk * element));
  DCP_ASSIGN_OR_RETURN(void* v_new, v_new_.Reserve(device_, size_t(tp) * hl * dv * element));
  DCP_RETURN_IF_ERROR(projections_.UpProject(in.kv_new, tp, k_new, v_new));
  DCP_RETURN_IF_ERROR(timer.Stop(device_, &stats->up_projection_s));
  stats->flops += 2.0 * double(tp) * hl * m.kv_lora_rank * (dn + dv);

  std::vector<int32_t> cu_q(num_prefills + 1, 0);
  int max_query_len = 0;
  for (int p = 0; p < num_prefills; ++p) {
    cu_q[p + 1] = cu_q[p] + prefills[p].query_len;
    max_query_len = std::max(max_query_len, prefills[p].query_len);
  }
  DCP_ASSIGN_OR_RETURN(int32_t* d_cu_q, Upload(device_, cu_seqlens_q_, cu_q));

  DenseMhaParams base;
  base.q = q;
  base.dtype = storage;
  base.num_seqs = num_prefills;
  base.num_heads = hl;
  base.qk_dim = qk;
  base.v_dim = dv;
  base.max_seqlen_q = max_query_len;
  base.q_token_stride = int64_t{hl} * qk;
  base.q_head_stride = qk;
  base.k_token_stride = int64_t{hl} * qk;
  base.k_head_stride = qk;
  base.v_token_stride = int64_t{hl} * dv;
  base.v_head_stride = dv;
  base.out_token_stride = int64_t{hl} * dv;
  base.out_head_stride = dv;
  base.lse_token_stride = hl;
  base.scale = scale_;
  base.cu_seqlens_q = d_cu_q;

  const bool has_context = !plan.chunks.empty();
  const size_t out_count = size_t(tp) * hl * dv, lse_count = size_t(tp) * hl;
  // New tokens, causal. Without context this is the answer.
  timer.Restart();
  float* out_new = out;
  float* lse_new = lse;
  if (has_context) {
    DCP_ASSIGN_OR_RETURN(void* o, out_new_.Reserve(device_, out_count * 4));
    DCP_ASSIGN_OR_RETURN(void* l, lse_new_.Reserve(device_, lse_count * 4));
    out_new = static_cast<float*>(o);
    lse_new = static_cast<float*>(l);
  }
  DenseMhaParams causal = base;
  causal.k = k_new;
  causal.v = v_new;
  causal.out = out_new;
  causal.lse = lse_new;
  causal.cu_seqlens_k = d_cu_q;  // new tokens: as many keys as queries
  causal.max_seqlen_k = max_query_len;
  causal.causal = true;
  DCP_RETURN_IF_ERROR(device_.DenseMha(causal));
  DCP_RETURN_IF_ERROR(timer.Stop(device_, &stats->attention_s));
  for (int p = 0; p < num_prefills; ++p) {
    const double n = prefills[p].query_len;
    stats->flops += 2.0 * hl * (qk + dv) * n * (n + 1) / 2;
  }
  if (!has_context) return absl::OkStatus();

  // Context, chunk by chunk, merged into (out_ctx, lse_ctx), which starts empty.
  DCP_ASSIGN_OR_RETURN(void* out_ctx_data, out_context_.Reserve(device_, out_count * 4));
  DCP_ASSIGN_OR_RETURN(void* lse_ctx_data, lse_context_.Reserve(device_, lse_count * 4));
  DCP_ASSIGN_OR_RETURN(void* out_chunk_data, out_chunk_.Reserve(device_, out_count * 4));
  DCP_ASSIGN_OR_RETURN(void* lse_chunk_data, lse_chunk_.Reserve(device_, lse_count * 4));
  auto* out_ctx = static_cast<float*>(out_ctx_data);
  auto* lse_ctx = static_cast<float*>(lse_ctx_data);
  auto* out_chunk = static_cast<float*>(out_chunk_data);
  auto* lse_chunk = static_cast<float*>(lse_chunk_data);
  DCP_RETURN_IF_ERROR(device_.Memset(out_ctx, 0, out_count * 4));
  const std::vector<float> empty_lse(lse_count, -std::numeric_limits<float>::infinity());
  DCP_RETURN_IF_ERROR(device_.CopyFromHost(lse_ctx, empty_lse.data(), lse_count * 4));

  for (const ContextChunk& chunk : plan.chunks) {
    void* k = nullptr;
    void* v = nullptr;
    DCP_RETURN_IF_ERROR(ChunkKeys(plan, chunk, &k, &v, stats));

    // Every prefill's queries against its keys in this chunk (none: out 0, lse -inf).
    timer.Restart();
    std::vector<int32_t> cu_k(num_prefills + 1, 0);
    std::vector<int64_t> keys_of(num_prefills, 0);
    int max_keys = 0;
    for (const ChunkSegment& segment : chunk.segments) {
      keys_of[segment.request] = segment.end - segment.begin;
      max_keys = std::max<int>(max_keys, static_cast<int>(segment.end - segment.begin));
      stats->flops += 2.0 * hl * (qk + dv) * double(prefills[segment.request].query_len) *
                      double(segment.end - segment.begin);
    }
    for (int p = 0; p < num_prefills; ++p) {
      cu_k[p + 1] = cu_k[p] + static_cast<int32_t>(keys_of[p]);
    }
    DCP_ASSIGN_OR_RETURN(int32_t* d_cu_k, Upload(device_, cu_seqlens_k_, cu_k));
    DenseMhaParams context = base;
    context.k = k;
    context.v = v;
    context.out = out_chunk;
    context.lse = lse_chunk;
    context.cu_seqlens_k = d_cu_k;
    context.max_seqlen_k = max_keys;
    context.causal = false;
    DCP_RETURN_IF_ERROR(device_.DenseMha(context));
    DCP_RETURN_IF_ERROR(device_.MergeStates({out_ctx, lse_ctx, out_chunk, lse_chunk, out_ctx,
                                             lse_ctx, static_cast<int>(tp), hl, dv}));
    DCP_RETURN_IF_ERROR(timer.Stop(device_, &stats->attention_s));
  }
  timer.Restart();
  DCP_RETURN_IF_ERROR(device_.MergeStates(
      {out_ctx, lse_ctx, out_new, lse_new, out, lse, static_cast<int>(tp), hl, dv}));
  return timer.Stop(device_, &stats->attention_s);
}

}  // namespace dcp
