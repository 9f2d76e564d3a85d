#include "runtime/worker.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "core/logging.h"
#include "core/status.h"
#include "runtime/input_checks.h"

namespace dcp {

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(const DcpOptions& options,
                                                       Communicator& comm, Device& device,
                                                       const LayerWeights& weights) {
  DCP_RETURN_IF_ERROR(ValidateConfigs(options.model, options.dcp, options.scheduler,
                                      options.attention));
  DCP_CHECK_ARG(options.dcp.world_size == comm.world_size() && options.dcp.rank == comm.rank(),
                "dcp.world_size/rank (%d, %d) disagree with the communicator (%d, %d)",
                options.dcp.world_size, options.dcp.rank, comm.world_size(), comm.rank());
  auto worker = std::unique_ptr<Worker>(new Worker(options, comm, device));
  Worker& w = *worker;
  const ModelDims& m = options.model;
  const int width = m.latent_width();
  const KvLayout layout{options.dcp.world_size, options.dcp.interleave};
  w.heads_ = m.num_heads / options.dcp.world_size;

  // Prefill backend and workspace.
  DCP_ASSIGN_OR_RETURN(w.planner_.dense_mha_available,
                       ResolvePrefillBackend(options.attention,
                                             device.DenseMhaSupport(m.qk_head_dim(),
                                                                    m.v_head_dim)));
  w.planner_.scheduler = options.scheduler;
  w.planner_.attention = options.attention;
  w.planner_.layout = layout;
  DCP_ASSIGN_OR_RETURN(
      w.planner_.workspace,
      ComputeWorkspaceSize({options.scheduler.block_size, options.scheduler.max_num_seqs,
                            options.scheduler.max_model_len, options.attention.index_topk,
                            options.dcp.world_size, options.dcp.interleave, width,
                            options.workspace_rows_override}));

  // KV cache: enough blocks for max_num_seqs full sequences unless configured.
  const int block_size = options.scheduler.block_size;
  int64_t num_blocks = options.scheduler.num_kv_blocks;
  if (num_blocks == 0) {
    const int64_t per_request =
        (layout.local_length(options.scheduler.max_model_len, 0) + block_size - 1) / block_size;
    num_blocks = per_request * options.scheduler.max_num_seqs;
  }
  DCP_ASSIGN_OR_RETURN(w.cache_, KvCache::Create(device, num_blocks, block_size, width, layout,
                                                 options.dcp.rank));
  DCP_ASSIGN_OR_RETURN(w.projections_, MlaProjections::Create(device, m, w.heads_, weights));
  if (w.planner_.dense_mha_available) {
    DCP_ASSIGN_OR_RETURN(w.workspace_,
                         device.Allocate(size_t(w.planner_.workspace.total_rows) * width *
                                         dtype_size(device.storage_dtype())));
  }
  w.sparse_ = std::make_unique<SparseRoute>(device, comm, m, m.scale(), options.dcp.combine,
                                            *w.cache_, *w.projections_);
  w.dense_ = std::make_unique<DenseRoute>(device, comm, m, m.scale(), *w.cache_,
                                          *w.projections_, w.workspace_.data());
  DCP_LOG(INFO) << "worker ready: " << w.heads_ << " heads, " << num_blocks << " KV blocks of "
                << block_size << ", workspace S=" << w.planner_.workspace.rows_per_chunk
                << " rows, dense MHA " << (w.planner_.dense_mha_available ? "on" : "off")
                << ", device " << device.name() << ", comm " << comm.name();
  return worker;
}

absl::Status Worker::AddRequest(int64_t request_id) { return cache_->AddRequest(request_id); }

absl::Status Worker::FreeRequest(int64_t request_id) { return cache_->FreeRequest(request_id); }

absl::Status Worker::LoadCachedKv(int64_t request_id, int64_t num_tokens,
                                  const TensorView& local_rows) {
  DCP_CHECK_ARG(cache_->has_request(request_id), "request %d is not registered", request_id);
  DCP_CHECK_ARG(num_tokens >= 0 && num_tokens <= options_.scheduler.max_model_len,
                "request %d: %d cached tokens outside [0, max_model_len = %d]", request_id,
                num_tokens, options_.scheduler.max_model_len);
  const int64_t rows = cache_->layout().local_length(num_tokens, options_.dcp.rank);
  DCP_RETURN_IF_ERROR(CheckView("cached KV rows", local_rows,
                                {rows, options_.model.latent_width()}, true,
                                device_.memory_space()));
  return cache_->Load(request_id, num_tokens, local_rows);
}

absl::Status Worker::CheckInputs(absl::Span<const BatchRequest> batch, const BatchInputs& inputs,
                                 const BatchOutputs& outputs) {
  DCP_RETURN_IF_ERROR(ValidateBatch(batch, options_.scheduler));
  for (const BatchRequest& r : batch) {
    const int64_t cached = cache_->cached_tokens(r.request_id);
    DCP_CHECK_ARG(cached >= 0, "request id %d is not registered (AddRequest first)",
                  r.request_id);
    DCP_CHECK_ARG(cached == r.seq_len - r.query_len,
                  "request id %d has %d cached tokens but the batch gives it seq_len %d and "
                  "query_len %d (context %d)",
                  r.request_id, cached, r.seq_len, r.query_len, r.seq_len - r.query_len);
  }
  return CheckLayerInputs({&options_.model, heads_, device_.memory_space(),
                           options_.attention.index_topk},
                          batch, inputs, outputs);
}

absl::Status Worker::StageTopk(absl::Span<const BatchRequest> batch, const TensorView& topk) {
  DCP_ASSIGN_OR_RETURN(void* staged, Stage(device_, topk_, topk, DType::kI32));
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
  DCP_ASSIGN_OR_RETURN(int32_t* d_positions, Upload(device_, topk_positions_, positions));
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

absl::Status Worker::Forward(absl::Span<const BatchRequest> batch, const BatchInputs& inputs,
                             const BatchOutputs& outputs) {
  const PhaseTimer forward_timer;
  stats_ = ForwardStats{};
  // The top-k is staged and checked before anything runs (every rank its share of the rows),
  // and agreed with the rest: no kernel consumes an unchecked top-k.
  absl::Status local = CheckInputs(batch, inputs, outputs);
  if (local.ok() && !inputs.topk.shape.empty()) local = StageTopk(batch, inputs.topk);
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, local));

