#include "runtime/worker.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "runtime/logging.h"
#include "runtime/status.h"

namespace dcp {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

absl::Status CheckView(const char* name, const void* data, DType dtype, MemorySpace memory,
                       const std::vector<int64_t>& shape, std::vector<int64_t> expected,
                       bool float_dtype, MemorySpace device_memory) {
  if (shape != expected) {
    return DCP_ERROR(InvalidArgument, "%s has shape %s, expected %s", name, ShapeString(shape),
                     ShapeString(expected));
  }
  if (float_dtype) {
    DCP_CHECK_ARG(dtype == DType::kF32 || dtype == DType::kBF16, "%s must be F32 or BF16, got %s",
                  name, dtype_name(dtype));
  } else {
    DCP_CHECK_ARG(dtype == DType::kI32, "%s must be I32, got %s", name, dtype_name(dtype));
  }
  DCP_CHECK_ARG(memory == MemorySpace::kHost || memory == device_memory,
                "%s is device memory but this rank's device works on host memory", name);
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  DCP_CHECK_ARG(count == 0 || data != nullptr, "%s has no data pointer", name);
  return absl::OkStatus();
}

}  // namespace

Worker::Worker(const DcpOptions& options, Communicator& comm, Device& device)
    : options_(options), comm_(comm), device_(device), scratch_(kNumScratch) {}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(const DcpOptions& options,
                                                       Communicator& comm, Device& device,
                                                       const LayerWeights& weights) {
  DCP_RETURN_IF_ERROR(ValidateConfigs(options.model, options.dcp, options.scheduler,
                                      options.attention));
  DCP_CHECK_ARG(options.attention.kv_cache_dtype == KvCacheDType::kBF16,
                "attention.kv_cache_dtype %s: the FP8 cache kernels exist (cache write, gather, "
                "sparse MQA) but the worker does not use them yet; run with bf16",
                kv_cache_dtype_name(options.attention.kv_cache_dtype));
  DCP_CHECK_ARG(options.dcp.world_size == comm.world_size() && options.dcp.rank == comm.rank(),
                "dcp.world_size/rank (%d, %d) disagree with the communicator (%d, %d)",
                options.dcp.world_size, options.dcp.rank, comm.world_size(), comm.rank());
  auto worker = std::unique_ptr<Worker>(new Worker(options, comm, device));
  Worker& w = *worker;
  const ModelDims& m = options.model;
  w.heads_ = m.num_heads / options.dcp.world_size;
  w.width_ = m.latent_width();
  w.storage_ = device.storage_dtype();
  w.element_ = dtype_size(w.storage_);
  w.scale_ = m.scale();
  w.layout_ = KvLayout{options.dcp.world_size, options.dcp.interleave};

  // Prefill backend and workspace.
  DCP_ASSIGN_OR_RETURN(w.planner_.dense_mha_available,
                       ResolvePrefillBackend(options.attention,
                                             device.DenseMhaSupport(m.qk_head_dim(),
                                                                    m.v_head_dim)));
  w.planner_.scheduler = options.scheduler;
  w.planner_.attention = options.attention;
  w.planner_.layout = w.layout_;
  DCP_ASSIGN_OR_RETURN(
      w.planner_.workspace,
      ComputeWorkspaceSize({options.scheduler.block_size, options.scheduler.max_num_seqs,
                            options.scheduler.max_model_len, options.attention.index_topk,
                            options.dcp.world_size, options.dcp.interleave, w.width_,
                            options.workspace_rows_override}));

  // KV cache: enough blocks for max_num_seqs full sequences unless configured.
  const int block_size = options.scheduler.block_size;
  int64_t num_blocks = options.scheduler.num_kv_blocks;
  if (num_blocks == 0) {
    const int64_t per_request =
        (w.layout_.local_length(options.scheduler.max_model_len, 0) + block_size - 1) / block_size;
    num_blocks = per_request * options.scheduler.max_num_seqs;
  }
  w.num_slots_ = num_blocks * block_size;
  DCP_CHECK_ARG(w.num_slots_ <= std::numeric_limits<int32_t>::max(),
                "KV cache of %d slots exceeds the int32 slot range; lower "
                "scheduler.num_kv_blocks or max_num_seqs",
                w.num_slots_);
  w.tables_ = std::make_unique<BlockTables>(static_cast<int>(num_blocks), block_size, w.layout_,
                                            options.dcp.rank);
  DCP_ASSIGN_OR_RETURN(w.cache_, device.Allocate(size_t(w.num_slots_) * w.width_ * w.element_));
  DCP_RETURN_IF_ERROR(device.Memset(w.cache_.data(), 0, w.cache_.bytes()));

  // Weights of this rank's heads, in the storage dtype.
  const int64_t hl = w.heads_;
  DCP_RETURN_IF_ERROR(CheckView("weights.w_uk", weights.w_uk.data, weights.w_uk.dtype,
                                weights.w_uk.memory, weights.w_uk.shape,
                                {hl, m.qk_nope_head_dim, m.kv_lora_rank}, true,
                                device.memory_space()));
  DCP_RETURN_IF_ERROR(CheckView("weights.w_uv", weights.w_uv.data, weights.w_uv.dtype,
                                weights.w_uv.memory, weights.w_uv.shape,
                                {hl, m.kv_lora_rank, m.v_head_dim}, true, device.memory_space()));
  for (auto [view, buffer] : {std::pair{&weights.w_uk, &w.w_uk_}, std::pair{&weights.w_uv, &w.w_uv_}}) {
    DCP_ASSIGN_OR_RETURN(*buffer, device.Allocate(view->num_elements() * w.element_));
    Buffer staging;
    const void* source = view->data;
    if (view->memory != device.memory_space()) {
      DCP_ASSIGN_OR_RETURN(staging, device.Allocate(view->num_elements() * dtype_size(view->dtype)));
      DCP_RETURN_IF_ERROR(device.CopyFromHost(staging.data(), view->data, staging.bytes()));
      source = staging.data();
    }
    DCP_RETURN_IF_ERROR(
        device.Convert(buffer->data(), w.storage_, source, view->dtype, view->num_elements()));
    DCP_RETURN_IF_ERROR(device.Synchronize());
  }
  if (w.planner_.dense_mha_available) {
    DCP_ASSIGN_OR_RETURN(w.workspace_,
                         device.Allocate(size_t(w.planner_.workspace.total_rows) * w.width_ *
                                         w.element_));
  }
  DCP_LOG(INFO) << "worker ready: " << hl << " heads, " << num_blocks << " KV blocks of "
                << block_size << ", workspace S=" << w.planner_.workspace.rows_per_chunk
                << " rows, dense MHA " << (w.planner_.dense_mha_available ? "on" : "off")
                << ", device " << device.name() << ", comm " << comm.name();
  return worker;
}

