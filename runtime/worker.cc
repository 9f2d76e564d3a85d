#include "runtime/worker.h"

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "core/logging.h"
#include "core/status.h"
#include "runtime/input_checks.h"
#include "runtime/planner.h"

namespace dcp {
namespace {

// A device copy of a weight tensor in `dtype` (from host or device memory, F32 or BF16).
absl::StatusOr<Buffer> StageWeight(Device& device, const TensorView& view, DType dtype) {
  DCP_ASSIGN_OR_RETURN(Buffer buffer, device.Allocate(view.num_elements() * dtype_size(dtype)));
  ScratchBuffer staging;
  DCP_ASSIGN_OR_RETURN(void* staged, Stage(device, staging, view, dtype));
  DCP_RETURN_IF_ERROR(device.Copy(buffer.data(), staged, buffer.bytes()));
  DCP_RETURN_IF_ERROR(device.Synchronize());
  return buffer;
}

// An input for the engine: the caller's device memory as is when it already has `dtype`
// (nothing is copied), else staged (converted, or copied from the host) into `buffer`.
absl::StatusOr<const void*> StageInput(Device& device, ScratchBuffer& buffer,
                                       const TensorView& view, DType dtype) {
  if (view.memory == device.memory_space() && view.dtype == dtype && view.data != nullptr) {
    return view.data;
  }
  DCP_ASSIGN_OR_RETURN(void* staged, Stage(device, buffer, view, dtype));
  return static_cast<const void*>(staged);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(const DcpOptions& options,
                                                       Communicator& comm, Device& device,
                                                       const LayerWeights& weights) {
  auto worker = std::unique_ptr<Worker>(new Worker(options, comm, device));
  Worker& w = *worker;
  DCP_ASSIGN_OR_RETURN(w.engine_, DcpEngine::Create(options, comm, device));
  w.engine_->set_collect_stats(true);
  const ModelDims& m = options.model;
  const int64_t hl = w.engine_->heads();
  const KvLayout layout{options.dcp.world_size, options.dcp.interleave};

  // KV cache: enough blocks for max_num_seqs full sequences unless configured.
  const int block_size = options.scheduler.block_size;
  int64_t num_blocks = options.scheduler.num_kv_blocks;
  if (num_blocks == 0) {
    const int64_t per_request =
        (layout.local_length(options.scheduler.max_model_len, 0) + block_size - 1) / block_size;
    num_blocks = per_request * options.scheduler.max_num_seqs;
  }
  DCP_ASSIGN_OR_RETURN(w.cache_, KvCache::Create(device, num_blocks, block_size,
                                                 m.latent_width(), layout, options.dcp.rank,
                                                 options.attention.kv_cache_dtype));
  // Weights of this rank's heads, in the storage dtype.
  DCP_RETURN_IF_ERROR(CheckView("weights.w_uk", weights.w_uk,
                                {hl, m.qk_nope_head_dim, m.kv_lora_rank}, true,
                                device.memory_space()));
  DCP_RETURN_IF_ERROR(CheckView("weights.w_uv", weights.w_uv, {hl, m.kv_lora_rank, m.v_head_dim},
                                true, device.memory_space()));
  DCP_ASSIGN_OR_RETURN(w.w_uk_, StageWeight(device, weights.w_uk, device.storage_dtype()));
  DCP_ASSIGN_OR_RETURN(w.w_uv_, StageWeight(device, weights.w_uv, device.storage_dtype()));
  if (w.engine_->dense_mha_available()) {
    DCP_ASSIGN_OR_RETURN(w.w_kv_b_, MlaProjections::CombineKvB(device, m, static_cast<int>(hl),
                                                               w.w_uk_.data(), w.w_uv_.data()));
  }
  const PlannerConfig& planner = w.engine_->planner();
  DCP_LOG(INFO) << "worker ready: " << hl << " heads, " << num_blocks << " KV blocks of "
                << block_size << ", workspace S=" << planner.workspace.rows_per_chunk
                << " rows, dense MHA " << (planner.dense_mha_available ? "on" : "off")
                << ", device " << device.name() << ", comm " << comm.name();
  return worker;
}

absl::Status Worker::AddRequest(int64_t request_id) { return cache_->AddRequest(request_id); }

absl::Status Worker::FreeRequest(int64_t request_id) { return cache_->FreeRequest(request_id); }

absl::Status Worker::TruncateRequest(int64_t request_id, int64_t num_tokens) {
  return cache_->Truncate(request_id, num_tokens);
}

absl::Status Worker::ForkRequest(int64_t request_id, int64_t from_id, int64_t num_tokens) {
  return cache_->Fork(request_id, from_id, num_tokens);
}

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
  return CheckLayerInputs({&options_.model, engine_->heads(), device_.memory_space(),
                           options_.attention.index_topk},
                          batch, inputs, outputs);
}

absl::Status Worker::StageTopk(absl::Span<const BatchRequest> batch, const TensorView& topk,
                               bool* checking) {
  *checking = false;
  DCP_ASSIGN_OR_RETURN(const void* staged, StageInput(device_, topk_, topk, DType::kI32));
  topk_data_ = static_cast<const int32_t*>(staged);
  // Checked where the step reads it: on the dense route the prefills read no row, so a bad row
  // there changes nothing the step computes (on the H200 the check of 4 x 2k rows of 2048 and
  // the wait for its verdict were ~50 us of a ~370 us 16-head dense layer).
  PlannerConfig planner = engine_->planner();
  planner.topk_width = static_cast<int>(topk.shape[1]);
  const TopkRows read = TopkRowsRead(batch, planner);
  if (!options_.attention.validate_topk || read.empty()) return absl::OkStatus();
  // This rank's share of the rows read: [begin, end) of T.
  const int64_t width = topk.shape[1], count = read.end - read.begin;
  const int64_t world = comm_.world_size(), rank = comm_.rank();
  const int64_t begin = read.begin + rank * count / world;
  const int64_t end = read.begin + (rank + 1) * count / world;
  if (begin == end) return absl::OkStatus();
  // Each token's position, a request's share of [begin, end) at a time (8192 prefill tokens:
  // a loop of stores, not a branch per token).
  std::vector<int32_t>& positions = topk_positions_host_;
  positions.resize(end - begin);
  int32_t max_position = 0;
  int64_t token = 0;  // the request's first token
  for (const BatchRequest& r : batch) {
    const int64_t first = std::max(token, begin), last = std::min(token + r.query_len, end);
    if (first < last) {
      const int32_t context = r.seq_len - r.query_len;
      std::iota(positions.begin() + (first - begin), positions.begin() + (last - begin),
                static_cast<int32_t>(context + (first - token)));
      max_position = std::max(max_position, static_cast<int32_t>(context + (last - 1 - token)));
    }
    token += r.query_len;
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
  DCP_RETURN_IF_ERROR(device_.BeginValidateTopk(p));
  *checking = true;
  return absl::OkStatus();
}

StepTables Worker::Tables(absl::Span<const BatchRequest> batch) {
  size_t max_blocks = 1;
  std::vector<absl::Span<const int32_t>> rows;
  for (const BatchRequest& r : batch) {
    auto table = cache_->table(r.request_id);  // registered: checked by CheckInputs
    rows.push_back(table.ok() ? *table : absl::Span<const int32_t>());
    max_blocks = std::max(max_blocks, rows.back().size());
  }
  tables_.assign(rows.size() * max_blocks, -1);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy(rows[i].begin(), rows[i].end(), tables_.begin() + i * max_blocks);
  }
  const KvCacheView view = cache_->view();
  return {tables_.data(), static_cast<int64_t>(max_blocks), view.num_blocks, view.block_size};
}

absl::Status Worker::Forward(absl::Span<const BatchRequest> batch, const BatchInputs& inputs,
                             const BatchOutputs& outputs) {
  const HostTimer forward_timer;
  stats_ = ForwardStats{};
  // The top-k is staged and its check enqueued first (every rank its share of the rows); the
  // host plans the step while the device checks, and the verdict is agreed before the layer
  // runs: no kernel consumes an unchecked top-k.
  absl::Status local = CheckInputs(batch, inputs, outputs);
  bool checking = false;
  if (local.ok() && !inputs.topk.shape.empty()) local = StageTopk(batch, inputs.topk, &checking);
  absl::Cleanup unfinished_check = [&] {
    if (checking) device_.FinishValidateTopk().IgnoreError();  // an earlier error returns
  };
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, local));
  // Blocks for the new tokens: every rank runs the same allocations, so an out-of-blocks error
  // is the same everywhere; still agreed. A step that fails from here on gives them back.
  absl::Cleanup release_blocks = [&] { cache_->ReleaseUncommitted(batch); };
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, cache_->Grow(batch)));

  HostTimer timer;
  const int topk_width = inputs.topk.shape.empty() ? 0 : static_cast<int>(inputs.topk.shape[1]);
  DCP_RETURN_IF_ERROR(engine_->Plan(batch, Tables(batch), topk_width));
  const double plan_s = timer.Elapsed();
  // Every rank agrees, checking or not: a rank whose share of the rows is empty (T < W) has
  // begun no check but must join the others' agreement.
  absl::Status verdict = absl::OkStatus();
  if (checking) {
    checking = false;
    verdict = device_.FinishValidateTopk();
  }
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, verdict));
  if (engine_->plan().num_tokens == 0) {
    stats_ = engine_->last_stats();
    stats_.plan_s = plan_s;
    return absl::OkStatus();
  }
  // The outcome is agreed as well: an error after the last collective of the layer (a kernel
  // fault, say) reaches every rank. What peers see of an error before a collective they wait
  // in is runtime/dcp.h's contract (DeadlineExceeded after dcp.comm_timeout_s).
  const absl::Status outcome = Execute(inputs, outputs);
  // A collective that timed out or broke the group cannot be agreed on (the agreement would
  // only report the broken communicator): that error is the answer, as the contract says.
  if (IsGroupFailure(outcome)) return outcome;
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, outcome));
  cache_->CommitLengths(batch);
  std::move(release_blocks).Cancel();
  stats_ = engine_->last_stats();
  stats_.plan_s = plan_s;
  stats_.total_s = forward_timer.Elapsed();
  return absl::OkStatus();
}