  PhaseTimer timer;
  const bool damage = damage_next_plan_;
  damage_next_plan_ = false;
  DCP_ASSIGN_OR_RETURN(const Plan plan, ExchangePlan(comm_, batch, planner_, damage));
  stats_.plan_s = timer.Elapsed();
  stats_.route = plan.route;
  stats_.num_decodes = plan.num_decodes;
  stats_.num_prefills = plan.num_prefills;
  stats_.num_chunks = static_cast<int>(plan.chunks.size());
  stats_.num_tokens = plan.num_tokens;
  if (plan.num_tokens == 0) return absl::OkStatus();

  // The outcome is agreed as well: an error after the last collective of a route (a kernel
  // fault, say) reaches every rank. What peers see of an error before a collective they are
  // waiting in is runtime/dcp.h's contract (DeadlineExceeded after dcp.comm_timeout_s).
  const absl::Status outcome = Execute(plan, inputs, outputs);
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, outcome));
  stats_.total_s = forward_timer.Elapsed();
  return absl::OkStatus();
}

absl::Status Worker::Execute(const Plan& plan, const BatchInputs& inputs,
                             const BatchOutputs& outputs) {
  const ModelDims& m = options_.model;
  const int hl = heads_, dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim, dv = m.v_head_dim;
  const int width = m.latent_width();
  const DType storage = device_.storage_dtype();
  const size_t element = dtype_size(storage);
  const int64_t t = plan.num_tokens;

  // The new tokens' rows into the cache (those this rank owns). Every rank runs the same
  // allocations, so an out-of-blocks error is the same everywhere; still agreed.
  PhaseTimer timer;
  DCP_ASSIGN_OR_RETURN(void* kv_new, Stage(device_, kv_new_, inputs.kv_new, storage));
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, cache_->WriteNewTokens(plan, kv_new)));
  cache_->CommitLengths(plan);

  // Inputs in execution order (decodes first): perm[e] = caller token of execution token e.
  std::vector<int32_t> perm(t);
  for (const PlannedRequest& r : plan.requests) {
    for (int i = 0; i < r.query_len; ++i) {
      perm[r.token_begin + i] = static_cast<int32_t>(r.caller_token_begin + i);
    }
  }
  DCP_ASSIGN_OR_RETURN(int32_t* d_perm, Upload(device_, perm_, perm));
  auto reorder = [&](const void* staged, ScratchBuffer& exec_buffer, DType dtype,
                     int row) -> absl::StatusOr<void*> {
    DCP_ASSIGN_OR_RETURN(void* exec, exec_buffer.Reserve(device_, size_t(t) * row *
                                                                      dtype_size(dtype)));
    DCP_RETURN_IF_ERROR(device_.GatherRows({staged, d_perm, exec, dtype, t, t, row, row, row}));
    return exec;
  };
  DCP_ASSIGN_OR_RETURN(void* q_nope_staged, Stage(device_, q_nope_, inputs.q_nope, storage));
  DCP_ASSIGN_OR_RETURN(void* q_rope_staged, Stage(device_, q_rope_, inputs.q_rope, storage));
  DCP_ASSIGN_OR_RETURN(void* q_nope, reorder(q_nope_staged, q_nope_exec_, storage, hl * dn));
  DCP_ASSIGN_OR_RETURN(void* q_rope, reorder(q_rope_staged, q_rope_exec_, storage, hl * dr));
  DCP_ASSIGN_OR_RETURN(void* kv_exec, reorder(kv_new, kv_new_exec_, storage, width));
  const int32_t* topk = nullptr;
  const int topk_width = inputs.topk.shape.empty() ? 0 : static_cast<int>(inputs.topk.shape[1]);
  if (topk_width > 0) {
    DCP_ASSIGN_OR_RETURN(void* exec, reorder(topk_.data(), topk_exec_, DType::kI32, topk_width));
    topk = static_cast<const int32_t*>(exec);
  }
  DCP_RETURN_IF_ERROR(timer.Stop(device_, &stats_.cache_write_s));

  DCP_ASSIGN_OR_RETURN(void* out_exec_data, out_exec_.Reserve(device_, size_t(t) * hl * dv * 4));
  DCP_ASSIGN_OR_RETURN(void* lse_exec_data, lse_exec_.Reserve(device_, size_t(t) * hl * 4));
  auto* out_exec = static_cast<float*>(out_exec_data);
  auto* lse_exec = static_cast<float*>(lse_exec_data);
  const int64_t mqa_tokens = plan.route == Route::kDenseMha ? plan.num_decode_tokens : t;
  if (mqa_tokens > 0) {
    DCP_RETURN_IF_ERROR(sparse_->Run(plan, {q_nope, q_rope, topk, topk_width, mqa_tokens},
                                     out_exec, lse_exec, &stats_));
  }
  if (plan.route == Route::kDenseMha) {
    const size_t first = static_cast<size_t>(plan.num_decode_tokens);
    const DenseRouteInputs prefill{
        static_cast<std::byte*>(q_nope) + first * hl * dn * element,
        static_cast<std::byte*>(q_rope) + first * hl * dr * element,
        static_cast<std::byte*>(kv_exec) + first * width * element};
    DCP_RETURN_IF_ERROR(dense_->Run(plan, prefill, out_exec + first * hl * dv,
                                    lse_exec + first * hl, &stats_));
  }

  // Back to the caller's order, then into the caller's buffers.
  auto scatter_out = [&](const float* exec, ScratchBuffer& caller_buffer,
                         const MutableTensorView& view, int row) -> absl::Status {
    const size_t bytes = size_t(t) * row * 4;
    const bool direct = view.memory == device_.memory_space();
    void* target = view.data;
    if (!direct) {
      DCP_ASSIGN_OR_RETURN(target, caller_buffer.Reserve(device_, bytes));
    }
    DCP_RETURN_IF_ERROR(
        device_.ScatterRows({exec, d_perm, target, DType::kF32, t, t, row, row, row}));
    if (!direct) DCP_RETURN_IF_ERROR(device_.CopyToHost(view.data, target, bytes));
    return absl::OkStatus();
  };
  DCP_RETURN_IF_ERROR(scatter_out(out_exec, out_caller_, outputs.out, hl * dv));
  DCP_RETURN_IF_ERROR(scatter_out(lse_exec, lse_caller_, outputs.lse, hl));
  return device_.Synchronize();
}

absl::StatusOr<std::string> Worker::PlanJson(absl::Span<const BatchRequest> batch,
                                             bool has_topk) {
  absl::Status local = ValidateBatch(batch, options_.scheduler);
  if (local.ok() && !has_topk) {
    local = CheckLengthsWithoutTopk(batch, options_.attention.index_topk);
  }
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, local));
  DCP_ASSIGN_OR_RETURN(const Plan plan, ExchangePlan(comm_, batch, planner_));
  return PlanToJson(plan, comm_.world_size());
}

}  // namespace dcp