absl::StatusOr<void*> Worker::scratch(Scratch which, size_t bytes) {
  Buffer& buffer = scratch_[which];
  if (buffer.bytes() < bytes || buffer.data() == nullptr) {
    buffer.reset();
    DCP_ASSIGN_OR_RETURN(buffer, device_.Allocate(std::max<size_t>(bytes, 64)));
  }
  return buffer.data();
}

template <typename T>
absl::StatusOr<T*> Worker::upload(Scratch which, const std::vector<T>& values) {
  DCP_ASSIGN_OR_RETURN(void* data, scratch(which, values.size() * sizeof(T)));
  DCP_RETURN_IF_ERROR(device_.CopyFromHost(data, values.data(), values.size() * sizeof(T)));
  return static_cast<T*>(data);
}

absl::StatusOr<void*> Worker::stage(Scratch which, const TensorView& view, DType dtype) {
  const size_t count = static_cast<size_t>(view.num_elements());
  DCP_ASSIGN_OR_RETURN(void* data, scratch(which, count * dtype_size(dtype)));
  if (count == 0) return data;
  if (view.memory == device_.memory_space()) {
    DCP_RETURN_IF_ERROR(device_.Convert(data, dtype, view.data, view.dtype, count));
    return data;
  }
  // Host input on a device rank: copy as is, then convert on the device.
  Buffer staging;
  DCP_ASSIGN_OR_RETURN(staging, device_.Allocate(count * dtype_size(view.dtype)));
  DCP_RETURN_IF_ERROR(device_.CopyFromHost(staging.data(), view.data, staging.bytes()));
  DCP_RETURN_IF_ERROR(device_.Convert(data, dtype, staging.data(), view.dtype, count));
  DCP_RETURN_IF_ERROR(device_.Synchronize());
  return data;
}

absl::Status Worker::AddRequest(int64_t request_id) {
  DCP_RETURN_IF_ERROR(tables_->AddRequest(request_id, 0));
  cached_[request_id] = 0;
  return absl::OkStatus();
}

absl::Status Worker::FreeRequest(int64_t request_id) {
  DCP_RETURN_IF_ERROR(tables_->FreeRequest(request_id));
  cached_.erase(request_id);
  return absl::OkStatus();
}

absl::Status Worker::LoadCachedKv(int64_t request_id, int64_t num_tokens,
                                  const TensorView& local_rows) {
  DCP_CHECK_ARG(tables_->HasRequest(request_id), "request %d is not registered", request_id);
  DCP_CHECK_ARG(num_tokens >= 0 && num_tokens <= options_.scheduler.max_model_len,
                "request %d: %d cached tokens outside [0, max_model_len = %d]", request_id,
                num_tokens, options_.scheduler.max_model_len);
  const int64_t rows = layout_.local_length(num_tokens, options_.dcp.rank);
  DCP_RETURN_IF_ERROR(CheckView("cached KV rows", local_rows.data, local_rows.dtype,
                                local_rows.memory, local_rows.shape, {rows, width_}, true,
                                device_.memory_space()));
  DCP_RETURN_IF_ERROR(tables_->Grow(request_id, num_tokens));
  DCP_ASSIGN_OR_RETURN(void* staged, stage(kKvNew, local_rows, storage_));
  DCP_ASSIGN_OR_RETURN(auto table, tables_->table(request_id));
  std::vector<int32_t> slots(rows);
  for (int64_t j = 0; j < rows; ++j) {
    slots[j] = static_cast<int32_t>(slot_of_local_row(table.data(), tables_->block_size(), j));
  }
  DCP_ASSIGN_OR_RETURN(int32_t* index, upload(kCacheSlots, slots));
  DCP_RETURN_IF_ERROR(device_.ScatterRows({staged, index, cache_.data(), storage_, rows,
                                           num_slots_, width_, width_, width_}));
  DCP_RETURN_IF_ERROR(device_.Synchronize());
  cached_[request_id] = num_tokens;
  return absl::OkStatus();
}