absl::Status Worker::Execute(const BatchInputs& inputs, const BatchOutputs& outputs) {
  const DType storage = device_.storage_dtype();
  DCP_ASSIGN_OR_RETURN(const void* kv_new, StageInput(device_, kv_new_, inputs.kv_new, storage));
  DCP_ASSIGN_OR_RETURN(const void* q_nope, StageInput(device_, q_nope_, inputs.q_nope, storage));
  DCP_ASSIGN_OR_RETURN(const void* q_rope, StageInput(device_, q_rope_, inputs.q_rope, storage));
  // Outputs straight into the caller's buffers when they are on the device, else through
  // scratch and a copy back.
  const bool out_direct = outputs.out.memory == device_.memory_space();
  const bool lse_direct = outputs.lse.memory == device_.memory_space();
  const size_t out_bytes = size_t(outputs.out.num_elements()) * dtype_size(outputs.out.dtype);
  const size_t lse_bytes = size_t(outputs.lse.num_elements()) * 4;
  void* out = outputs.out.data;
  void* lse = outputs.lse.data;
  if (!out_direct) {
    DCP_ASSIGN_OR_RETURN(out, out_.Reserve(device_, out_bytes));
  }
  if (!lse_direct) {
    DCP_ASSIGN_OR_RETURN(lse, lse_.Reserve(device_, lse_bytes));
  }
  LayerTensors tensors;
  tensors.q_nope = q_nope;
  tensors.q_rope = q_rope;
  tensors.kv_new = kv_new;
  tensors.topk = inputs.topk.shape.empty() ? nullptr : topk_data_;
  tensors.out = out;
  tensors.out_dtype = outputs.out.dtype;
  tensors.lse = static_cast<float*>(lse);
  DCP_RETURN_IF_ERROR(
      engine_->Run({w_uk_.data(), w_uv_.data(), w_kv_b_.data()}, cache_->view(), tensors));
  if (!out_direct) DCP_RETURN_IF_ERROR(device_.CopyToHost(outputs.out.data, out, out_bytes));
  if (!lse_direct) DCP_RETURN_IF_ERROR(device_.CopyToHost(outputs.lse.data, lse, lse_bytes));
  return device_.Synchronize();
}

absl::StatusOr<std::string> Worker::PlanJson(absl::Span<const BatchRequest> batch,
                                             bool has_topk) {
  absl::Status local = ValidateBatch(batch, options_.scheduler);
  if (local.ok() && !has_topk) {
    local = CheckLengthsWithoutTopk(batch, options_.attention.index_topk);
  }
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, local));
  DCP_ASSIGN_OR_RETURN(const Plan plan, ExchangePlan(comm_, batch, engine_->planner()));
  return PlanToJson(plan, comm_.world_size());
}

}  // namespace dcp
