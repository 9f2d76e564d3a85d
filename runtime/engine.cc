#include "runtime/engine.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <numeric>
#include <utility>

#include "attention/attention_params.h"
#include "core/logging.h"
#include "core/status.h"
#include "runtime/input_checks.h"
#include "runtime/route_outputs.h"

namespace dcp {
namespace {

// A run of consecutive cache slots that one request's new tokens are written to; `token` is the
// position of its first token.
struct SlotRun {
  int64_t first, last, request_id;
  int token;
};

// No new token may be written to a slot the step reads as cached context: tables that put a
// request's new token into a block of another request's context (or its own, a block listed
// twice) would overwrite a row the step then reads. `runs`: sorted by first, disjoint. One pass
// over the step's context blocks, as CheckStepTables makes: each block is looked up among the
// new tokens' blocks in `marks` (a byte per block id up to the largest such id, all zero on
// entry and on return) or, for ids past kMaxMarkedBlock, by binary search.
constexpr int64_t kMaxMarkedBlock = int64_t{1} << 22;
absl::Status CheckNewSlotsMissContext(const Plan& plan, const StepTables& tables,
                                      const KvLayout& layout, int rank,
                                      absl::Span<const SlotRun> runs, std::vector<uint8_t>& marks) {
  if (runs.empty()) return absl::OkStatus();
  const int64_t b = tables.block_size;
  std::vector<int64_t> blocks;  // the new tokens' blocks, sorted (the runs are)
  for (const SlotRun& run : runs) {
    for (int64_t k = run.first / b; k <= run.last / b; ++k) {
      if (blocks.empty() || blocks.back() != k) blocks.push_back(k);
    }
  }
  const bool dense = blocks.back() < kMaxMarkedBlock;
  if (dense) {
    if (marks.size() <= size_t(blocks.back())) marks.resize(size_t(blocks.back()) + 1, 0);
    for (int64_t k : blocks) marks[size_t(k)] = 1;
  }
  auto written = [&](int64_t block) {
    if (block > blocks.back()) return false;
    return dense ? marks[size_t(block)] != 0
                 : std::binary_search(blocks.begin(), blocks.end(), block);
  };
  absl::Status status = absl::OkStatus();
  for (const PlannedRequest& r : plan.requests) {
    const int64_t rows = layout.local_length(r.context_len(), rank);
    const int32_t* row = tables.row(r.batch_index);
    for (int64_t k = 0; k * b < rows && status.ok(); ++k) {
      if (!written(row[k])) continue;
      const int64_t lo = int64_t{row[k]} * b, hi = lo + std::min(b, rows - k * b) - 1;
      // Runs are disjoint: only the last one starting at or before `hi` can reach [lo, hi].
      auto it = std::upper_bound(runs.begin(), runs.end(), hi,
                                 [](int64_t slot, const SlotRun& run) { return slot < run.first; });
      if (it == runs.begin() || (--it)->last < lo) continue;
      const int64_t slot = std::max(lo, it->first);
      status = DCP_ERROR(InvalidArgument,
                         "request id %d: its new token at position %d is written to slot %d, "
                         "which request id %d reads as cached context (its local row %d) on "
                         "rank %d: the block tables overlap",
                         it->request_id, it->token + (slot - it->first), slot, r.request_id,
                         k * b + (slot - lo), rank);
    }
    if (!status.ok()) break;
  }
  if (dense) {
    for (int64_t k : blocks) marks[size_t(k)] = 0;
  }
  return status;
}

}  // namespace

DcpEngine::DcpEngine(const DcpOptions& options, Communicator& comm, Device& device)
    : options_(options),
      comm_(comm),
      device_(device),
      heads_(options.model.num_heads / options.dcp.world_size),
      projections_(device, options.model, options.model.num_heads / options.dcp.world_size) {}

absl::StatusOr<std::unique_ptr<DcpEngine>> DcpEngine::Create(const DcpOptions& options,
                                                             Communicator& comm,
                                                             Device& device) {
  DCP_RETURN_IF_ERROR(ValidateConfigs(options.model, options.dcp, options.scheduler,
                                      options.attention));
  DCP_CHECK_ARG(options.dcp.world_size == comm.world_size() && options.dcp.rank == comm.rank(),
                "dcp.world_size/rank (%d, %d) disagree with the communicator (%d, %d)",
                options.dcp.world_size, options.dcp.rank, comm.world_size(), comm.rank());
  // Errors name the rank ("[rank r]") in an engine's process too, where no launcher set it.
  if (current_rank() < 0) set_current_rank(comm.rank());
  auto engine = std::unique_ptr<DcpEngine>(new DcpEngine(options, comm, device));
  DcpEngine& e = *engine;
  const ModelDims& m = options.model;
  const int width = m.latent_width();
  const KvLayout layout{options.dcp.world_size, options.dcp.interleave};

  // Decodes always take the sparse route: a model its kernels cannot run is refused here, not
  // at the first Run (after the cache write).
  DCP_RETURN_IF_ERROR(device.SparseMqaSupport(width, m.kv_lora_rank));
  // Prefill backend and workspace.
  DCP_ASSIGN_OR_RETURN(e.planner_.dense_mha_available,
                       ResolvePrefillBackend(options.attention,
                                             device.SelectPrefillBackend(
                                                 options.attention.prefill_backend, e.heads_,
                                                 m.qk_head_dim(), m.v_head_dim)));
  e.planner_.scheduler = options.scheduler;
  e.planner_.attention = options.attention;
  e.planner_.layout = layout;
  e.planner_.settings = SettingsFingerprint(options);
  DCP_ASSIGN_OR_RETURN(
      e.planner_.workspace,
      ComputeWorkspaceSize({options.scheduler.block_size, options.scheduler.max_num_seqs,
                            options.scheduler.max_model_len, options.attention.index_topk,
                            options.dcp.world_size, options.dcp.interleave, width,
                            options.workspace_rows_override}));
  if (e.planner_.dense_mha_available) {
    // A chunk's all-gather carries S/W rows a rank (fp8 rows as 328 16-bit units, bf16 as
    // R + Dr): past what one call carries (MPI: int), every chunk would fail inside Run.
    const uint64_t chunk_count = uint64_t(e.planner_.workspace.local_rows) *
                                 uint64_t(std::max(width, fp8_ds_mla::kRowBytes / 2));
    DCP_CHECK_ARG(options.dcp.world_size == 1 || chunk_count <= comm.max_count(),
                  "a workspace chunk of %d rows a rank needs all-gathers of %d elements, more "
                  "than one %s call carries (%d): set a smaller workspace_rows",
                  e.planner_.workspace.local_rows, chunk_count, comm.name(), comm.max_count());
    DCP_ASSIGN_OR_RETURN(e.workspace_,
                         device.Allocate(size_t(e.planner_.workspace.total_rows) * width *
                                         dtype_size(device.storage_dtype())));
  }
  e.sparse_ = std::make_unique<SparseRoute>(device, comm, m, m.scale(), options.dcp.combine,
                                            layout, options.dcp.rank, e.projections_,
                                            options.attention.kv_cache_dtype);
  e.dense_ = std::make_unique<DenseRoute>(device, comm, m, m.scale(), layout, options.dcp.rank,
                                          e.projections_, e.workspace_.data());
  return engine;
}

absl::Status DcpEngine::Plan(absl::Span<const BatchRequest> batch, const StepTables& tables,
                             int topk_width) {
  planned_ = false;
  const KvLayout& layout = planner_.layout;
  const int rank = options_.dcp.rank;
  absl::Status local = ValidateBatch(batch, options_.scheduler);
  // The block size first: tables of another block size would be misread entry by entry.
  if (local.ok() && !batch.empty() && tables.block_size != options_.scheduler.block_size) {
    local = DCP_ERROR(InvalidArgument, "block tables of %d-row blocks, the scheduler's are %d",
                      tables.block_size, options_.scheduler.block_size);
  }
  if (local.ok()) local = CheckStepTables(batch, tables, layout, rank);
  if (local.ok() && layout.world_size > 1) {
    // Every collective of the step carries at most tokens x H/W x max(R + Dr, W) elements a
    // rank (the sparse route's q' all-gather is the largest; the combine's are smaller): one
    // past what the communicator's calls carry (MPI: int) would fail inside Run, after the
    // cache write.
    int64_t tokens = 0;
    for (const BatchRequest& r : batch) tokens += r.query_len;
    const int width = options_.model.latent_width();
    const uint64_t count =
        uint64_t(tokens) * uint64_t(heads_) * uint64_t(std::max(width, layout.world_size));
    if (count > comm_.max_count()) {
      local = DCP_ERROR(InvalidArgument,
                        "a step of %d tokens needs collectives of %d elements a rank (tokens x %d "
                        "heads x %d), more than one %s call carries (%d): split the step",
                        tokens, count, heads_, std::max(width, layout.world_size), comm_.name(),
                        comm_.max_count());
    }
  }
  if (local.ok() && (topk_width < 0 || topk_width > kMaxTopkWidth)) {
    local = DCP_ERROR(InvalidArgument, "top-k width %d outside [0, 2^20]", topk_width);
  }
  if (local.ok() && topk_width == 0) {
    local = CheckLengthsWithoutTopk(batch, options_.attention.index_topk);
  }
  const bool damage = damage_next_plan_;
  damage_next_plan_ = false;

  // Device metadata of the step, uploaded once; buffers sized for every layer's Run. Runs on
  // the checked plan inside ExchangePlan, whose last agreement covers it.
  auto prepare = [&](const dcp::Plan& checked) -> absl::Status {
    plan_ = checked;
    StagingBatch uploads(device_);  // every array below lands with one flush at the end
    const int64_t t = plan_.num_tokens;
    const ModelDims& m = options_.model;
    const size_t element = dtype_size(device_.storage_dtype());
    // Execution order and the slots the new tokens are written to (caller order), a request and
    // a run of slots at a time (TokenSlotWalker::NextRun: whole blocks at W = 1), into buffers
    // kept from step to step. Every entry is written: no clearing pass.
    std::vector<int32_t>& perm = perm_host_;
    std::vector<int32_t>& write_slots = write_slots_host_;
    perm.resize(t);
    write_slots.resize(t);
    // The written slots as runs of consecutive slots (a request's new tokens fill its blocks
    // in order): two new tokens share a slot iff two runs overlap. A few runs per block to
    // sort instead of a hash insert per token (4096 tokens: ~150 us less on the host).
    std::vector<SlotRun> runs;
    identity_order_ = true;
    for (const PlannedRequest& r : plan_.requests) {
      identity_order_ = identity_order_ && r.token_begin == r.caller_token_begin;
      std::iota(perm.begin() + r.token_begin, perm.begin() + r.token_begin + r.query_len,
                static_cast<int32_t>(r.caller_token_begin));
      const int32_t* row = tables.row(r.batch_index);
      const size_t request_runs = runs.size();
      TokenSlotWalker slots(row, tables.block_size, layout, rank, r.context_len());
      int32_t* out = write_slots.data() + r.caller_token_begin;
      for (int i = 0; i < r.query_len;) {
        const TokenSlotWalker::Run run = slots.NextRun(r.query_len - i);
        if (run.first < 0) {
          std::fill_n(out + i, run.length, -1);
        } else {
          std::iota(out + i, out + i + run.length, static_cast<int32_t>(run.first));
          const int64_t last = run.first + run.length - 1;
          if (runs.size() > request_runs && runs.back().last + 1 == run.first) {
            runs.back().last = last;
          } else {
            runs.push_back({run.first, last, r.request_id, r.context_len() + i});
          }
        }
        i += run.length;
      }
    }
    if (tables.slot_mapping != nullptr) {
      for (const PlannedRequest& r : plan_.requests) {
        for (int i = 0; i < r.query_len; ++i) {
          const int64_t token = r.caller_token_begin + i;
          DCP_CHECK_ARG(tables.slot_mapping[token] == write_slots[token],
                        "slot_mapping[%d] = %d, but the block tables put new token %d of request "
                        "id %d (position %d) at slot %d on rank %d",
                        token, tables.slot_mapping[token], i, r.request_id,
                        r.context_len() + i, write_slots[token], rank);
        }
      }
    }
    std::sort(runs.begin(), runs.end(),
              [](const SlotRun& a, const SlotRun& b) { return a.first < b.first; });
    for (size_t k = 1; k < runs.size(); ++k) {
      DCP_CHECK_ARG(runs[k].first > runs[k - 1].last,
                    "request id %d: new token %d maps to slot %d, which another new token of "
                    "the step writes too (block tables overlap)",
                    runs[k].request_id, runs[k].token, runs[k].first);
    }
    DCP_RETURN_IF_ERROR(CheckNewSlotsMissContext(plan_, tables, layout, rank, runs, block_marks_));
    DCP_RETURN_IF_ERROR(Upload(device_, perm_, perm).status());
    DCP_RETURN_IF_ERROR(Upload(device_, write_slots_, write_slots).status());
    DCP_RETURN_IF_ERROR(q_nope_exec_.Reserve(device_, size_t(t) * heads_ * m.qk_nope_head_dim *
                                                          element).status());
    DCP_RETURN_IF_ERROR(q_rope_exec_.Reserve(device_, size_t(t) * heads_ * m.qk_rope_head_dim *
                                                          element).status());
    DCP_RETURN_IF_ERROR(
        kv_new_exec_.Reserve(device_, size_t(t) * m.latent_width() * element).status());
    if (topk_width > 0) {
      DCP_RETURN_IF_ERROR(topk_exec_.Reserve(device_, size_t(t) * topk_width * 4).status());
    }
    DCP_RETURN_IF_ERROR(out_exec_.Reserve(device_, size_t(t) * heads_ * m.v_head_dim * 4).status());
    DCP_RETURN_IF_ERROR(lse_exec_.Reserve(device_, size_t(t) * heads_ * 4).status());
    const int64_t mqa_tokens = plan_.route == Route::kDenseMha ? plan_.num_decode_tokens : t;
    DCP_RETURN_IF_ERROR(sparse_->Prepare(plan_, tables, mqa_tokens, topk_width));
    if (plan_.route == Route::kDenseMha) DCP_RETURN_IF_ERROR(dense_->Prepare(plan_, tables));
    // No wait: the uploads are staged (Device::StageToDevice), in stream order before every
    // later launch, so this step's plan can be made while the previous step still runs.
    return uploads.Flush();
  };
  // Three host collectives at W > 1: the inputs' check with the planning, the plan, and the
  // plan's check with the preparation (ExchangePlan).
  PlannerConfig config = planner_;
  config.topk_width = topk_width;
  const absl::Status exchanged =
      ExchangePlan(comm_, batch, config, local, prepare, damage).status();
  if (!exchanged.ok()) {
    plan_ = dcp::Plan{};  // plan() describes no step until a Plan succeeds
    return exchanged;
  }
  topk_width_ = topk_width;
  min_cache_blocks_ = tables.num_blocks;
  planned_ = true;
  return absl::OkStatus();
}

absl::Status DcpEngine::CheckRunArguments(const LayerWeightsView& weights,
                                          const KvCacheView& cache,
                                          const LayerTensors& tensors) const {
  DCP_CHECK_ARG(planned_, "Run before a successful Plan of the step");
  const int width = options_.model.latent_width();
  DCP_CHECK_ARG(cache.data != nullptr, "the KV cache has no data pointer");
  DCP_CHECK_ARG(cache.dtype == device_.storage_dtype(),
                "the KV cache holds %s rows, this rank's device stores %s",
                dtype_name(cache.dtype), dtype_name(device_.storage_dtype()));
  DCP_CHECK_ARG(cache.block_size == options_.scheduler.block_size,
                "the KV cache has %d-row blocks, the scheduler's are %d", cache.block_size,
                options_.scheduler.block_size);
  DCP_CHECK_ARG(cache.format == options_.attention.kv_cache_dtype,
                "the KV cache holds %s rows, attention.kv_cache_dtype is %s",
                kv_cache_dtype_name(cache.format),
                kv_cache_dtype_name(options_.attention.kv_cache_dtype));
  if (cache.format == KvCacheDType::kFp8DsMla) {
    DCP_CHECK_ARG(cache.row_stride == fp8_ds_mla::kRowBytes,
                  "the fp8_ds_mla KV cache's row stride is %d bytes; its rows are %d bytes",
                  cache.row_stride, fp8_ds_mla::kRowBytes);
  } else {
    DCP_CHECK_ARG(cache.row_stride >= width,
                  "the KV cache's row stride %d is below a row's %d elements", cache.row_stride,
                  width);
  }
  DCP_CHECK_ARG(cache.num_blocks >= min_cache_blocks_,
                "the KV cache has %d blocks, the step's block tables address %d",
                cache.num_blocks, min_cache_blocks_);
  DCP_CHECK_ARG(cache.num_slots() <= std::numeric_limits<int32_t>::max(),
                "KV cache of %d slots exceeds the int32 slot range", cache.num_slots());
  DCP_CHECK_ARG(weights.w_uk != nullptr && weights.w_uv != nullptr, "the layer has no weights");
  const bool any_tokens = plan_.num_tokens > 0;
  DCP_CHECK_ARG(!any_tokens || (tensors.q_nope && tensors.q_rope && tensors.kv_new &&
                                tensors.out && tensors.lse),
                "a layer tensor (q_nope, q_rope, kv_new, out, lse) has no data pointer");
  DCP_CHECK_ARG(tensors.out_dtype == DType::kF32 || tensors.out_dtype == DType::kBF16,
                "the layer's out dtype must be F32 or BF16 (got %s)",
                dtype_name(tensors.out_dtype));
  DCP_CHECK_ARG((tensors.topk != nullptr) == (topk_width_ > 0 && any_tokens) || !any_tokens,
                "the step was planned %s a top-k but the layer has %s",
                topk_width_ > 0 ? "with" : "without", tensors.topk ? "one" : "none");
  if (!any_tokens) return absl::OkStatus();
  const size_t element = dtype_size(device_.storage_dtype());
  const int64_t cache_row_bytes =
      cache.format == KvCacheDType::kFp8DsMla ? cache.row_stride : cache.row_stride * element;
  DCP_RETURN_IF_ERROR(
      device_.CheckLayerMemory(cache.data, cache_row_bytes, tensors.out, tensors.out_dtype));
  // What Run writes (out, lse, the cache rows) must not overlap what it reads (the layer's
  // inputs and weights) or another write: out written over kv_new would feed the decodes'
  // outputs to the prefills' attention, over w_uv the next layer's projection.
  struct Extent {
    const char* name;
    uintptr_t begin = 0, end = 0;
  };
  const ModelDims& m = options_.model;
  const int64_t t = plan_.num_tokens;
  auto extent = [](const char* name, const void* data, int64_t bytes) {
    const auto begin = reinterpret_cast<uintptr_t>(data);
    return Extent{name, begin, data != nullptr ? begin + uintptr_t(bytes) : begin};
  };
  const Extent reads[] = {
      extent("q_nope", tensors.q_nope, t * heads_ * m.qk_nope_head_dim * element),
      extent("q_rope", tensors.q_rope, t * heads_ * m.qk_rope_head_dim * element),
      extent("kv_new", tensors.kv_new, t * width * element),
      extent("topk", tensors.topk, t * topk_width_ * 4),
      extent("w_uk", weights.w_uk, int64_t{heads_} * m.qk_nope_head_dim * m.kv_lora_rank * element),
      extent("w_uv", weights.w_uv, int64_t{heads_} * m.kv_lora_rank * m.v_head_dim * element),
      extent("w_kv_b", weights.w_kv_b,
             int64_t{heads_} * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank * element),
  };
  const Extent writes[] = {
      extent("out", tensors.out, t * heads_ * m.v_head_dim * dtype_size(tensors.out_dtype)),
      extent("lse", tensors.lse, t * heads_ * 4),
      extent("the KV cache", cache.data, cache.num_slots() * cache_row_bytes),
  };
  auto overlap = [](const Extent& a, const Extent& b) {
    return a.begin < a.end && b.begin < b.end && a.begin < b.end && b.begin < a.end;
  };
  for (size_t w = 0; w < std::size(writes); ++w) {
    for (const Extent& r : reads) {
      DCP_CHECK_ARG(!overlap(writes[w], r),
                    "%s overlaps %s: Run writes the one and reads the other", writes[w].name,
                    r.name);
    }
    for (size_t o = w + 1; o < std::size(writes); ++o) {
      DCP_CHECK_ARG(!overlap(writes[w], writes[o]), "%s overlaps %s: Run writes both",
                    writes[w].name, writes[o].name);
    }
  }
  return absl::OkStatus();
}

absl::Status DcpEngine::Run(const LayerWeightsView& weights, const KvCacheView& cache,
                            const LayerTensors& tensors, void* stream) {
  DCP_RETURN_IF_ERROR(CheckRunArguments(weights, cache, tensors));
  StepStats step(device_);
  step.route = plan_.route;
  step.num_decodes = plan_.num_decodes;
  step.num_prefills = plan_.num_prefills;
  step.num_chunks = static_cast<int>(plan_.chunks.size());
  step.num_tokens = plan_.num_tokens;
  stats_ = step;
  StepStats* stats = collect_stats_ ? &step : nullptr;
  const int64_t t = plan_.num_tokens;
  if (t == 0) return absl::OkStatus();
  if (!stream_bound_ || stream != bound_stream_) DCP_RETURN_IF_ERROR(BindStream(stream));
  return [&]() -> absl::Status {
    const ModelDims& m = options_.model;
    const int hl = heads_, dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim;
    const int dv = m.v_head_dim, width = m.latent_width();
    const DType storage = device_.storage_dtype();
    const size_t element = dtype_size(storage);
    const PhaseTimer total(stats);
    PhaseTimer timer(stats);
    projections_.Bind(weights.w_uk, weights.w_uv, weights.w_kv_b);

    // The new tokens' rows into the cache (those this rank owns), then every input in
    // execution order (decodes first).
    if (cache.format == KvCacheDType::kFp8DsMla) {
      // Quantized on the way in (one kernel): [kv_c | k_pe] -> 656-byte rows.
      Fp8DsMlaWriteParams p;
      p.kv_c = tensors.kv_new;
      p.k_pe = static_cast<const std::byte*>(tensors.kv_new) + size_t(m.kv_lora_rank) * element;
      p.slot_mapping = write_slots_.as<int32_t>();
      p.cache = static_cast<uint8_t*>(cache.data);
      p.dtype = storage;
      p.num_rows = t;
      p.num_slots = cache.num_slots();
      p.kv_c_row_stride = width;
      p.k_pe_row_stride = width;
      p.cache_row_bytes = cache.row_stride;
      DCP_RETURN_IF_ERROR(device_.WriteFp8DsMlaRows(p));
    } else {
      DCP_RETURN_IF_ERROR(device_.ScatterRows({tensors.kv_new, write_slots_.as<int32_t>(),
                                               cache.data, storage, t, cache.num_slots(), width,
                                               width, cache.row_stride}));
    }
    // Inputs in execution order (decodes first): as given when the caller's batch already is
    // (an engine's usually is), else gathered.
    const int32_t* perm = perm_.as<int32_t>();
    auto reorder = [&](const void* src, ScratchBuffer& exec, DType dtype,
                       int row) -> absl::StatusOr<const void*> {
      if (identity_order_) return src;
      DCP_ASSIGN_OR_RETURN(void* dst, exec.Get(size_t(t) * row * dtype_size(dtype)));
      DCP_RETURN_IF_ERROR(device_.GatherRows({src, perm, dst, dtype, t, t, row, row, row}));
      return static_cast<const void*>(dst);
    };
    DCP_ASSIGN_OR_RETURN(const void* q_nope,
                         reorder(tensors.q_nope, q_nope_exec_, storage, hl * dn));
    DCP_ASSIGN_OR_RETURN(const void* q_rope,
                         reorder(tensors.q_rope, q_rope_exec_, storage, hl * dr));
    DCP_ASSIGN_OR_RETURN(const void* kv_exec,
                         reorder(tensors.kv_new, kv_new_exec_, storage, width));
    const int32_t* topk = nullptr;
    if (topk_width_ > 0) {
      DCP_ASSIGN_OR_RETURN(const void* exec,
                           reorder(tensors.topk, topk_exec_, DType::kI32, topk_width_));
      topk = static_cast<const int32_t*>(exec);
    }
    timer.End(&ForwardStats::cache_write_s);

    // Outputs in execution order: the caller's buffers, or scratch scattered back below (in
    // the out dtype, 4 bytes per value reserved).
    RouteOutputs exec{tensors.out, tensors.out_dtype, tensors.lse};
    if (!identity_order_) {
      DCP_ASSIGN_OR_RETURN(exec.out,
                           out_exec_.Get(size_t(t) * hl * dv * dtype_size(tensors.out_dtype)));
      DCP_ASSIGN_OR_RETURN(void* lse_data, lse_exec_.Get(size_t(t) * hl * 4));
      exec.lse = static_cast<float*>(lse_data);
    }
    DCP_RETURN_IF_ERROR(sparse_->Run(cache, {q_nope, q_rope, topk}, exec, stats));
    if (plan_.route == Route::kDenseMha) {
      const size_t first = static_cast<size_t>(plan_.num_decode_tokens);
      const DenseRouteInputs prefill{
          static_cast<const std::byte*>(q_nope) + first * hl * dn * element,
          static_cast<const std::byte*>(q_rope) + first * hl * dr * element,
          static_cast<const std::byte*>(kv_exec) + first * width * element};
      DCP_RETURN_IF_ERROR(
          dense_->Run(cache, prefill, exec.From(int64_t(first), int64_t{hl} * dv, hl), stats));
    }
    // Back to the caller's order, into the caller's buffers.
    if (!identity_order_) {
      DCP_RETURN_IF_ERROR(device_.ScatterRows({exec.out, perm, tensors.out, tensors.out_dtype, t,
                                               t, hl * dv, hl * dv, hl * dv}));
      DCP_RETURN_IF_ERROR(
          device_.ScatterRows({exec.lse, perm, tensors.lse, DType::kF32, t, t, hl, hl, hl}));
    }
    if (stats) {
      // The marks are read once, at the end of the layer: the only wait of a stats run.
      total.End(&ForwardStats::total_s);
      DCP_RETURN_IF_ERROR(step.Finish());
      stats_ = step;
    }
    return absl::OkStatus();
  }();
}

absl::Status DcpEngine::BindStream(void* stream) {
  // The device enqueues on the stream; the collectives too, completing in stream order when a
  // stream is given (the device's own stream keeps today's host completion).
  DCP_RETURN_IF_ERROR(device_.SetStream(stream));
  const absl::Status bound =
      comm_.BindStream(stream, stream != nullptr ? Completion::kStream : Completion::kHost);
  if (!bound.ok()) {
    // The device goes back to the stream the engine was bound to (its own if none), so that a
    // later Run is not split between two streams: kernels on the new one, collectives on the old.
    (void)device_.SetStream(stream_bound_ ? bound_stream_ : nullptr);
    stream_bound_ = false;
    return bound;
  }
  bound_stream_ = stream;
  stream_bound_ = true;
  return absl::OkStatus();
}

}  // namespace dcp
