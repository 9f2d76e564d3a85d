#include "runtime/sparse_route.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "core/status.h"

namespace dcp {

SparseMqaParams SparseRoute::KernelParams(const KvCacheView& cache, const void* q,
                                          const int32_t* slots, const int32_t* valid_counts,
                                          float* out, float* lse) const {
  const int all_heads = projections_.heads() * comm_.world_size(), r = model_.kv_lora_rank;
  const int width = model_.latent_width();
  SparseMqaParams p;
  p.q = q;
  p.kv_cache = cache.data;
  p.indices = slots;
  p.valid_counts = valid_counts;
  p.out = out;
  p.lse = lse;
  p.dtype = device_.storage_dtype();
  p.kv_format = kv_format_;
  p.num_tokens = static_cast<int>(num_tokens_);
  p.num_heads = all_heads;
  p.head_dim = width;
  p.v_dim = r;
  p.topk = topk_width_;
  p.expected_keys = expected_keys_;
  p.num_slots = cache.num_slots();
  p.q_token_stride = int64_t{all_heads} * width;
  p.q_head_stride = width;
  p.kv_row_stride = cache.row_stride;
  p.indices_token_stride = topk_width_;
  p.out_token_stride = int64_t{all_heads} * r;
  p.out_head_stride = r;
  p.lse_token_stride = all_heads;
  p.scale = scale_;
  return p;
}

int ExpectedSparseKeys(const KvLayout& layout, int rank, const std::vector<int32_t>& token_position,
                       int topk_width) {
  // Token t sees the positions 0..p(t); its top-k selects min(topk, p(t) + 1) of them, and this
  // rank holds local_length(p(t) + 1) of those positions: its expected share of the selection.
  int64_t most = 1;
  for (const int32_t position : token_position) {
    const int64_t length = int64_t{position} + 1;
    const int64_t selected = std::min<int64_t>(topk_width, length);
    const int64_t owned = layout.local_length(length, rank);
    most = std::max(most, (selected * owned + length - 1) / length);
  }
  return static_cast<int>(std::min<int64_t>(most, std::max(topk_width, 1)));
}

absl::Status SparseRoute::Prepare(const Plan& plan, const StepTables& tables, int64_t tx,
                                  int topk_width) {
  num_tokens_ = tx;
  causal_ = topk_width == 0;
  block_size_ = tables.block_size;
  if (tx == 0) return absl::OkStatus();
  // Per token: its request (index into the block tables below) and position.
  std::vector<int32_t> token_request(tx), token_position(tx);
  int num_requests = 0;
  for (const PlannedRequest& req : plan.requests) {
    if (req.token_begin >= tx) break;
    for (int i = 0; i < req.query_len; ++i) {
      token_request[req.token_begin + i] = num_requests;
      token_position[req.token_begin + i] = req.context_len() + i;
    }
    ++num_requests;
  }
  int max_blocks = 1;
  for (int q = 0; q < num_requests; ++q) {
    const int64_t rows = layout_.local_length(plan.requests[q].seq_len, rank_);
    max_blocks = std::max<int>(max_blocks, static_cast<int>((rows + block_size_ - 1) / block_size_));
  }
  std::vector<int32_t> exec_tables(size_t(num_requests) * max_blocks, -1);
  for (int q = 0; q < num_requests; ++q) {
    const int32_t* row = tables.row(plan.requests[q].batch_index);
    const int64_t rows = layout_.local_length(plan.requests[q].seq_len, rank_);
    std::copy(row, row + (rows + block_size_ - 1) / block_size_,
              exec_tables.begin() + size_t(q) * max_blocks);
  }
  if (causal_) {
    // Every causal position: row t is 0..p(t), then -1.
    for (int64_t t = 0; t < tx; ++t) topk_width = std::max(topk_width, token_position[t] + 1);
    std::vector<int32_t> causal(size_t(tx) * topk_width, -1);
    for (int64_t t = 0; t < tx; ++t) {
      for (int j = 0; j <= token_position[t]; ++j) causal[t * topk_width + j] = j;
    }
    DCP_RETURN_IF_ERROR(Upload(device_, causal_topk_, causal).status());
  }
  topk_width_ = topk_width;
  expected_keys_ = ExpectedSparseKeys(layout_, rank_, token_position, topk_width);
  num_requests_ = num_requests;
  max_blocks_ = max_blocks;
  DCP_RETURN_IF_ERROR(Upload(device_, token_request_, token_request).status());
  DCP_RETURN_IF_ERROR(Upload(device_, token_position_, token_position).status());
  DCP_RETURN_IF_ERROR(Upload(device_, block_tables_, exec_tables).status());

  // Buffers of Run.
  const int world = comm_.world_size(), hl = projections_.heads(), r = model_.kv_lora_rank;
  const size_t element = dtype_size(device_.storage_dtype());
  const size_t q_latent_count = size_t(tx) * hl * model_.latent_width();
  const size_t part_count = size_t(tx) * hl * r;
  // This rank's valid slots of each token, compacted to the front of its row, then the counts.
  DCP_RETURN_IF_ERROR(slots_.Reserve(device_, (size_t(tx) * topk_width + tx) * 4).status());
  const int64_t split_bytes =
      device_.SparseMqaWorkspaceBytes(KernelParams(KvCacheView{}, nullptr, nullptr, nullptr,
                                                   nullptr, nullptr));
  if (split_bytes > 0) {
    DCP_RETURN_IF_ERROR(split_workspace_.Reserve(device_, split_bytes).status());
  }
  DCP_RETURN_IF_ERROR(q_latent_.Reserve(device_, q_latent_count * element).status());
  if (world > 1) {  // one rank needs no gather of q' and no partials: the kernel writes the
                    // combined result
    DCP_RETURN_IF_ERROR(q_all_.Reserve(device_, q_latent_count * world * element).status());
    DCP_RETURN_IF_ERROR(partial_.Reserve(device_, part_count * world * 4).status());
    DCP_RETURN_IF_ERROR(lse_partial_.Reserve(device_, size_t(tx) * hl * world * 4).status());
    DCP_RETURN_IF_ERROR(q_heads_.Reserve(device_, q_latent_count * world * element).status());
    DCP_RETURN_IF_ERROR(out_heads_.Reserve(device_, part_count * world * 4).status());
    DCP_RETURN_IF_ERROR(lse_heads_.Reserve(device_, size_t(tx) * hl * world * 4).status());
  }
  DCP_RETURN_IF_ERROR(combined_.Reserve(device_, part_count * 4).status());
  if (device_.storage_dtype() != DType::kF32) {
    DCP_RETURN_IF_ERROR(o_lat_storage_.Reserve(device_, part_count * element).status());
  }
  return combine_.Prepare(tx, hl, r);
}

absl::Status SparseRoute::Run(const KvCacheView& cache, const SparseRouteInputs& in,
                              const RouteOutputs& outputs, StepStats* stats) {
  float* lse = outputs.lse;
  const int world = comm_.world_size(), hl = projections_.heads(), r = model_.kv_lora_rank;
  const int dn = model_.qk_nope_head_dim, dv = model_.v_head_dim;
  const int width = model_.latent_width();
  const DType storage = device_.storage_dtype();  // q', o_lat and the cache rows
  const size_t element = dtype_size(storage);
  const int64_t tx = num_tokens_;
  const int topk_width = topk_width_;
  if (tx == 0) return absl::OkStatus();
  PhaseTimer timer(stats);

  // Top-k positions -> this rank's valid slots, compacted per token, and their counts: the
  // kernel walks only the keys this rank holds. It depends on neither the absorb nor the
  // all-gather below, so it runs beside them: inside the absorb's launch where the device
  // can (the one-token decode on CUDA ranks, eager or captured), else on the device's side
  // stream (joined before the attention kernel). At one decode token it is ~6 us of latency
  // that was on the layer's critical path.
  DCP_ASSIGN_OR_RETURN(void* slots_data, slots_.Get((size_t(tx) * topk_width + tx) * 4));
  auto* slots = static_cast<int32_t*>(slots_data);
  int32_t* valid_counts = slots + size_t(tx) * topk_width;
  const int32_t* topk = causal_ ? causal_topk_.as<int32_t>() : in.topk;
  DCP_CHECK_ARG(topk != nullptr, "the step was planned with a top-k but the layer has none");
  TopkToSlotsParams slot_params{topk, token_request_.as<int32_t>(),
                                token_position_.as<int32_t>(), block_tables_.as<int32_t>(),
                                nullptr, static_cast<int>(tx), topk_width, num_requests_,
                                max_blocks_, layout_.world_size, layout_.interleave, rank_,
                                block_size_, slots, valid_counts};
  // Absorb: q'[t][h], [tx, Hl, R + Dr].
  const size_t q_latent_count = size_t(tx) * hl * width;
  DCP_ASSIGN_OR_RETURN(void* q_latent, q_latent_.Get(q_latent_count * element));
  const bool slots_in_absorb =
      projections_.AbsorbOverlapsSlots(in.q_nope, in.q_rope, tx, q_latent, slot_params);
  if (!slots_in_absorb) {
    DCP_RETURN_IF_ERROR(device_.BeginSide());
    const absl::Status slotted = device_.TopkToSlots(slot_params);
    DCP_RETURN_IF_ERROR(device_.EndSide());
    DCP_RETURN_IF_ERROR(slotted);
  }
  DCP_RETURN_IF_ERROR(projections_.Absorb(in.q_nope, in.q_rope, tx, q_latent,
                                          slots_in_absorb ? &slot_params : nullptr));
  timer.End(&ForwardStats::up_projection_s);

  // All-gather q' along heads: [W, tx, Hl, R + Dr], block q holds rank q's heads. One rank
  // has all heads already: no collective (its enqueue is a fair part of a decode layer's
  // host time).
  timer.Restart();
  void* q_all = q_latent;
  if (world > 1) {
    DCP_ASSIGN_OR_RETURN(q_all, q_all_.Get(q_latent_count * world * element));
    DCP_RETURN_IF_ERROR(comm_.AllGather(q_latent, q_all, q_latent_count, storage));
    if (stats) stats->all_gather_bytes += int64_t(q_latent_count) * element * world;
  }
  timer.End(&ForwardStats::all_gather_comm_s);
  timer.End(&ForwardStats::gather_s);

  // Local sparse MQA of every rank's heads over this rank's keys: partial [W, tx, Hl, R],
  // source-rank-major as the combine's collectives want it. The kernel runs once over all H
  // heads (its head tile is wide: W launches of H/W heads would leave most of it idle), so q'
  // is first rearranged [W, tx, Hl, *] -> [tx, H, *] and the outputs back afterwards.
  timer.Restart();
  const int all_heads = hl * world;
  const size_t part_count = size_t(tx) * hl * r;
  DCP_ASSIGN_OR_RETURN(void* combined_data, combined_.Get(part_count * 4));
  auto* combined = static_cast<float*>(combined_data);
  // One rank: the kernel's output is the combined result already.
  const void* q_heads = q_all;
  float* partial = nullptr;
  float* lse_part = nullptr;
  float* out_heads = combined;
  float* lse_heads = lse;
  if (world > 1) {
    DCP_ASSIGN_OR_RETURN(void* partial_data, partial_.Get(part_count * world * 4));
    DCP_ASSIGN_OR_RETURN(void* lse_part_data, lse_partial_.Get(size_t(tx) * hl * world * 4));
    partial = static_cast<float*>(partial_data);
    lse_part = static_cast<float*>(lse_part_data);
    DCP_ASSIGN_OR_RETURN(void* q_data, q_heads_.Get(q_latent_count * world * element));
    DCP_ASSIGN_OR_RETURN(void* out_data, out_heads_.Get(part_count * world * 4));
    DCP_ASSIGN_OR_RETURN(void* lse_data, lse_heads_.Get(size_t(tx) * all_heads * 4));
    const size_t block = size_t(hl) * width * element;  // one token's heads of one rank
    for (int q = 0; q < world; ++q) {
      DCP_RETURN_IF_ERROR(device_.Copy2D(static_cast<std::byte*>(q_data) + q * block,
                                         block * world,
                                         static_cast<const std::byte*>(q_all) + q * tx * block,
                                         block, block, size_t(tx)));
    }
    q_heads = q_data;
    out_heads = static_cast<float*>(out_data);
    lse_heads = static_cast<float*>(lse_data);
  }
  DCP_RETURN_IF_ERROR(device_.JoinSide());  // the slots and counts
  SparseMqaParams p = KernelParams(cache, q_heads, slots, valid_counts, out_heads, lse_heads);
  if (split_workspace_.capacity() > 0) {
    p.workspace = split_workspace_.data();
    p.workspace_bytes = static_cast<int64_t>(split_workspace_.capacity());
  }
  // One rank, opt-in (MlaProjections::ProjectOutMergesSplits): the kernel leaves the split
  // partials unmerged and ProjectOutMerged below folds the merge into the projection (one
  // launch fewer). W > 1 merges first: the combine's collectives carry merged partials.
  SparseMqaParams::DeferredMerge deferred;
  if (world == 1 && outputs.out_dtype == DType::kF32 && projections_.ProjectOutMergesSplits(tx)) {
    p.deferred_merge = &deferred;
  }
  // One rank whose output projection reads bf16 o_lat (cuBLAS, from 2 tokens up on CUDA ranks):
  // the kernel (or its split merge) writes o_lat as bf16 into the projection's input, the
  // rounding the conversion before it would do, one launch fewer. W > 1 combines fp32.
  void* o_lat_storage = nullptr;
  const bool o_lat_in_storage = world == 1 && p.deferred_merge == nullptr &&
                                storage == DType::kBF16 && projections_.ProjectOutReadsStorage(tx);
  if (o_lat_in_storage) {
    DCP_ASSIGN_OR_RETURN(o_lat_storage, o_lat_storage_.Get(part_count * element));
    p.out_bf16 = o_lat_storage;
    p.out = nullptr;
  }
  DCP_RETURN_IF_ERROR(device_.SparseMqa(p));
  if (world > 1) {
    const size_t out_block = size_t(hl) * r * 4, lse_block = size_t(hl) * 4;
    for (int q = 0; q < world; ++q) {
      DCP_RETURN_IF_ERROR(device_.Copy2D(
          reinterpret_cast<std::byte*>(partial) + q * tx * out_block, out_block,
          reinterpret_cast<const std::byte*>(out_heads) + q * out_block, out_block * world,
          out_block, size_t(tx)));
      DCP_RETURN_IF_ERROR(device_.Copy2D(
          reinterpret_cast<std::byte*>(lse_part) + q * tx * lse_block, lse_block,
          reinterpret_cast<const std::byte*>(lse_heads) + q * lse_block, lse_block * world,
          lse_block, size_t(tx)));
    }
  }
  timer.End(&ForwardStats::attention_s);
  if (stats) stats->flops += 2.0 * double(tx) * hl * world * topk_width / world * (width + r);

  // Combine the W partials of this rank's heads: combined [tx, Hl, R], lse [tx, Hl].
  timer.Restart();
  if (world > 1) {
    DCP_RETURN_IF_ERROR(combine_.Run(partial, lse_part, tx, hl, r, combined, lse, stats));
  }
  timer.End(&ForwardStats::combine_s);

  // out[t][h] = w_uv[h]^T o_lat[t][h]: o_lat read as fp32 where the device's GEMM can (no
  // conversion launch), else converted to the storage dtype first (into o_lat_storage_).
  timer.Restart();
  if (deferred.splits > 1) {
    DCP_RETURN_IF_ERROR(projections_.ProjectOutMerged(deferred, tx,
                                                      static_cast<float*>(outputs.out), lse, hl));
    timer.End(&ForwardStats::up_projection_s);
    if (stats) stats->flops += 2.0 * double(tx) * hl * (double(dn) * r + double(r) * dv);
    return absl::OkStatus();
  }
  if (storage != DType::kF32 && o_lat_storage == nullptr) {
    DCP_ASSIGN_OR_RETURN(o_lat_storage, o_lat_storage_.Get(part_count * element));
  }
  DCP_RETURN_IF_ERROR(projections_.ProjectOut(combined, o_lat_storage, tx, outputs.out,
                                              outputs.out_dtype, o_lat_in_storage));
  timer.End(&ForwardStats::up_projection_s);
  if (stats) stats->flops += 2.0 * double(tx) * hl * (double(dn) * r + double(r) * dv);
  return absl::OkStatus();
}

}  // namespace dcp
