// dcp_bench --mode engine: one attention layer the way an engine runs it (runtime/engine.h):
// the step planned once, then DcpEngine::Run per layer on a stream, eager and replayed from a
// CUDA graph, over an engine-owned paged cache. Per batch and head count: the host time inside
// Run (what a layer costs the CPU), the eager layer time and the graph-replayed layer time.
// Contents are synthetic (random values, and a top-k of the newest keys): timing only.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "launch/bench/bench_data.h"
#include "launch/bench/engine_timing.h"
#include "launch/bench/modes.h"
#include "runtime/engine.h"
#include "runtime/mla_projections.h"
#include "runtime/scratch.h"

namespace dcp::bench {
namespace {

std::vector<Column> EngineColumns(const BenchEnv& env) {
  std::vector<Column> columns = env.MetaColumns();
  const std::vector<Column> own = {{"batch", "batch"},
                                   {"requests", "reqs"},
                                   {"tokens", "tokens"},
                                   {"max_seq_len", "max_kv"},
                                   {"heads_per_rank", "H/W"},
                                   {"route", "route"},
                                   {"plan_us", "plan us"},
                                   {"host_us", "host us"},
                                   {"eager_us", "eager us"},
                                   {"graph_us", "graph us"},
                                   {"kernel_sum_us", "kernels us"},
                                   {"graph_nodes", "nodes"},
                                   {"graph_busy_us", "graph busy us"},
                                   {"eager_busy_us", "eager busy us"},
                                   {"graph_overhead_us", "graph ovh us"},
                                   {"eager_overhead_us", "eager ovh us"},
                                   {"status", "status"}};
  columns.insert(columns.end(), own.begin(), own.end());
  return columns;
}

// One (batch, heads) point: an engine of its own, the step planned, the layer timed.
absl::StatusOr<LayerTimes> TimeEngineLayer(BenchEnv& env, const BatchShape& shape, int heads,
                                           Route* route) {
  ModelDims m = env.dims;
  m.num_heads = heads * env.world_size;
  const int width = m.latent_width(), block = env.options.block_size;
  const int64_t t = shape.num_tokens;
  const int topk_width = env.options.index_topk;
  DcpOptions options;
  options.model = m;
  options.dcp.world_size = env.world_size;
  options.dcp.rank = env.rank;
  options.dcp.interleave = env.options.interleave;
  options.dcp.comm_timeout_s = env.options.timeout_s;
  DCP_RETURN_IF_ERROR(ParseCombineBackend(env.options.combine, &options.dcp.combine));
  options.scheduler.max_num_seqs = static_cast<int>(shape.requests.size());
  options.scheduler.max_model_len = shape.max_seq_len;
  options.scheduler.block_size = block;
  options.attention.index_topk = topk_width;
  if (!env.options.prefill_backends.empty()) {
    options.attention.prefill_backend = env.options.prefill_backends.front();
  }
  DCP_ASSIGN_OR_RETURN(auto engine, DcpEngine::Create(options, *env.comm, *env.device));

  // The engine's paged cache: each request its own consecutive blocks on this rank.
  const KvLayout layout{env.world_size, env.options.interleave};
  std::vector<BatchRequest> batch;
  int64_t max_blocks = 1, num_blocks = 0;
  for (size_t i = 0; i < shape.requests.size(); ++i) {
    const auto& r = shape.requests[i];
    batch.push_back({static_cast<int64_t>(i), r.seq_len, r.query_len});
    const int64_t n = (layout.local_length(r.seq_len, env.rank) + block - 1) / block;
    max_blocks = std::max(max_blocks, n);
    num_blocks += n;
  }
  std::vector<int32_t> tables(batch.size() * max_blocks, -1);
  int32_t next = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int64_t n = (layout.local_length(batch[i].seq_len, env.rank) + block - 1) / block;
    for (int64_t k = 0; k < n; ++k) tables[i * max_blocks + k] = next++;
  }
  num_blocks = std::max<int64_t>(num_blocks, 1);
  const StepTables step_tables{tables.data(), max_blocks, num_blocks, block};
  // Top-k: the newest min(K, position + 1) keys of each token, -1 after.
  std::vector<int32_t> topk(size_t(t) * topk_width, -1);
  int64_t token = 0;
  for (const BatchRequest& r : batch) {
    for (int q = 0; q < r.query_len; ++q, ++token) {
      const int position = r.seq_len - r.query_len + q;
      const int keys = std::min(topk_width, position + 1);
      for (int k = 0; k < keys; ++k) topk[token * topk_width + k] = position - k;
    }
  }
  // The first Plan sizes the engine's buffers; the timed ones re-plan the same step, as every
  // later step of an engine does.
  DCP_RETURN_IF_ERROR(engine->Plan(batch, step_tables, topk_width));
  const int plans = std::max(1, env.options.iters);
  const auto plan_start = std::chrono::steady_clock::now();
  for (int i = 0; i < plans; ++i) DCP_RETURN_IF_ERROR(engine->Plan(batch, step_tables, topk_width));
  const double plan_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - plan_start)
          .count() /
      plans;
  *route = engine->plan().route;