absl::Status Worker::ValidateInputs(absl::Span<const BatchRequest> batch,
                                    const BatchInputs& inputs, const BatchOutputs& outputs) {
  const ModelDims& m = options_.model;
  DCP_RETURN_IF_ERROR(ValidateBatch(batch, options_.scheduler));
  int64_t num_tokens = 0;
  int max_seq_len = 0;
  for (const BatchRequest& r : batch) {
    auto it = cached_.find(r.request_id);
    DCP_CHECK_ARG(it != cached_.end(), "request id %d is not registered (AddRequest first)",
                  r.request_id);
    DCP_CHECK_ARG(it->second == r.seq_len - r.query_len,
                  "request id %d has %d cached tokens but the batch gives it seq_len %d and "
                  "query_len %d (context %d)",
                  r.request_id, it->second, r.seq_len, r.query_len, r.seq_len - r.query_len);
    num_tokens += r.query_len;
    max_seq_len = std::max(max_seq_len, r.seq_len);
  }
  const int64_t hl = heads_;
  const MemorySpace memory = device_.memory_space();
  DCP_RETURN_IF_ERROR(CheckView("q_nope", inputs.q_nope.data, inputs.q_nope.dtype,
                                inputs.q_nope.memory, inputs.q_nope.shape,
                                {num_tokens, hl, m.qk_nope_head_dim}, true, memory));
  DCP_RETURN_IF_ERROR(CheckView("q_rope", inputs.q_rope.data, inputs.q_rope.dtype,
                                inputs.q_rope.memory, inputs.q_rope.shape,
                                {num_tokens, hl, m.qk_rope_head_dim}, true, memory));
  DCP_RETURN_IF_ERROR(CheckView("kv_new", inputs.kv_new.data, inputs.kv_new.dtype,
                                inputs.kv_new.memory, inputs.kv_new.shape, {num_tokens, width_},
                                true, memory));
  DCP_RETURN_IF_ERROR(CheckView("out", outputs.out.data, outputs.out.dtype, outputs.out.memory,
                                outputs.out.shape, {num_tokens, hl, m.v_head_dim}, true, memory));
  DCP_RETURN_IF_ERROR(CheckView("lse", outputs.lse.data, outputs.lse.dtype, outputs.lse.memory,
                                outputs.lse.shape, {num_tokens, hl}, true, memory));
  DCP_CHECK_ARG(outputs.out.dtype == DType::kF32 && outputs.lse.dtype == DType::kF32,
                "out and lse must be F32");

  if (inputs.topk.shape.empty()) {
    DCP_CHECK_ARG(max_seq_len <= options_.attention.index_topk,
                  "no top-k indices were given, so every causal key is selected, but a request "
                  "has seq_len %d > index_topk %d",
                  max_seq_len, options_.attention.index_topk);
    return absl::OkStatus();
  }
  // The width is the indexer's (usually index_topk); -1 pads rows that select fewer keys.
  DCP_CHECK_ARG(inputs.topk.shape.size() == 2 && inputs.topk.shape[0] == num_tokens &&
                    inputs.topk.shape[1] >= 1 && inputs.topk.shape[1] <= (1 << 20),
                "topk has shape %s, expected [%d, K] with 1 <= K <= 2^20",
                ShapeString(inputs.topk.shape), num_tokens);
  return CheckView("topk", inputs.topk.data, inputs.topk.dtype, inputs.topk.memory,
                   inputs.topk.shape, inputs.topk.shape, false, memory);
}

absl::Status Worker::StageTopk(absl::Span<const BatchRequest> batch, const TensorView& topk) {
  DCP_ASSIGN_OR_RETURN(void* staged, stage(kTopk, topk, DType::kI32));
  if (!options_.attention.validate_topk) return absl::OkStatus();
  // This rank's share of the caller's rows: [begin, end) of T.
  const int64_t num_tokens = topk.shape[0], width = topk.shape[1];
  const int64_t world = comm_.world_size(), rank = comm_.rank();
  const int64_t begin = rank * num_tokens / world, end = (rank + 1) * num_tokens / world;
  if (begin == end) return absl::OkStatus();
  std::vector<int32_t> positions;
  positions.reserve(end - begin);
  int32_t max_position = 0;
  int64_t token = 0;
  for (const BatchRequest& r : batch) {
    for (int i = 0; i < r.query_len; ++i, ++token) {
      if (token < begin || token >= end) continue;
      positions.push_back(r.seq_len - r.query_len + i);
      max_position = std::max(max_position, positions.back());
    }
  }
  DCP_ASSIGN_OR_RETURN(int32_t* d_positions, upload(kTopkCheckPosition, positions));
  TopkValidateParams p;
  p.topk = static_cast<const int32_t*>(staged) + begin * width;
  p.token_position = d_positions;
  p.num_tokens = static_cast<int>(end - begin);
  p.topk_width = static_cast<int>(width);
  p.topk_token_stride = width;
  p.max_positions = max_position + 1;
  p.first_token = static_cast<int>(begin);
  return device_.ValidateTopk(p);
}

absl::Status Worker::WriteNewTokens(const Plan& plan, const void* kv_new) {
  std::vector<int32_t> slots(plan.num_tokens, -1);
  for (const PlannedRequest& r : plan.requests) {
    DCP_RETURN_IF_ERROR(tables_->Grow(r.request_id, r.seq_len));
    for (int i = 0; i < r.query_len; ++i) {
      DCP_ASSIGN_OR_RETURN(int64_t slot, tables_->slot(r.request_id, r.context_len() + i));
      slots[r.caller_token_begin + i] = static_cast<int32_t>(slot);
    }
  }
  DCP_ASSIGN_OR_RETURN(int32_t* index, upload(kCacheSlots, slots));
  return device_.ScatterRows({kv_new, index, cache_.data(), storage_, plan.num_tokens, num_slots_,
                              width_, width_, width_});
}

