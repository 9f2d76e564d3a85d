#include "runtime/dense_route.h"

#include <algorithm>
#include <cstddef>

#include "core/environment.h"
#include "core/status.h"
#include "workspace/chunk_plan.h"

namespace dcp {
namespace {

// DCP_DENSE_CHUNKED=1: the one-chunk case takes the chunked path too (new tokens and context
// apart, merged by LSE), for comparisons and as the equivalence tests' second path.
bool ForceChunkedPath() {
  static const bool forced = EnvSwitch("DCP_DENSE_CHUNKED", false);
  return forced;
}

}  // namespace

absl::Status DenseRoute::Prepare(const Plan& plan, const StepTables& tables) {
  const int hl = projections_.heads(), qk = model_.qk_head_dim(), dv = model_.v_head_dim;
  const int world = comm_.world_size(), width = model_.latent_width();
  const int kv_width = MlaProjections::KvWidth(model_);
  const size_t element = dtype_size(device_.storage_dtype());
  const PlannedRequest* prefills = plan.requests.data() + plan.num_decodes;
  num_tokens_ = plan.num_tokens - plan.num_decode_tokens;
  num_prefills_ = plan.num_prefills;
  local_rows_ = plan.workspace.local_rows;
  chunks_.clear();
  const int64_t tp = num_tokens_;

  std::vector<int32_t>& cu_q = cu_q_host_;
  cu_q.assign(num_prefills_ + 1, 0);
  max_query_len_ = 0;
  causal_flops_ = 0;
  for (int p = 0; p < num_prefills_; ++p) {
    cu_q[p + 1] = cu_q[p] + prefills[p].query_len;
    max_query_len_ = std::max(max_query_len_, prefills[p].query_len);
    const double n = prefills[p].query_len;
    causal_flops_ += 2.0 * hl * (qk + dv) * n * (n + 1) / 2;
  }
  DCP_RETURN_IF_ERROR(Upload(device_, cu_seqlens_q_, cu_q).status());

  // Per chunk: this rank's rows of every segment (padding: -1, a zero row), the reorganize map
  // into global order, and the keys of each prefill.
  std::vector<int32_t> local_slots, reorganize;
  std::vector<int32_t>& cu_k = cu_k_host_;
  cu_k.clear();
  max_chunk_keys_ = 0;
  for (const ContextChunk& chunk : plan.chunks) {
    ChunkSteps steps;
    steps.slots_offset = static_cast<int64_t>(local_slots.size());
    steps.index_offset = static_cast<int64_t>(reorganize.size());
    steps.cu_k_offset = static_cast<int64_t>(cu_k.size());
    steps.num_keys = chunk.num_keys;
    local_slots.resize(local_slots.size() + local_rows_, -1);
    for (const ChunkSegment& segment : chunk.segments) {
      const int32_t* row = tables.row(prefills[segment.request].batch_index);
      const LocalRange range = SegmentLocalRows(segment, layout_, rank_);
      const int64_t offset = steps.slots_offset + segment.padded_offset / world;
      for (int64_t x = 0; x < range.count; ++x) {
        local_slots[offset + x] =
            static_cast<int32_t>(slot_of_local_row(row, tables.block_size, range.first + x));
      }
    }
    const std::vector<int32_t> index = ReorganizeIndex(chunk, local_rows_, layout_);
    reorganize.insert(reorganize.end(), index.begin(), index.end());
    std::vector<int64_t> keys_of(num_prefills_, 0);
    for (const ChunkSegment& segment : chunk.segments) {
      keys_of[segment.request] = segment.end - segment.begin;
      steps.max_keys = std::max<int>(steps.max_keys, static_cast<int>(segment.end - segment.begin));
      steps.flops += 2.0 * hl * (qk + dv) * double(prefills[segment.request].query_len) *
                     double(segment.end - segment.begin);
    }
    cu_k.push_back(0);
    for (int p = 0; p < num_prefills_; ++p) {
      cu_k.push_back(cu_k.back() + static_cast<int32_t>(keys_of[p]));
    }
    max_chunk_keys_ = std::max(max_chunk_keys_, steps.num_keys);
    chunks_.push_back(steps);
  }
  const size_t out_count = size_t(tp) * hl * dv, lse_count = size_t(tp) * hl;
  // The whole context in one chunk: each prefill's rows [context | new] (see dense_route.h).
  fused_ = chunks_.size() == 1 && !ForceChunkedPath();
  if (fused_) DCP_RETURN_IF_ERROR(PrepareFused(plan.chunks.front(), reorganize, cu_k));
  if (!chunks_.empty()) {
    DCP_RETURN_IF_ERROR(Upload(device_, local_slots_, local_slots).status());
    DCP_RETURN_IF_ERROR(Upload(device_, reorganize_index_, reorganize).status());
    DCP_RETURN_IF_ERROR(Upload(device_, cu_seqlens_k_, cu_k).status());
  }
  if (fused_) {
    const int64_t rows = chunks_.front().num_keys + tp;
    DCP_RETURN_IF_ERROR(chunk_rows_.Reserve(device_, size_t(rows) * width * element).status());
    DCP_RETURN_IF_ERROR(
        kv_chunk_.Reserve(device_, size_t(rows) * hl * kv_width * element).status());
    DCP_RETURN_IF_ERROR(q_.Reserve(device_, size_t(tp) * hl * qk * element).status());
    DCP_RETURN_IF_ERROR(projections_.TuneUpProject(rows));
    DCP_RETURN_IF_ERROR(PrepareAttention());
    return projections_.Prepare(rows);
  }
  if (!chunks_.empty()) {
    // The first chunk writes the context's (out, lse) itself; a chunk after it writes its own
    // and is merged in.
    for (ScratchBuffer* b : {&out_new_, &out_context_}) {
      DCP_RETURN_IF_ERROR(b->Reserve(device_, out_count * 4).status());
    }
    for (ScratchBuffer* b : {&lse_new_, &lse_context_}) {
      DCP_RETURN_IF_ERROR(b->Reserve(device_, lse_count * 4).status());
    }
    if (chunks_.size() > 1) {
      DCP_RETURN_IF_ERROR(out_chunk_.Reserve(device_, out_count * 4).status());
      DCP_RETURN_IF_ERROR(lse_chunk_.Reserve(device_, lse_count * 4).status());
    }
    DCP_RETURN_IF_ERROR(
        chunk_rows_.Reserve(device_, size_t(max_chunk_keys_) * width * element).status());
    DCP_RETURN_IF_ERROR(
        kv_chunk_.Reserve(device_, size_t(max_chunk_keys_) * hl * kv_width * element).status());
  }
  DCP_RETURN_IF_ERROR(q_.Reserve(device_, size_t(tp) * hl * qk * element).status());
  DCP_RETURN_IF_ERROR(kv_new_.Reserve(device_, size_t(tp) * hl * kv_width * element).status());
  // The GEMM algorithm of every up-projection this step runs (a no-op for a size class seen).
  DCP_RETURN_IF_ERROR(projections_.TuneUpProject(tp));
  for (const ChunkSteps& chunk : chunks_) {
    DCP_RETURN_IF_ERROR(projections_.TuneUpProject(chunk.num_keys));
  }
  DCP_RETURN_IF_ERROR(PrepareAttention());
  return projections_.Prepare(std::max(tp, max_chunk_keys_));
}

absl::Status DenseRoute::PrepareAttention() {
  if (num_tokens_ == 0) return absl::OkStatus();
  // The DenseMha calls Run makes, as Run makes them (sizes, strides, host cu_seqlens; no
  // pointers): the device prepares each (cuDNN builds its graph and reserves its scratch here,
  // not inside Run).
  const DenseMhaParams base = QueryParams(nullptr);
  if (fused_) return device_.PrepareDenseMha(FusedAttention(base));
  DCP_RETURN_IF_ERROR(device_.PrepareDenseMha(NewTokenAttention(base)));
  for (const ChunkSteps& chunk : chunks_) {
    DCP_RETURN_IF_ERROR(device_.PrepareDenseMha(ChunkAttention(base, chunk)));
  }
  return absl::OkStatus();
}

DenseMhaParams DenseRoute::FusedAttention(DenseMhaParams p) const {
  p.cu_seqlens_k = cu_seqlens_k_.as<int32_t>();
  p.host_cu_seqlens_k = cu_k_host_.data();
  p.max_seqlen_k = max_fused_keys_;
  p.causal = true;  // bottom-right: the new tokens come after their context
  return p;
}

DenseMhaParams DenseRoute::NewTokenAttention(DenseMhaParams p) const {
  p.cu_seqlens_k = p.cu_seqlens_q;  // new tokens: as many keys as queries
  p.host_cu_seqlens_k = cu_q_host_.data();
  p.max_seqlen_k = max_query_len_;
  p.causal = true;
  return p;
}

DenseMhaParams DenseRoute::ChunkAttention(DenseMhaParams p, const ChunkSteps& chunk) const {
  p.cu_seqlens_k = cu_seqlens_k_.as<int32_t>() + chunk.cu_k_offset;
  p.host_cu_seqlens_k = cu_k_host_.data() + chunk.cu_k_offset;
  p.max_seqlen_k = chunk.max_keys;
  p.causal = false;
  return p;
}

absl::Status DenseRoute::PrepareFused(const ContextChunk& chunk, std::vector<int32_t>& reorganize,
                                      std::vector<int32_t>& cu_k) {
  const int64_t tp = num_tokens_;
  const std::vector<int32_t>& cu_q = cu_q_host_;
  // Prefill p's context length (its keys in the one chunk: positions [0, context)) and its
  // first row in the [context | new] layout.
  std::vector<int64_t> context(num_prefills_, 0);
  for (const ChunkSegment& segment : chunk.segments) {
    context[segment.request] = std::max(context[segment.request], segment.end);
  }
  std::vector<int32_t> fused_cu(num_prefills_ + 1, 0);
  max_fused_keys_ = 0;
  for (int p = 0; p < num_prefills_; ++p) {
    const int64_t keys = context[p] + (cu_q[p + 1] - cu_q[p]);
    fused_cu[p + 1] = static_cast<int32_t>(fused_cu[p] + keys);
    max_fused_keys_ = std::max<int>(max_fused_keys_, static_cast<int>(keys));
  }
  if (int64_t{fused_cu.back()} != chunk.num_keys + tp) {
    return DCP_ERROR(Internal, "DenseRoute: the one chunk holds %d keys for %d contexts",
                     chunk.num_keys, fused_cu.back() - tp);
  }
  // The reorganize map over [context | new] rows: a context key where the chunk's map put it,
  // -1 (a zero row, overwritten by the scatter of the fresh rows) where a new token goes.
  std::vector<int32_t> fused(static_cast<size_t>(fused_cu.back()), -1);
  for (const ChunkSegment& segment : chunk.segments) {
    for (int64_t g = segment.begin; g < segment.end; ++g) {
      fused[fused_cu[segment.request] + g] = reorganize[segment.key_offset + g - segment.begin];
    }
  }
  std::vector<int32_t> new_rows(static_cast<size_t>(tp));
  for (int p = 0; p < num_prefills_; ++p) {
    for (int32_t i = cu_q[p]; i < cu_q[p + 1]; ++i) {
      new_rows[i] = static_cast<int32_t>(fused_cu[p] + context[p] + (i - cu_q[p]));
    }
  }
  DCP_RETURN_IF_ERROR(Upload(device_, new_rows_index_, new_rows).status());
  reorganize = std::move(fused);
  cu_k = std::move(fused_cu);
  return absl::OkStatus();
}

absl::Status DenseRoute::ChunkKeys(const KvCacheView& cache, const ChunkSteps& chunk, void* kv,
                                   StepStats* stats, const void* new_rows,
                                   absl::Span<const RowCopy> also) {
  const int world = comm_.world_size(), hl = projections_.heads();
  const int width = model_.latent_width();
  const DType storage = device_.storage_dtype();
  const size_t element = dtype_size(storage);
  const int64_t local_rows = local_rows_;
  std::byte* local_region = static_cast<std::byte*>(workspace_);
  std::byte* gathered_region =
      world > 1 ? local_region + size_t(local_rows) * width * element : local_region;

  // Gather this rank's rows of every segment into the local region (padding: zero rows).
  // fp8_ds_mla caches move their 656-byte rows as they are (328 two-byte units) through the
  // paged gather and the all-gather (-43% bytes against bf16 rows), and the reorganize below
  // dequantizes them; a zero row dequantizes to zeros. The raw rows fit the regions sized for
  // rows of the storage dtype (656 <= 576 x 2 bytes).
  const bool fp8 = cache.format == KvCacheDType::kFp8DsMla;
  constexpr int kRawUnits = fp8_ds_mla::kRowBytes / 2;
  const DType moved = fp8 ? DType::kBF16 : storage;
  const int moved_width = fp8 ? kRawUnits : width;
  const int64_t moved_bytes = fp8 ? int64_t{fp8_ds_mla::kRowBytes} : width * int64_t(element);
  PhaseTimer timer(stats);
  DCP_RETURN_IF_ERROR(device_.GatherRows(
      {cache.data, local_slots_.as<int32_t>() + chunk.slots_offset, local_region, moved,
       local_rows, cache.num_slots(), moved_width, fp8 ? kRawUnits : cache.row_stride,
       moved_width}));
  if (world > 1) {
    PhaseTimer comm_timer(stats);  // the all-gather's own time
    DCP_RETURN_IF_ERROR(comm_.AllGather(local_region, gathered_region,
                                        size_t(local_rows) * moved_width, moved));
    comm_timer.End(&ForwardStats::all_gather_comm_s);
    if (stats) stats->all_gather_bytes += local_rows * moved_bytes * world;
  }
  // Reorganize into per-request rows in global order (fp8: dequantized to the storage dtype);
  // one chunk: [context | new] per prefill, the new rows zero until the scatter below.
  const int64_t num_rows = fused_ ? chunk.num_keys + num_tokens_ : chunk.num_keys;
  DCP_ASSIGN_OR_RETURN(void* rows, chunk_rows_.Get(size_t(num_rows) * width * element));
  if (fp8) {
    Fp8DsMlaGatherParams p;
    p.cache = static_cast<const uint8_t*>(static_cast<const void*>(gathered_region));
    p.index = reorganize_index_.as<int32_t>() + chunk.index_offset;
    p.dst = rows;
    p.dst_dtype = storage;
    p.num_rows = num_rows;
    p.num_src_rows = local_rows * world;
    p.cache_row_bytes = fp8_ds_mla::kRowBytes;
    p.dst_row_stride = width;
    DCP_RETURN_IF_ERROR(device_.GatherFp8DsMlaRows(p));
  } else {
    DCP_RETURN_IF_ERROR(device_.GatherRows({gathered_region,
                                            reorganize_index_.as<int32_t>() + chunk.index_offset,
                                            rows, storage, num_rows, local_rows * world,
                                            width, width, width}));
  }
  if (new_rows != nullptr) {  // the new tokens' fresh latent rows after their context
    DCP_RETURN_IF_ERROR(device_.ScatterRows({new_rows, new_rows_index_.as<int32_t>(), rows,
                                             storage, num_tokens_, num_rows, width, width,
                                             width}));
  }
  timer.End(&ForwardStats::gather_s);

  timer.Restart();
  DCP_RETURN_IF_ERROR(projections_.UpProject(rows, num_rows, kv, also));
  timer.End(&ForwardStats::up_projection_s);
  if (stats) {
    stats->num_context_rows += chunk.num_keys;
    stats->flops += 2.0 * double(num_rows) * hl * model_.kv_lora_rank *
                    (model_.qk_nope_head_dim + model_.v_head_dim);
  }
  return absl::OkStatus();
}

DenseMhaParams DenseRoute::QueryParams(const void* q) const {
  const ModelDims& m = model_;
  const int hl = projections_.heads(), qk = m.qk_head_dim(), dv = m.v_head_dim;
  const int kv_width = MlaProjections::KvWidth(m);
  DenseMhaParams p;
  p.q = q;
  p.dtype = device_.storage_dtype();
  p.num_seqs = num_prefills_;
  p.num_heads = hl;
  p.qk_dim = qk;
  p.v_dim = dv;
  p.max_seqlen_q = max_query_len_;
  p.q_token_stride = int64_t{hl} * qk;
  p.q_head_stride = qk;
  p.k_token_stride = int64_t{hl} * kv_width;
  p.k_head_stride = kv_width;
  p.v_token_stride = int64_t{hl} * kv_width;
  p.v_head_stride = kv_width;
  p.out_token_stride = int64_t{hl} * dv;
  p.out_head_stride = dv;
  p.lse_token_stride = hl;
  p.scale = scale_;
  p.cu_seqlens_q = cu_seqlens_q_.as<int32_t>();
  p.host_cu_seqlens_q = cu_q_host_.data();
  return p;
}

absl::Status DenseRoute::RunFused(const KvCacheView& cache, const DenseRouteInputs& in,
                                  const RouteOutputs& outputs, void* q,
                                  absl::Span<const RowCopy> query_copies, StepStats* stats) {
  const int hl = projections_.heads(), qk = model_.qk_head_dim();
  const int kv_width = MlaProjections::KvWidth(model_);
  const size_t element = dtype_size(device_.storage_dtype());
  const ChunkSteps& chunk = chunks_.front();
  const int64_t rows = chunk.num_keys + num_tokens_;
  // Every prefill's keys [context | new], up-projected with the queries' assembly beside.
  DCP_ASSIGN_OR_RETURN(void* kv, kv_chunk_.Get(size_t(rows) * hl * kv_width * element));
  DCP_RETURN_IF_ERROR(ChunkKeys(cache, chunk, kv, stats, in.kv_new, query_copies));
  PhaseTimer timer(stats);
  DenseMhaParams attention = FusedAttention(QueryParams(q));
  attention.k = kv;
  attention.v = static_cast<std::byte*>(kv) + size_t(qk) * element;
  attention.out = outputs.out;
  attention.out_dtype = outputs.out_dtype;
  attention.lse = outputs.lse;
  DCP_RETURN_IF_ERROR(device_.DenseMha(attention));
  timer.End(&ForwardStats::attention_s);
  if (stats) stats->flops += causal_flops_ + chunk.flops;
  return absl::OkStatus();
}

absl::Status DenseRoute::Run(const KvCacheView& cache, const DenseRouteInputs& in,
                             const RouteOutputs& outputs, StepStats* stats) {
  const ModelDims& m = model_;
  const int hl = projections_.heads(), dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim;
  const int dv = m.v_head_dim, qk = dn + dr, kv_width = MlaProjections::KvWidth(m);
  const DType storage = device_.storage_dtype();
  const size_t element = dtype_size(storage);
  const int64_t tp = num_tokens_;
  if (tp == 0) return absl::OkStatus();

  // Queries [tp, Hl, Dr + Dn] = [q_rope | q_nope] of the prefill tokens: the head dims in the
  // order of UpProject's keys [k_pe | k_nope] (a dot product does not care about the order).
  // Both halves are copied by the launch that broadcasts k_pe (one pass, 16-byte units).
  DCP_ASSIGN_OR_RETURN(void* q, q_.Get(size_t(tp) * hl * qk * element));
  RowCopy q_rope_copy, q_nope_copy;
  q_rope_copy.src = in.q_rope;
  q_rope_copy.dst = q;
  q_rope_copy.rows = tp * hl;
  q_rope_copy.width = dr;
  q_rope_copy.src_row_stride = dr;
  q_rope_copy.dst_row_stride = qk;
  q_nope_copy.src = in.q_nope;
  q_nope_copy.dst = static_cast<std::byte*>(q) + size_t(dr) * element;
  q_nope_copy.rows = tp * hl;
  q_nope_copy.width = dn;
  q_nope_copy.src_row_stride = dn;
  q_nope_copy.dst_row_stride = qk;
  const RowCopy query_copies[] = {q_rope_copy, q_nope_copy};
  if (fused_) return RunFused(cache, in, outputs, q, query_copies, stats);
  PhaseTimer timer(stats);
  // The new tokens' K/V from their latent rows: kv [tp, Hl, Dr + Dn + Dv].
  DCP_ASSIGN_OR_RETURN(void* kv_new, kv_new_.Get(size_t(tp) * hl * kv_width * element));
  DCP_RETURN_IF_ERROR(projections_.UpProject(in.kv_new, tp, kv_new, query_copies));
  timer.End(&ForwardStats::up_projection_s);
  if (stats) stats->flops += 2.0 * double(tp) * hl * m.kv_lora_rank * (dn + dv);
  // K and V are views of a kv buffer: k = kv[:, :, :qk], v = kv[:, :, qk:].
  const auto v_of = [&](void* kv) -> void* {
    return static_cast<std::byte*>(kv) + size_t(qk) * element;
  };

  DenseMhaParams base = QueryParams(q);

  const bool has_context = !chunks_.empty();
  const size_t out_count = size_t(tp) * hl * dv, lse_count = size_t(tp) * hl;
  // New tokens, causal. Without context this is the answer, written in the caller's dtype.
  timer.Restart();
  void* out_new = outputs.out;
  float* lse_new = outputs.lse;
  DType out_new_dtype = outputs.out_dtype;
  if (has_context) {
    out_new_dtype = DType::kF32;
    DCP_ASSIGN_OR_RETURN(void* o, out_new_.Get(out_count * 4));
    DCP_ASSIGN_OR_RETURN(void* l, lse_new_.Get(lse_count * 4));
    out_new = o;
    lse_new = static_cast<float*>(l);
  }
  DenseMhaParams causal = NewTokenAttention(base);
  causal.k = kv_new;
  causal.v = v_of(kv_new);
  causal.out = out_new;
  causal.out_dtype = out_new_dtype;
  causal.lse = lse_new;
  DCP_RETURN_IF_ERROR(device_.DenseMha(causal));
  timer.End(&ForwardStats::attention_s);
  if (stats) stats->flops += causal_flops_;
  if (!has_context) return absl::OkStatus();

  // Context, chunk by chunk: the first chunk's (out, lse) is the context's so far (a merge
  // into an empty state would copy it), each later one is merged into it.
  DCP_ASSIGN_OR_RETURN(void* out_ctx_data, out_context_.Get(out_count * 4));
  DCP_ASSIGN_OR_RETURN(void* lse_ctx_data, lse_context_.Get(lse_count * 4));
  DCP_ASSIGN_OR_RETURN(void* kv,
                       kv_chunk_.Get(size_t(max_chunk_keys_) * hl * kv_width * element));
  auto* out_ctx = static_cast<float*>(out_ctx_data);
  auto* lse_ctx = static_cast<float*>(lse_ctx_data);
  float *out_chunk = nullptr, *lse_chunk = nullptr;
  if (chunks_.size() > 1) {
    DCP_ASSIGN_OR_RETURN(void* out_chunk_data, out_chunk_.Get(out_count * 4));
    DCP_ASSIGN_OR_RETURN(void* lse_chunk_data, lse_chunk_.Get(lse_count * 4));
    out_chunk = static_cast<float*>(out_chunk_data);
    lse_chunk = static_cast<float*>(lse_chunk_data);
  }

  for (size_t c = 0; c < chunks_.size(); ++c) {
    const ChunkSteps& chunk = chunks_[c];
    const bool first = c == 0;
    DCP_RETURN_IF_ERROR(ChunkKeys(cache, chunk, kv, stats));
    // Every prefill's queries against its keys in this chunk (none: out 0, lse -inf).
    timer.Restart();
    DenseMhaParams context = ChunkAttention(base, chunk);
    context.k = kv;
    context.v = v_of(kv);
    context.out = first ? out_ctx : out_chunk;
    context.lse = first ? lse_ctx : lse_chunk;
    DCP_RETURN_IF_ERROR(device_.DenseMha(context));
    if (!first) {
      DCP_RETURN_IF_ERROR(device_.MergeStates({out_ctx, lse_ctx, out_chunk, lse_chunk, out_ctx,
                                               lse_ctx, static_cast<int>(tp), hl, dv}));
    }
    timer.End(&ForwardStats::attention_s);
    if (stats) stats->flops += chunk.flops;
  }
  // Context and new tokens merged into the caller's out; a bf16 out by way of out_ctx (merged
  // in place, then rounded once).
  timer.Restart();
  const bool f32_out = outputs.out_dtype == DType::kF32;
  float* merged = f32_out ? static_cast<float*>(outputs.out) : out_ctx;
  DCP_RETURN_IF_ERROR(device_.MergeStates({out_ctx, lse_ctx, static_cast<float*>(out_new), lse_new,
                                           merged, outputs.lse, static_cast<int>(tp), hl, dv}));
  if (!f32_out) {
    DCP_RETURN_IF_ERROR(
        device_.Convert(outputs.out, outputs.out_dtype, merged, DType::kF32, out_count));
  }
  timer.End(&ForwardStats::attention_s);
  return absl::OkStatus();
}

}  // namespace dcp