  Device& device = *env.device;
  const DType storage = device.storage_dtype();
  const int hl = heads;
  ScratchBuffer cache, w_uk, w_uv, q_nope, q_rope, kv_new, topk_d, out, lse;
  // Random values, never zeros (a GEMM or a softmax over zeros can run faster than on data);
  // weights scaled so that logits stay in a realistic range.
  uint64_t stream_id = 0;
  auto filled = [&](ScratchBuffer& b, size_t count, DType dtype,
                    float scale) -> absl::StatusOr<void*> {
    DCP_ASSIGN_OR_RETURN(void* data, b.Reserve(device, count * dtype_size(dtype)));
    DCP_RETURN_IF_ERROR(FillRandom(device, data, dtype, count, 20261201, ++stream_id, scale));
    return data;
  };
  const int dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim, r = m.kv_lora_rank;
  DCP_ASSIGN_OR_RETURN(void* cache_d,
                       filled(cache, size_t(num_blocks) * block * width, storage, 1));
  DCP_ASSIGN_OR_RETURN(void* w_uk_d, filled(w_uk, size_t(hl) * dn * r, storage, 0.05f));
  DCP_ASSIGN_OR_RETURN(void* w_uv_d, filled(w_uv, size_t(hl) * r * m.v_head_dim, storage, 0.05f));
  DCP_ASSIGN_OR_RETURN(void* q_nope_d, filled(q_nope, size_t(t) * hl * dn, storage, 1));
  DCP_ASSIGN_OR_RETURN(void* q_rope_d, filled(q_rope, size_t(t) * hl * dr, storage, 1));
  DCP_ASSIGN_OR_RETURN(void* kv_new_d, filled(kv_new, size_t(t) * width, storage, 1));
  const DType out_dtype = env.options.OutputDType();
  DCP_ASSIGN_OR_RETURN(void* out_d, filled(out, size_t(t) * hl * m.v_head_dim, out_dtype, 1));
  DCP_ASSIGN_OR_RETURN(void* lse_d, filled(lse, size_t(t) * hl, DType::kF32, 1));
  DCP_ASSIGN_OR_RETURN(int32_t * topk_ptr, Upload(device, topk_d, topk));
  DCP_RETURN_IF_ERROR(device.Synchronize());
  // vLLM's kv_b_proj as an engine holds it (the dense route's up-projection is one GEMM).
  DCP_ASSIGN_OR_RETURN(const Buffer w_kv_b,
                       MlaProjections::CombineKvB(device, m, hl, w_uk_d, w_uv_d));
  const LayerWeightsView weights{w_uk_d, w_uv_d, w_kv_b.data()};
  const KvCacheView cache_view{cache_d, storage, num_blocks, block, width};
  const LayerTensors tensors{
      q_nope_d, q_rope_d, kv_new_d, topk_ptr, out_d, static_cast<float*>(lse_d), out_dtype};
  DcpEngine& e = *engine;
  Communicator& comm = *env.comm;
  // Graphs need collectives that complete in stream order (NCCL); with host-staged ones the
  // layer is timed eagerly only.
  const bool graph = env.on_gpu() && comm.name().find("nccl") != std::string::npos;
  absl::StatusOr<LayerTimes> times = TimeLayer(
      env.on_gpu(), graph, env.options.warmup_iters, env.options.iters,
      [&](void* stream) { return e.Run(weights, cache_view, tensors, stream); },
      [&]() { return comm.WatchStream("dcp_bench engine graph"); },
      [&]() { return e.BindStream(nullptr); });
  if (times.ok()) times->plan_us = plan_us;
  return times;
}

}  // namespace