absl::Status Worker::HeadGemm(const HeadGemmArgs& g) {
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

absl::Status Worker::UpProject(const void* rows, int64_t n, void* k, void* v) {
  const ModelDims& m = options_.model;
  const int dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim, dv = m.v_head_dim;
  const int r = m.kv_lora_rank, hl = heads_, qk = dn + dr;
  // k_nope[t][h] = w_uk[h] @ kv_c[t]: per head [n, R] x [R, Dn] (w_uk[h] stored [Dn, R]),
  // written into k[t][h][:Dn].
  DCP_RETURN_IF_ERROR(HeadGemm({rows, width_, 0, w_uk_.data(), true, k, storage_,
                                int64_t{hl} * qk, qk, n, dn, r}));
  // v[t][h] = w_uv[h]^T kv_c[t]: per head [n, R] x [R, Dv].
  DCP_RETURN_IF_ERROR(HeadGemm({rows, width_, 0, w_uv_.data(), false, v, storage_,
                                int64_t{hl} * dv, dv, n, dv, r}));
  // k_pe is shared by the heads: one gather copies row t's k_pe behind each head's k_nope
  // (row t * Hl + h of k[:, :, Dn:] takes source row t), instead of a copy per head.
  const int64_t targets = n * hl;
  if (broadcast_rows_ < targets) {
    std::vector<int32_t> index(targets);
    for (int64_t i = 0; i < targets; ++i) index[i] = static_cast<int32_t>(i / hl);
    DCP_RETURN_IF_ERROR(upload(kRopeIndex, index).status());
    broadcast_rows_ = targets;
  }
  return device_.GatherRows({static_cast<const std::byte*>(rows) + size_t(r) * element_,
                             scratch_[kRopeIndex].as<int32_t>(),
                             static_cast<std::byte*>(k) + size_t(dn) * element_, storage_,
                             targets, n, dr, width_, qk});
}

absl::Status Worker::RunSparseMqa(const Plan& plan, const BatchInputs& inputs,
                                  const void* q_nope, const void* q_rope, int64_t num_tokens,
                                  float* out, float* lse) {
  const ModelDims& m = options_.model;
  const int world = comm_.world_size(), hl = heads_, r = m.kv_lora_rank;
  const int dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim, dv = m.v_head_dim;
  const int64_t tx = num_tokens;
  auto start = Clock::now();

  // Top-k positions -> local slots. Tokens [0, tx) in execution order.
  std::vector<int32_t> token_request(tx), token_position(tx);
  int max_blocks = 1;
  int num_requests = 0;
  for (const PlannedRequest& req : plan.requests) {
    if (req.token_begin >= tx) break;
    for (int i = 0; i < req.query_len; ++i) {
      token_request[req.token_begin + i] = num_requests;
      token_position[req.token_begin + i] = req.context_len() + i;
    }
    DCP_ASSIGN_OR_RETURN(auto table, tables_->table(req.request_id));
    max_blocks = std::max(max_blocks, static_cast<int>(table.size()));
    ++num_requests;
  }
  std::vector<int32_t> tables(size_t(num_requests) * max_blocks, -1);
  for (int q = 0; q < num_requests; ++q) {
    DCP_ASSIGN_OR_RETURN(auto table, tables_->table(plan.requests[q].request_id));
    std::copy(table.begin(), table.end(), tables.begin() + size_t(q) * max_blocks);
  }
  const int32_t* topk = nullptr;
  int topk_width = 0;
  if (!inputs.topk.shape.empty()) {
    topk_width = static_cast<int>(inputs.topk.shape[1]);
    topk = scratch_[kTopkExec].as<int32_t>();  // gathered into execution order by Forward
  } else {
    // Every causal position: row t is 0..p(t), then -1.
    for (int64_t t = 0; t < tx; ++t) topk_width = std::max(topk_width, token_position[t] + 1);
    std::vector<int32_t> causal(size_t(tx) * topk_width, -1);
    for (int64_t t = 0; t < tx; ++t) {
      for (int j = 0; j <= token_position[t]; ++j) causal[t * topk_width + j] = j;
    }
    DCP_ASSIGN_OR_RETURN(topk, upload(kTopk, causal));
  }
  DCP_ASSIGN_OR_RETURN(const int32_t* d_request, upload(kTokenRequest, token_request));
  DCP_ASSIGN_OR_RETURN(const int32_t* d_position, upload(kTokenPosition, token_position));
  DCP_ASSIGN_OR_RETURN(const int32_t* d_tables, upload(kBlockTables, tables));
  DCP_ASSIGN_OR_RETURN(void* slots_data, scratch(kSlots, size_t(tx) * topk_width * 4));
  auto* slots = static_cast<int32_t*>(slots_data);
  DCP_RETURN_IF_ERROR(device_.TopkToSlots({topk, d_request, d_position, d_tables, slots,
                                           static_cast<int>(tx), topk_width, num_requests,
                                           max_blocks, world, layout_.interleave,
                                           options_.dcp.rank, tables_->block_size()}));

  // Absorb: q'[t][h] = [w_uk[h]^T q_nope[t][h] | q_rope[t][h]], [tx, Hl, R + Dr].
  const size_t q_latent_count = size_t(tx) * hl * width_;
  DCP_ASSIGN_OR_RETURN(void* q_latent, scratch(kQLatent, q_latent_count * element_));
  // Per head [tx, Dn] x [Dn, R] (w_uk[h] as stored), written into q'[t][h][:R].
  DCP_RETURN_IF_ERROR(HeadGemm({q_nope, int64_t{hl} * dn, dn, w_uk_.data(), false, q_latent,
                                storage_, int64_t{hl} * width_, width_, tx, r, dn}));
  DCP_RETURN_IF_ERROR(device_.Copy2D(static_cast<std::byte*>(q_latent) + size_t(r) * element_,
                                     size_t(width_) * element_, q_rope, size_t(dr) * element_,
                                     size_t(dr) * element_, size_t(tx) * hl));
  DCP_RETURN_IF_ERROR(device_.Synchronize());
  stats_.up_projection_s += Seconds(start);

  // All-gather q' along heads: [W, tx, Hl, R + Dr], block q holds rank q's heads.
  start = Clock::now();
  DCP_ASSIGN_OR_RETURN(void* q_all, scratch(kQAll, q_latent_count * world * element_));
  DCP_RETURN_IF_ERROR(comm_.AllGather(q_latent, q_all, q_latent_count, storage_));
  stats_.all_gather_bytes += int64_t(q_latent_count) * element_ * world;
  stats_.all_gather_comm_s += Seconds(start);
  stats_.gather_s += Seconds(start);

  // Local sparse MQA of every rank's heads over this rank's keys: partial [W, tx, Hl, R],
  // source-rank-major as the combine's collectives want it. The kernel runs once over all H
  // heads (its head tile is wide: W launches of H/W heads would leave most of it idle), so q'
  // is first rearranged [W, tx, Hl, *] -> [tx, H, *] and the outputs back afterwards.
  start = Clock::now();
  const int all_heads = hl * world;
  const size_t part_count = size_t(tx) * hl * r;
  DCP_ASSIGN_OR_RETURN(void* partial_data, scratch(kPartial, part_count * world * 4));
  DCP_ASSIGN_OR_RETURN(void* lse_part_data, scratch(kLsePartial, size_t(tx) * hl * world * 4));
  auto* partial = static_cast<float*>(partial_data);
  auto* lse_part = static_cast<float*>(lse_part_data);
  const void* q_heads = q_all;
  float* out_heads = partial;
  float* lse_heads = lse_part;
  if (world > 1) {
    DCP_ASSIGN_OR_RETURN(void* q_data, scratch(kQHeads, q_latent_count * world * element_));
    DCP_ASSIGN_OR_RETURN(void* out_data, scratch(kOutHeads, part_count * world * 4));
    DCP_ASSIGN_OR_RETURN(void* lse_data, scratch(kLseHeads, size_t(tx) * all_heads * 4));
    const size_t block = size_t(hl) * width_ * element_;  // one token's heads of one rank
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
  SparseMqaParams p;
  p.q = q_heads;
  p.kv_cache = cache_.data();
  p.indices = slots;
  p.out = out_heads;
  p.lse = lse_heads;
  p.dtype = storage_;
  p.num_tokens = static_cast<int>(tx);
  p.num_heads = all_heads;
  p.head_dim = width_;
  p.v_dim = r;
  p.topk = topk_width;
  p.num_slots = num_slots_;
  p.q_token_stride = int64_t{all_heads} * width_;
  p.q_head_stride = width_;
  p.kv_row_stride = width_;
  p.indices_token_stride = topk_width;
  p.out_token_stride = int64_t{all_heads} * r;
  p.out_head_stride = r;
  p.lse_token_stride = all_heads;
  p.scale = scale_;
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
  DCP_RETURN_IF_ERROR(device_.Synchronize());
  stats_.attention_s += Seconds(start);
  stats_.flops += 2.0 * double(tx) * hl * world * topk_width / world * (width_ + r);

  // Combine the W partials of this rank's heads: combined [tx, Hl, R], lse [tx, Hl].
  start = Clock::now();
  DCP_ASSIGN_OR_RETURN(void* combined_data, scratch(kCombined, part_count * 4));
  auto* combined = static_cast<float*>(combined_data);
  const size_t lse_count = size_t(tx) * hl;
  if (world == 1) {
    DCP_RETURN_IF_ERROR(device_.Copy(combined, partial, part_count * 4));
    DCP_RETURN_IF_ERROR(device_.Copy(lse, lse_part, lse_count * 4));
  } else if (options_.dcp.combine == CombineBackend::kAllGatherReduceScatter) {
    DCP_ASSIGN_OR_RETURN(void* lse_all, scratch(kLseAll, lse_count * world * world * 4));
    DCP_ASSIGN_OR_RETURN(void* lse_total, scratch(kLseTotal, lse_count * world * 4));
    auto comm_start = Clock::now();
    DCP_RETURN_IF_ERROR(comm_.AllGather(lse_part, lse_all, lse_count * world, DType::kF32));
    stats_.combine_comm_s += Seconds(comm_start);
    DcpCorrectParams correct;
    correct.out = partial;
    correct.lse_all = static_cast<const float*>(lse_all);
    correct.lse_total = static_cast<float*>(lse_total);
    correct.world_size = world;
    correct.rank = options_.dcp.rank;
    correct.num_tokens = static_cast<int>(tx * world);
    correct.num_heads = hl;
    correct.dim = r;
    DCP_RETURN_IF_ERROR(device_.DcpCorrect(correct));
    comm_start = Clock::now();
    DCP_RETURN_IF_ERROR(comm_.ReduceScatterSum(partial, combined, part_count, DType::kF32));
    stats_.combine_comm_s += Seconds(comm_start);
    DCP_RETURN_IF_ERROR(device_.Copy(lse, static_cast<float*>(lse_total) +
                                              size_t(options_.dcp.rank) * lse_count,
                                     lse_count * 4));
    stats_.combine_bytes += int64_t(lse_count) * world * world * 4 + int64_t(part_count) * world * 4;
  } else {
    DCP_ASSIGN_OR_RETURN(void* received, scratch(kReceived, part_count * world * 4));
    DCP_ASSIGN_OR_RETURN(void* lse_received, scratch(kLseReceived, lse_count * world * 4));
    const auto comm_start = Clock::now();
    DCP_RETURN_IF_ERROR(comm_.AllToAll(partial, received, part_count, DType::kF32));
    DCP_RETURN_IF_ERROR(comm_.AllToAll(lse_part, lse_received, lse_count, DType::kF32));
    stats_.combine_comm_s += Seconds(comm_start);
    DcpCombineParams combine;
    combine.outs = static_cast<const float*>(received);
    combine.lses = static_cast<const float*>(lse_received);
    combine.out = combined;
    combine.lse = lse;
    combine.world_size = world;
    combine.num_tokens = static_cast<int>(tx);
    combine.num_heads = hl;
    combine.dim = r;
    DCP_RETURN_IF_ERROR(device_.DcpCombine(combine));
    stats_.combine_bytes += int64_t(part_count + lse_count) * world * 4;
  }
  DCP_RETURN_IF_ERROR(device_.Synchronize());
  stats_.combine_s += Seconds(start);

  // out[t][h] = w_uv[h]^T o_lat[t][h]: per head [tx, R] x [R, Dv].
  start = Clock::now();
  const void* o_lat = combined;
  if (storage_ != DType::kF32) {
    DCP_ASSIGN_OR_RETURN(void* converted, scratch(kOLatStorage, part_count * element_));
    DCP_RETURN_IF_ERROR(device_.Convert(converted, storage_, combined, DType::kF32, part_count));
    o_lat = converted;
  }
  DCP_RETURN_IF_ERROR(HeadGemm({o_lat, int64_t{hl} * r, r, w_uv_.data(), false, out,
                                DType::kF32, int64_t{hl} * dv, dv, tx, dv, r}));
  DCP_RETURN_IF_ERROR(device_.Synchronize());
  stats_.up_projection_s += Seconds(start);
  stats_.flops += 2.0 * double(tx) * hl * (double(dn) * r + double(r) * dv);
  return absl::OkStatus();
}

absl::Status Worker::RunDenseMha(const Plan& plan, const void* q_nope, const void* q_rope,
                                 const void* kv_new, float* out, float* lse) {
  const ModelDims& m = options_.model;
  const int hl = heads_, dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim, dv = m.v_head_dim;
  const int qk = dn + dr, world = comm_.world_size(), rank = options_.dcp.rank;
  const int64_t tp = plan.num_tokens - plan.num_decode_tokens;
  const int num_prefills = plan.num_prefills;
  const PlannedRequest* prefills = plan.requests.data() + plan.num_decodes;
  auto start = Clock::now();

  // Queries [tp, Hl, Dn + Dr] = [q_nope | q_rope] of the prefill tokens.
  DCP_ASSIGN_OR_RETURN(void* q, scratch(kQDense, size_t(tp) * hl * qk * element_));
  DCP_RETURN_IF_ERROR(device_.Copy2D(q, size_t(qk) * element_, q_nope, size_t(dn) * element_,
                                     size_t(dn) * element_, size_t(tp) * hl));
  DCP_RETURN_IF_ERROR(device_.Copy2D(static_cast<std::byte*>(q) + size_t(dn) * element_,
                                     size_t(qk) * element_, q_rope, size_t(dr) * element_,
                                     size_t(dr) * element_, size_t(tp) * hl));
  // The new tokens' K/V from their latent rows.
  DCP_ASSIGN_OR_RETURN(void* k_new, scratch(kKNew, size_t(tp) * hl * qk * element_));
  DCP_ASSIGN_OR_RETURN(void* v_new, scratch(kVNew, size_t(tp) * hl * dv * element_));
  DCP_RETURN_IF_ERROR(UpProject(kv_new, tp, k_new, v_new));
  DCP_RETURN_IF_ERROR(device_.Synchronize());
  stats_.up_projection_s += Seconds(start);
  stats_.flops += 2.0 * double(tp) * hl * m.kv_lora_rank * (dn + dv);

  std::vector<int32_t> cu_q(num_prefills + 1, 0);
  for (int p = 0; p < num_prefills; ++p) cu_q[p + 1] = cu_q[p] + prefills[p].query_len;
  DCP_ASSIGN_OR_RETURN(int32_t* d_cu_q, upload(kCuSeqlensQ, cu_q));
  int max_query_len = 0;
  for (int p = 0; p < num_prefills; ++p) max_query_len = std::max(max_query_len, prefills[p].query_len);

  DenseMhaParams base;
  base.q = q;
  base.dtype = storage_;
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
  start = Clock::now();
  float* out_new = out;
  float* lse_new = lse;
  if (has_context) {
    DCP_ASSIGN_OR_RETURN(void* o, scratch(kOutNew, out_count * 4));
    DCP_ASSIGN_OR_RETURN(void* l, scratch(kLseNew, lse_count * 4));
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
  DCP_RETURN_IF_ERROR(device_.Synchronize());
  stats_.attention_s += Seconds(start);
  for (int p = 0; p < num_prefills; ++p) {
    const double n = prefills[p].query_len;
    stats_.flops += 2.0 * hl * (qk + dv) * n * (n + 1) / 2;
  }
  if (!has_context) return absl::OkStatus();

  // Context, chunk by chunk, merged into (out_ctx, lse_ctx), which starts empty.
  DCP_ASSIGN_OR_RETURN(void* out_ctx_data, scratch(kOutCtx, out_count * 4));
  DCP_ASSIGN_OR_RETURN(void* lse_ctx_data, scratch(kLseCtx, lse_count * 4));
  DCP_ASSIGN_OR_RETURN(void* out_chunk_data, scratch(kOutChunk, out_count * 4));
  DCP_ASSIGN_OR_RETURN(void* lse_chunk_data, scratch(kLseChunk, lse_count * 4));
  auto* out_ctx = static_cast<float*>(out_ctx_data);
  auto* lse_ctx = static_cast<float*>(lse_ctx_data);
  auto* out_chunk = static_cast<float*>(out_chunk_data);
  auto* lse_chunk = static_cast<float*>(lse_chunk_data);
  DCP_RETURN_IF_ERROR(device_.Memset(out_ctx, 0, out_count * 4));
  const std::vector<float> empty_lse(lse_count, -std::numeric_limits<float>::infinity());
  DCP_RETURN_IF_ERROR(device_.CopyFromHost(lse_ctx, empty_lse.data(), lse_count * 4));

  const WorkspaceSize& ws = plan.workspace;
  const int64_t local_rows = ws.local_rows;
  std::byte* local_region = static_cast<std::byte*>(workspace_.data());
  std::byte* gathered_region =
      world > 1 ? local_region + size_t(local_rows) * width_ * element_ : local_region;
  for (const ContextChunk& chunk : plan.chunks) {
    // Gather this rank's rows of every segment into the local region (padding: zero rows).
    start = Clock::now();
    std::vector<int32_t> local_slots(local_rows, -1);
    for (const ChunkSegment& segment : chunk.segments) {
      const PlannedRequest& req = prefills[segment.request];
      DCP_ASSIGN_OR_RETURN(auto table, tables_->table(req.request_id));
      const LocalRange range = SegmentLocalRows(segment, layout_, rank);
      const int64_t offset = segment.padded_offset / world;
      for (int64_t x = 0; x < range.count; ++x) {
        local_slots[offset + x] = static_cast<int32_t>(
            slot_of_local_row(table.data(), tables_->block_size(), range.first + x));
      }
    }
    DCP_ASSIGN_OR_RETURN(int32_t* d_local_slots, upload(kLocalSlots, local_slots));
    DCP_RETURN_IF_ERROR(device_.GatherRows({cache_.data(), d_local_slots, local_region, storage_,
                                            local_rows, num_slots_, width_, width_, width_}));
    if (world > 1) {
      DCP_RETURN_IF_ERROR(device_.Synchronize());  // the all-gather's own time, below
      const auto comm_start = Clock::now();
      DCP_RETURN_IF_ERROR(comm_.AllGather(local_region, gathered_region,
                                          size_t(local_rows) * width_, storage_));
      stats_.all_gather_comm_s += Seconds(comm_start);
      stats_.all_gather_bytes += local_rows * width_ * int64_t(element_) * world;
    }
    // Reorganize into per-request rows in global order.
    DCP_ASSIGN_OR_RETURN(int32_t* d_index,
                         upload(kChunkIndex, ReorganizeIndex(chunk, local_rows, layout_)));
    DCP_ASSIGN_OR_RETURN(void* rows, scratch(kChunkRows, size_t(chunk.num_keys) * width_ * element_));
    DCP_RETURN_IF_ERROR(device_.GatherRows({gathered_region, d_index, rows, storage_,
                                            chunk.num_keys, local_rows * world, width_, width_,
                                            width_}));
    DCP_RETURN_IF_ERROR(device_.Synchronize());
    stats_.gather_s += Seconds(start);
    stats_.num_context_rows += chunk.num_keys;

    start = Clock::now();
    DCP_ASSIGN_OR_RETURN(void* k, scratch(kKChunk, size_t(chunk.num_keys) * hl * qk * element_));
    DCP_ASSIGN_OR_RETURN(void* v, scratch(kVChunk, size_t(chunk.num_keys) * hl * dv * element_));
    DCP_RETURN_IF_ERROR(UpProject(rows, chunk.num_keys, k, v));
    DCP_RETURN_IF_ERROR(device_.Synchronize());
    stats_.up_projection_s += Seconds(start);
    stats_.flops += 2.0 * double(chunk.num_keys) * hl * m.kv_lora_rank * (dn + dv);

    // Every prefill's queries against its keys in this chunk (none: out 0, lse -inf).
    start = Clock::now();
    std::vector<int32_t> cu_k(num_prefills + 1, 0);
    std::vector<int64_t> keys_of(num_prefills, 0);
    int max_keys = 0;
    for (const ChunkSegment& segment : chunk.segments) {
      keys_of[segment.request] = segment.end - segment.begin;
      max_keys = std::max<int>(max_keys, static_cast<int>(segment.end - segment.begin));
      stats_.flops += 2.0 * hl * (qk + dv) * double(prefills[segment.request].query_len) *
                      double(segment.end - segment.begin);
    }
    for (int p = 0; p < num_prefills; ++p) cu_k[p + 1] = cu_k[p] + static_cast<int32_t>(keys_of[p]);
    DCP_ASSIGN_OR_RETURN(int32_t* d_cu_k, upload(kCuSeqlensK, cu_k));
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
    DCP_RETURN_IF_ERROR(device_.Synchronize());
    stats_.attention_s += Seconds(start);
  }
  start = Clock::now();
  DCP_RETURN_IF_ERROR(device_.MergeStates(
      {out_ctx, lse_ctx, out_new, lse_new, out, lse, static_cast<int>(tp), hl, dv}));
  DCP_RETURN_IF_ERROR(device_.Synchronize());
  stats_.attention_s += Seconds(start);
  return absl::OkStatus();
}

absl::Status Worker::Forward(absl::Span<const BatchRequest> batch, const BatchInputs& inputs,
                             const BatchOutputs& outputs) {
  const auto forward_start = Clock::now();
  stats_ = ForwardStats{};
  // The top-k is staged and checked before anything runs (every rank its share of the rows),
  // and agreed with the rest: no kernel consumes an unchecked top-k.
  absl::Status local = ValidateInputs(batch, inputs, outputs);
  if (local.ok() && !inputs.topk.shape.empty()) local = StageTopk(batch, inputs.topk);
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, local));

  auto start = Clock::now();
  const bool damage = damage_next_plan_;
  damage_next_plan_ = false;
  DCP_ASSIGN_OR_RETURN(const Plan plan, ExchangePlan(comm_, batch, planner_, damage));
  stats_.plan_s = Seconds(start);
  stats_.route = plan.route;
  stats_.num_decodes = plan.num_decodes;
  stats_.num_prefills = plan.num_prefills;
  stats_.num_chunks = static_cast<int>(plan.chunks.size());
  stats_.num_tokens = plan.num_tokens;
  const int64_t t = plan.num_tokens;
  if (t == 0) return absl::OkStatus();

  const ModelDims& m = options_.model;
  const int hl = heads_, dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim, dv = m.v_head_dim;

  // The new tokens' rows into the cache (those this rank owns). Every rank runs the same
  // allocations, so an out-of-blocks error is the same everywhere; still agreed.
  start = Clock::now();
  DCP_ASSIGN_OR_RETURN(void* kv_new, stage(kKvNew, inputs.kv_new, storage_));
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, WriteNewTokens(plan, kv_new)));
  for (const PlannedRequest& r : plan.requests) cached_[r.request_id] = r.seq_len;

  // Inputs in execution order (decodes first): perm[e] = caller token of execution token e.
  std::vector<int32_t> perm(t);
  for (const PlannedRequest& r : plan.requests) {
    for (int i = 0; i < r.query_len; ++i) {
      perm[r.token_begin + i] = static_cast<int32_t>(r.caller_token_begin + i);
    }
  }
  DCP_ASSIGN_OR_RETURN(int32_t* d_perm, upload(kPerm, perm));
  auto reorder = [&](const void* staged, Scratch exec_slot, DType dtype,
                     int width) -> absl::StatusOr<void*> {
    DCP_ASSIGN_OR_RETURN(void* exec, scratch(exec_slot, size_t(t) * width * dtype_size(dtype)));
    DCP_RETURN_IF_ERROR(
        device_.GatherRows({staged, d_perm, exec, dtype, t, t, width, width, width}));
    return exec;
  };
  DCP_ASSIGN_OR_RETURN(void* q_nope_staged, stage(kQNope, inputs.q_nope, storage_));
  DCP_ASSIGN_OR_RETURN(void* q_rope_staged, stage(kQRope, inputs.q_rope, storage_));
  DCP_ASSIGN_OR_RETURN(void* q_nope, reorder(q_nope_staged, kQNopeExec, storage_, hl * dn));
  DCP_ASSIGN_OR_RETURN(void* q_rope, reorder(q_rope_staged, kQRopeExec, storage_, hl * dr));
  DCP_ASSIGN_OR_RETURN(void* kv_exec, reorder(kv_new, kKvNewExec, storage_, width_));
  if (!inputs.topk.shape.empty()) {
    DCP_RETURN_IF_ERROR(reorder(scratch_[kTopk].data(), kTopkExec, DType::kI32,
                                static_cast<int>(inputs.topk.shape[1]))
                            .status());
  }
  DCP_RETURN_IF_ERROR(device_.Synchronize());
  stats_.cache_write_s = Seconds(start);

  DCP_ASSIGN_OR_RETURN(void* out_exec_data, scratch(kOutExec, size_t(t) * hl * dv * 4));
  DCP_ASSIGN_OR_RETURN(void* lse_exec_data, scratch(kLseExec, size_t(t) * hl * 4));
  auto* out_exec = static_cast<float*>(out_exec_data);
  auto* lse_exec = static_cast<float*>(lse_exec_data);
  const int64_t mqa_tokens = plan.route == Route::kDenseMha ? plan.num_decode_tokens : t;
  if (mqa_tokens > 0) {
    DCP_RETURN_IF_ERROR(
        RunSparseMqa(plan, inputs, q_nope, q_rope, mqa_tokens, out_exec, lse_exec));
  }
  if (plan.route == Route::kDenseMha) {
    const int64_t first = plan.num_decode_tokens;
    DCP_RETURN_IF_ERROR(RunDenseMha(
        plan, static_cast<std::byte*>(q_nope) + size_t(first) * hl * dn * element_,
        static_cast<std::byte*>(q_rope) + size_t(first) * hl * dr * element_,
        static_cast<std::byte*>(kv_exec) + size_t(first) * width_ * element_,
        out_exec + size_t(first) * hl * dv, lse_exec + size_t(first) * hl));
  }

  // Back to the caller's order, then into the caller's buffers.
  auto scatter_out = [&](const float* exec, Scratch caller_slot, const MutableTensorView& view,
                         int width) -> absl::Status {
    const size_t bytes = size_t(t) * width * 4;
    const bool direct = view.memory == device_.memory_space();
    void* target = view.data;
    if (!direct) {
      DCP_ASSIGN_OR_RETURN(target, scratch(caller_slot, bytes));
    }
    DCP_RETURN_IF_ERROR(device_.ScatterRows({exec, d_perm, target, DType::kF32, t, t, width,
                                             width, width}));
    if (!direct) DCP_RETURN_IF_ERROR(device_.CopyToHost(view.data, target, bytes));
    return absl::OkStatus();
  };
  DCP_RETURN_IF_ERROR(scatter_out(out_exec, kOutCaller, outputs.out, hl * dv));
  DCP_RETURN_IF_ERROR(scatter_out(lse_exec, kLseCaller, outputs.lse, hl));
  DCP_RETURN_IF_ERROR(device_.Synchronize());
  stats_.total_s = Seconds(forward_start);
  return absl::OkStatus();
}

absl::StatusOr<std::string> Worker::PlanJson(absl::Span<const BatchRequest> batch,
                                             bool has_topk) {
  absl::Status local = ValidateBatch(batch, options_.scheduler);
  if (local.ok() && !has_topk) {
    for (const BatchRequest& r : batch) {
      if (r.seq_len > options_.attention.index_topk) {
        local = DCP_ERROR(InvalidArgument,
                          "no top-k indices were given, so every causal key is selected, but "
                          "request id %d has seq_len %d > index_topk %d",
                          r.request_id, r.seq_len, options_.attention.index_topk);
        break;
      }
    }
  }
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, local));
  DCP_ASSIGN_OR_RETURN(const Plan plan, ExchangePlan(comm_, batch, planner_));
  return PlanToJson(plan, comm_.world_size());
}

}  // namespace dcp