absl::StatusOr<ModeResult> RunEngine(BenchEnv& env) {
  const BenchOptions& o = env.options;
  ModeResult result;
  ResultTable table(EngineColumns(env));
  DCP_RETURN_IF_ERROR(AgreeOnStatus(*env.bootstrap, env.Stream(&table, "")));
  for (const std::string& spec : o.BatchList()) {
    DCP_ASSIGN_OR_RETURN(BatchShape shape, ParseShape(spec));
    for (int heads : o.heads) {
      Route route = Route::kSparseMqa;
      absl::StatusOr<LayerTimes> times = TimeEngineLayer(env, shape, heads, &route);
      const absl::Status agreed = AgreeOnStatus(*env.bootstrap, times.status());
      std::vector<std::string> row = env.MetaCells();
      const bool measured = agreed.ok() && times->kernel_sum_us >= 0;
      const bool graph_busy = agreed.ok() && times->graph_us >= 0 && times->graph_busy_us >= 0;
      const bool eager_busy = agreed.ok() && times->eager_busy_us >= 0;
      const std::vector<std::string> cells = {
          shape.spec,
          FormatInt(shape.requests.size()),
          FormatInt(shape.num_tokens),
          FormatInt(shape.max_seq_len),
          FormatInt(heads),
          route_name(route),
          agreed.ok() ? FormatFixed(times->plan_us, 1) : "-",
          agreed.ok() ? FormatFixed(times->host_us, 1) : "-",
          agreed.ok() ? FormatFixed(times->eager_us, 1) : "-",
          agreed.ok() && times->graph_us >= 0 ? FormatFixed(times->graph_us, 1) : "-",
          measured ? FormatFixed(times->kernel_sum_us, 1) : "-",
          measured ? FormatInt(times->graph_nodes) : "-",
          graph_busy ? FormatFixed(times->graph_busy_us, 1) : "-",
          eager_busy ? FormatFixed(times->eager_busy_us, 1) : "-",
          graph_busy ? FormatFixed(times->graph_us - times->graph_busy_us, 1) : "-",
          eager_busy ? FormatFixed(times->eager_us - times->eager_busy_us, 1) : "-",
          agreed.ok() ? "ok" : std::string(agreed.message())};
      row.insert(row.end(), cells.begin(), cells.end());
      if (!agreed.ok()) ++result.num_failed;
      if (agreed.ok() && !times->kernel_sum_note.empty()) {
        table.AddNote(absl::StrCat(spec, " at ", heads, " heads: no kernel sum (",
                                   times->kernel_sum_note, ")"));
      }
      if (agreed.ok() && !times->busy_note.empty()) {
        table.AddNote(
            absl::StrCat(spec, " at ", heads, " heads: no busy time (", times->busy_note, ")"));
      }
      if (agreed.ok() && env.root() && !times->graph_timeline.empty()) {
        std::fprintf(stderr, "timeline of one replayed layer, %s at %d heads:\n%s", spec.c_str(),
                     heads, times->graph_timeline.c_str());
      }
      table.AddRow(std::move(row));
    }
  }
  table.AddNote(
      "plan us: DcpEngine::Plan of the step (a re-plan, once per step, not per "
      "layer); host us: time inside DcpEngine::Run on the host per layer (enqueue); eager us: "
      "wall time per layer of Runs back to back on one stream; graph us: the layer "
      "captured once in a CUDA graph, replays back to back (NCCL only); kernels us: the sum "
      "of the graph's nodes (kernels, copies, memsets), each timed alone; busy us: the "
      "GPU's busy time per layer as the layer ran (CUPTI: the union of its kernels', "
      "copies' and memsets' intervals, from a traced repeat of the same Runs or "
      "replays); ovh us: graph or eager time minus its busy time, the time the GPU "
      "sat idle inside the layer (launch gaps, host time the device waits for).");
  result.tables.push_back({"", std::move(table)});
  return result;
}

}  // namespace dcp::bench
