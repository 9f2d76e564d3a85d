// routes: the comparison at the heart of the seed (vLLM's mla_sparse_mha_vs_mqa config). Per
// batch and per-rank head count, the latency of the whole layer (DcpContext::Forward) through
// the planner's choice ("auto": dense MHA when every prefill has seq_len <= K) and through the
// forced sparse MQA route, the speedup t_mqa / t_auto, the per-phase split of both, and the
// crossover seq_len per batch size. #wrong: output elements where the two routes disagree
// beyond the storage dtype's tolerance (they compute the same function when seq_len <= K).
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "launch/bench/bench_data.h"
#include "launch/bench/modes.h"
#include "runtime/dcp.h"
#include "core/kv_layout.h"
#include "core/status.h"

namespace dcp::bench {
namespace {

constexpr uint64_t kStreamQNope = 1, kStreamQRope = 2, kStreamWuk = 3, kStreamWuv = 4;
constexpr uint64_t kStreamKv = 1000;  // + request index

// The phases of ForwardStats, "other" (total minus the phases: validation, staging, output
// scatter), then the collectives' own time, which lies inside gather and combine.
constexpr int kNumPhases = 9;
constexpr std::array<const char*, kNumPhases> kPhaseNames = {
    "plan",    "cache_write", "gather",          "up_proj",     "attention",
    "combine", "other",       "all_gather_comm", "combine_comm"};
constexpr int kAttentionPhase = 4;

// Inputs of one batch that do not depend on the head count, on this rank's device.
struct BatchData {
  std::vector<BatchRequest> requests;
  Buffer kv_new;                     // [T, R + Dr] storage dtype
  Buffer topk;                       // [T, K] I32
  std::vector<Buffer> cached;        // per request: this rank's context rows
  std::vector<int64_t> cached_rows;  // their counts
};

// Inputs that depend on the head count.
struct HeadData {
  int heads = 0;  // per rank
  ModelDims model;
  std::vector<float> w_uk, w_uv;  // host F32 [Hl, Dn, R], [Hl, R, Dv]
  Buffer q_nope, q_rope;          // [T, Hl, Dn], [T, Hl, Dr] storage dtype
};

struct RouteResult {
  absl::Status status;
  Route route = Route::kSparseMqa;
  StepTimes times;
  std::array<double, kNumPhases> phases_s{};
  std::vector<float> out, lse;
};

absl::StatusOr<BatchData> MakeBatchData(BenchEnv& env, const BatchShape& shape) {
  const ModelDims& dims = env.dims;
  const int width = dims.latent_width();
  const int topk = env.options.index_topk;
  const DType storage = env.device->storage_dtype();
  const KvLayout layout{env.world_size, env.options.interleave};
  const uint64_t seed = env.options.seed;
  BatchData data;
  std::vector<float> kv_new(size_t(shape.num_tokens) * width);
  std::vector<int32_t> topk_rows(size_t(shape.num_tokens) * topk);
  int64_t t = 0;
  for (size_t i = 0; i < shape.requests.size(); ++i) {
    const launch::RequestShape& r = shape.requests[i];
    const ValueStream kv(seed, kStreamKv + i);
    data.requests.push_back({static_cast<int64_t>(i), r.seq_len, r.query_len});
    const int64_t context = r.seq_len - r.query_len;
    for (int64_t q = 0; q < r.query_len; ++q, ++t) {
      const int64_t g = context + q;
      for (int c = 0; c < width; ++c) {
        kv_new[t * width + c] = kv(uint64_t(g) * width + c);
      }
      FillTopkRow(static_cast<int32_t>(g), topk, &topk_rows[size_t(t) * topk]);
    }
    const int64_t rows = layout.local_length(context, env.rank);
    std::vector<float> local(size_t(rows) * width);
    for (int64_t j = 0; j < rows; ++j) {
      const int64_t g = layout.global_index(j, env.rank);
      for (int c = 0; c < width; ++c) {
        local[j * width + c] = kv(uint64_t(g) * width + c);
      }
    }
    DCP_ASSIGN_OR_RETURN(Buffer cached, UploadAs(*env.device, local, storage));
    data.cached.push_back(std::move(cached));
    data.cached_rows.push_back(rows);
  }
  DCP_ASSIGN_OR_RETURN(data.kv_new, UploadAs(*env.device, kv_new, storage));
  DCP_ASSIGN_OR_RETURN(data.topk, UploadInts(*env.device, topk_rows));
  return data;
}

absl::StatusOr<HeadData> MakeHeadData(BenchEnv& env, const BatchShape& shape, int heads) {
  HeadData data;
  data.heads = heads;
  data.model = env.dims;
  data.model.num_heads = heads * env.world_size;
  const ModelDims& m = data.model;
  const int dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim, dv = m.v_head_dim;
  const int r = m.kv_lora_rank;
  const int first_head = env.rank * heads;
  const uint64_t seed = env.options.seed;
  // Weights ~ U(-1, 1) / sqrt(R): up-projected K and V stay O(1).
  const float weight_scale = 1.0f / std::sqrt(static_cast<float>(r));
  const ValueStream uk(seed, kStreamWuk), uv(seed, kStreamWuv);
  data.w_uk.resize(size_t(heads) * dn * r);
  data.w_uv.resize(size_t(heads) * r * dv);
  for (int h = 0; h < heads; ++h) {
    const uint64_t head = first_head + h;
    for (size_t x = 0; x < size_t(dn) * r; ++x) {
      data.w_uk[h * size_t(dn) * r + x] = weight_scale * uk(head * dn * r + x);
    }
    for (size_t x = 0; x < size_t(r) * dv; ++x) {
      data.w_uv[h * size_t(r) * dv + x] = weight_scale * uv(head * r * dv + x);
    }
  }
  // Queries: a generated block repeated on the device (gigabytes at 128 heads and 16k
  // tokens; both routes read the same values, which is all the comparison needs).
  const DType storage = env.device->storage_dtype();
  const size_t nope_count = size_t(shape.num_tokens) * heads * dn;
  const size_t rope_count = size_t(shape.num_tokens) * heads * dr;
  DCP_ASSIGN_OR_RETURN(data.q_nope,
                       env.device->Allocate(std::max<size_t>(nope_count, 1) * dtype_size(storage)));
  DCP_ASSIGN_OR_RETURN(data.q_rope,
                       env.device->Allocate(std::max<size_t>(rope_count, 1) * dtype_size(storage)));
  DCP_RETURN_IF_ERROR(FillRandom(*env.device, data.q_nope.data(), storage, nope_count, seed,
                                 kStreamQNope + 16 * uint64_t(env.rank)));
  DCP_RETURN_IF_ERROR(FillRandom(*env.device, data.q_rope.data(), storage, rope_count, seed,
                                 kStreamQRope + 16 * uint64_t(env.rank)));
  return data;
}

// One route of one batch: a context of its own, warm-up, timed Forwards, outputs kept.
RouteResult RunRoute(BenchEnv& env, const BatchShape& shape, const BatchData& batch,
                     const HeadData& head, bool force_mqa) {
  RouteResult result;
  const ModelDims& m = head.model;
  const int width = m.latent_width(), hl = head.heads;
  const int64_t t = shape.num_tokens;
  const MemorySpace memory = env.device->memory_space();
  const DType storage = env.device->storage_dtype();

  DcpOptions options;
  options.model = m;
  options.dcp.world_size = env.world_size;
  options.dcp.rank = env.rank;
  options.dcp.interleave = env.options.interleave;
  options.dcp.comm_timeout_s = env.options.timeout_s;
  result.status = ParseCombineBackend(env.options.combine, &options.dcp.combine);
  if (!result.status.ok()) return result;
  options.scheduler.max_num_seqs = static_cast<int>(shape.requests.size());
  options.scheduler.max_model_len = shape.max_seq_len;
  options.scheduler.block_size = env.options.block_size;
  options.attention.index_topk = env.options.index_topk;
  options.attention.force_mqa = force_mqa;
  if (!env.options.prefill_backends.empty()) {
    options.attention.prefill_backend = env.options.prefill_backends.front();
  }

  LayerWeights weights;
  weights.w_uk = {
      head.w_uk.data(), DType::kF32, {hl, m.qk_nope_head_dim, m.kv_lora_rank}, MemorySpace::kHost};
  weights.w_uv = {
      head.w_uv.data(), DType::kF32, {hl, m.kv_lora_rank, m.v_head_dim}, MemorySpace::kHost};
  auto context_or = DcpContext::Create(options, *env.comm, *env.device, weights);
  result.status = AgreeOnStatus(*env.bootstrap, context_or.status());
  if (!result.status.ok()) return result;
  DcpContext& context = **context_or;

  const DType out_dtype = env.options.OutputDType();
  auto out_or =
      AllocateZeroed(*env.device, size_t(t) * hl * m.v_head_dim * dtype_size(out_dtype));
  auto lse_or = AllocateZeroed(*env.device, size_t(t) * hl * 4);
  result.status = AgreeOnStatus(*env.bootstrap, out_or.ok() ? lse_or.status() : out_or.status());
  if (!result.status.ok()) return result;
  const Buffer out = std::move(out_or).value(), lse = std::move(lse_or).value();

  BatchInputs inputs;
  inputs.q_nope = {head.q_nope.data(), storage, {t, hl, m.qk_nope_head_dim}, memory};
  inputs.q_rope = {head.q_rope.data(), storage, {t, hl, m.qk_rope_head_dim}, memory};
  inputs.kv_new = {batch.kv_new.data(), storage, {t, width}, memory};
  inputs.topk = {batch.topk.data(), DType::kI32, {t, env.options.index_topk}, memory};
  BatchOutputs outputs;
  outputs.out = {out.data(), out_dtype, {t, hl, m.v_head_dim}, memory};
  outputs.lse = {lse.data(), DType::kF32, {t, hl}, memory};

  bool registered = false;
  const auto setup = [&]() -> absl::Status {
    for (const BatchRequest& r : batch.requests) {
      if (registered) DCP_RETURN_IF_ERROR(context.FreeRequest(r.request_id));
      DCP_RETURN_IF_ERROR(context.AddRequest(r.request_id));
    }
    registered = true;
    for (size_t i = 0; i < batch.requests.size(); ++i) {
      const BatchRequest& r = batch.requests[i];
      if (r.seq_len == r.query_len) continue;
      const TensorView rows{batch.cached[i].data(), storage, {batch.cached_rows[i], width}, memory};
      DCP_RETURN_IF_ERROR(context.LoadCachedKv(r.request_id, r.seq_len - r.query_len, rows));
    }
    return absl::OkStatus();
  };
  std::vector<ForwardStats> stats;
  const auto body = [&](const Mark& mark) -> absl::Status {
    DCP_RETURN_IF_ERROR(context.Forward(batch.requests, inputs, outputs));
    DCP_RETURN_IF_ERROR(mark());
    stats.push_back(context.last_stats());
    return absl::OkStatus();
  };
  auto times = TimeSteps(env, 1, setup, body);
  if (!times.ok()) {
    result.status = times.status();
    return result;
  }
  result.times = *times;
  result.route = stats.back().route;

  // Phase medians of the timed iterations, slowest rank.
  const int iters = env.options.iters;
  std::vector<double> phases(size_t(iters) * kNumPhases);
  for (int it = 0; it < iters; ++it) {
    const ForwardStats& s = stats[stats.size() - iters + it];
    const double known =
        s.plan_s + s.cache_write_s + s.gather_s + s.up_projection_s + s.attention_s + s.combine_s;
    const double values[kNumPhases] = {s.plan_s,
                                       s.cache_write_s,
                                       s.gather_s,
                                       s.up_projection_s,
                                       s.attention_s,
                                       s.combine_s,
                                       std::max(0.0, s.total_s - known),
                                       s.all_gather_comm_s,
                                       s.combine_comm_s};
    std::copy(values, values + kNumPhases, phases.begin() + size_t(it) * kNumPhases);
  }
  result.status = MaxOverRanks(env, &phases);
  if (!result.status.ok()) return result;
  std::vector<double> column(iters);
  for (int p = 0; p < kNumPhases; ++p) {
    for (int it = 0; it < iters; ++it) column[it] = phases[size_t(it) * kNumPhases + p];
    result.phases_s[p] = Median(column);
  }

  auto out_host =
      DownloadFloats(*env.device, out.data(), out_dtype, size_t(t) * hl * m.v_head_dim);
  auto lse_host = DownloadFloats(*env.device, lse.data(), DType::kF32, size_t(t) * hl);
  result.status =
      AgreeOnStatus(*env.bootstrap, out_host.ok() ? lse_host.status() : out_host.status());
  if (!result.status.ok()) return result;
  result.out = std::move(out_host).value();
  result.lse = std::move(lse_host).value();
  return result;
}

struct Comparison {
  int64_t wrong = 0;
  double max_err_out = 0, max_err_lse = 0;
};

// The two routes' outputs on this rank. Tolerances follow the storage dtype: BF16 rounds the
// projected K/V (dense) and the absorbed queries (sparse) differently.
Comparison Compare(const RouteResult& a, const RouteResult& b, DType storage) {
  Comparison c;
  const bool bf16 = storage == DType::kBF16;
  double max_abs = 0;
  for (float v : b.out) max_abs = std::max(max_abs, double(std::fabs(v)));
  const double tol_out = (bf16 ? 3e-2 : 1e-3) * std::max(max_abs, 1e-6);
  for (size_t i = 0; i < a.out.size(); ++i) {
    const double err = std::fabs(double(a.out[i]) - double(b.out[i]));
    if (!(err <= tol_out)) ++c.wrong;  // NaN counts as wrong
    if (std::isfinite(err)) c.max_err_out = std::max(c.max_err_out, err);
  }
  for (size_t i = 0; i < a.lse.size(); ++i) {
    const double x = a.lse[i], y = b.lse[i];
    if (std::isinf(x) && std::isinf(y) && x < 0 && y < 0) continue;
    const double err = std::fabs(x - y);
    if (!(err <= (bf16 ? 5e-2 : 1e-3) * std::max(1.0, std::fabs(y)))) ++c.wrong;
    if (std::isfinite(err)) c.max_err_lse = std::max(c.max_err_lse, err);
  }
  return c;
}

std::string Microseconds(double seconds) { return FormatSig(seconds * 1e6); }

std::vector<Column> RouteColumns(const BenchEnv& env) {
  std::vector<Column> columns = env.MetaColumns();
  const std::vector<Column> main = {
      {"batch", "batch"},
      {"num_seqs", ""},
      {"query_len", ""},
      {"seq_len", ""},
      {"uniform", ""},
      {"has_context", ""},
      {"heads", "heads"},
      {"topk", ""},
      {"tokens", "tokens"},
      {"route_auto", "route"},
      {"auto_us", "auto_us"},
      {"auto_min_us", ""},
      {"mqa_us", "mqa_us"},
      {"mqa_min_us", ""},
      {"speedup_mqa_over_auto", "mqa/auto"},
      {"auto_attn_us", ""},
      {"mqa_attn_us", ""},
      {"auto_attn_tflops", "auto_attnTF/s"},
      {"mqa_attn_tflops", "mqa_attnTF/s"},
  };
  columns.insert(columns.end(), main.begin(), main.end());
  for (const char* route : {"auto", "mqa"}) {
    for (const char* phase : kPhaseNames) {
      columns.push_back({absl::StrCat(route, "_", phase, "_us"),
                         std::string(phase) == "other" ? absl::StrCat(route, "_other_us") : ""});
    }
  }
  columns.push_back({"max_err_out", ""});
  columns.push_back({"max_err_lse", ""});
  columns.push_back({"wrong", "#wrong"});
  columns.push_back({"status", "status"});
  return columns;
}

// One row of the crossover table per (heads, batch size) of the pure-prefill grid.
struct GridPoint {
  int seq_len = 0;
  double speedup = 0;  // t_mqa / t_dense
};

void AddCrossovers(const std::map<std::pair<int, int>, std::vector<GridPoint>>& grid,
                   ResultTable* table) {
  for (const auto& [key, points_in] : grid) {
    std::vector<GridPoint> points = points_in;
    std::sort(points.begin(), points.end(),
              [](const GridPoint& a, const GridPoint& b) { return a.seq_len < b.seq_len; });
    std::vector<std::string> mqa_wins;
    for (const GridPoint& p : points) {
      if (p.speedup < 1.0) mqa_wins.push_back(FormatInt(p.seq_len));
    }
    // The crossover: the smallest seq_len from which sparse MQA wins at every longer one.
    std::string crossover = "none";
    for (size_t i = points.size(); i-- > 0;) {
      if (points[i].speedup >= 1.0) break;
      crossover = FormatInt(points[i].seq_len);
    }
    double best = 0, worst = std::numeric_limits<double>::infinity();
    for (const GridPoint& p : points) {
      best = std::max(best, p.speedup);
      worst = std::min(worst, p.speedup);
    }
    table->AddRow({FormatInt(key.first), FormatInt(key.second), FormatInt(points.size()),
                   FormatFixed(worst, 2), FormatFixed(best, 2),
                   mqa_wins.empty() ? "none" : absl::StrJoin(mqa_wins, " "), crossover});
  }
}

// A whole layer on one CPU rank (2 threads) runs at 20-60 GFLOP/s (docs/cpu_kernels.md has
// the kernels at 85-140); the estimate takes the upper end, so a refused sweep is surely long.
constexpr double kCpuFlopsPerRank = 60e9;
constexpr double kMaxCpuSweepSeconds = 3600;

}  // namespace

absl::StatusOr<ModeResult> RunRoutes(BenchEnv& env) {
  const BenchOptions& o = env.options;
  std::vector<BatchShape> shapes;
  for (const std::string& spec : o.BatchList()) {
    DCP_ASSIGN_OR_RETURN(BatchShape shape, ParseShape(spec));
    shapes.push_back(std::move(shape));
  }
  for (int heads : o.heads) {
    ModelDims model = env.dims;
    model.num_heads = heads * env.world_size;
    DCP_RETURN_IF_ERROR(model.Validate());
  }
  const DType storage = env.device->storage_dtype();
  const ModelDims& d = env.dims;
  const double mha_flops_per_key = 2.0 * (d.qk_head_dim() + d.v_head_dim);
  const double mqa_flops_per_key = 2.0 * (d.latent_width() + d.kv_lora_rank);

  // On CPU ranks a sweep of long prefills at DeepSeek dims takes hours: estimated from its
  // FLOPs (sparse MQA, the more expensive route, twice per point when the planner picks dense)
  // at kCpuFlopsPerRank, it is refused past an hour unless --force.
  if (!env.on_gpu()) {
    double flops = 0;
    for (const BatchShape& shape : shapes) {
      if (shape.num_tokens > o.max_tokens) continue;
      double keys = 0, tokens = 0;
      for (const launch::RequestShape& r : shape.requests) {
        keys += double(r.query_len) * std::min<double>(r.seq_len, o.index_topk);
        tokens += r.query_len;
      }
      for (int heads : o.heads) {
        const double h = double(heads) * env.world_size;
        flops += 2 * (keys * h * mqa_flops_per_key +
                      tokens * h * 2.0 * d.kv_lora_rank * (d.qk_nope_head_dim + d.v_head_dim));
      }
    }
    const double seconds =
        flops * (o.warmup_iters + o.iters) / (kCpuFlopsPerRank * env.world_size);
    if (env.root()) {
      std::printf("# estimated sweep time on CPU ranks: %s (%zu batches x %zu head counts)\n",
                  FormatDuration(seconds).c_str(), shapes.size(), o.heads.size());
    }
    if (seconds > kMaxCpuSweepSeconds && !o.force) {
      return DCP_ERROR(InvalidArgument,
                       "this sweep is estimated at %s on CPU ranks (over an hour): choose "
                       "fewer --batches, --heads or iterations, or pass --force",
                       FormatDuration(seconds));
    }
  }

  ModeResult result;
  ResultTable table(RouteColumns(env));
  DCP_RETURN_IF_ERROR(AgreeOnStatus(*env.bootstrap, env.Stream(&table, "")));
  table.ExpectRows(int64_t(shapes.size() * o.heads.size()));
  std::map<std::pair<int, int>, std::vector<GridPoint>> grid;  // (heads, batch size)
  for (const BatchShape& shape : shapes) {
    const launch::RequestShape& first = shape.requests.front();
    bool uniform = true;
    for (const launch::RequestShape& r : shape.requests) uniform = uniform && r == first;
    std::vector<std::string> lead = env.MetaCells();
    const std::vector<std::string> shape_cells = {shape.spec,
                                                  FormatInt(shape.requests.size()),
                                                  FormatInt(shape.max_query_len),
                                                  FormatInt(shape.max_seq_len),
                                                  uniform ? "1" : "0",
                                                  shape.has_context ? "1" : "0"};
    lead.insert(lead.end(), shape_cells.begin(), shape_cells.end());
    const size_t tail = RouteColumns(env).size() - lead.size();

    if (shape.num_tokens > o.max_tokens) {
      for (int heads : o.heads) {
        std::vector<std::string> row = lead;
        row.resize(lead.size() + tail, "-");
        row[lead.size()] = FormatInt(heads);
        row[lead.size() + 1] = FormatInt(o.index_topk);
        row[lead.size() + 2] = FormatInt(shape.num_tokens);
        row.back() = absl::StrCat("skipped: ", shape.num_tokens, " tokens > --max_tokens");
        table.AddRow(std::move(row));
      }
      continue;
    }
    auto batch_or = MakeBatchData(env, shape);
    DCP_RETURN_IF_ERROR(AgreeOnStatus(*env.bootstrap, batch_or.status()));
    const BatchData& batch = *batch_or;

    for (int heads : o.heads) {
      auto head_or = MakeHeadData(env, shape, heads);
      DCP_RETURN_IF_ERROR(AgreeOnStatus(*env.bootstrap, head_or.status()));
      const HeadData& head = *head_or;
      RouteResult automatic = RunRoute(env, shape, batch, head, /*force_mqa=*/false);
      // When the planner already chose sparse MQA, forcing it runs the same thing again.
      RouteResult forced;
      const bool same = automatic.status.ok() && automatic.route == Route::kSparseMqa;
      if (!same) forced = RunRoute(env, shape, batch, head, /*force_mqa=*/true);
      const RouteResult& mqa = same ? automatic : forced;

      std::string status = "ok";
      Comparison comparison;
      if (!automatic.status.ok() || !mqa.status.ok()) {
        status =
            absl::StrCat("error: ", (automatic.status.ok() ? mqa : automatic).status.message());
        ++result.num_failed;
      } else if (!same && o.check) {
        comparison = Compare(automatic, mqa, storage);
      }
      DCP_ASSIGN_OR_RETURN(comparison.wrong, SumOverRanks(env, comparison.wrong));
      std::vector<double> errors = {comparison.max_err_out, comparison.max_err_lse};
      DCP_RETURN_IF_ERROR(MaxOverRanks(env, &errors));
      result.num_wrong += comparison.wrong;

      const bool ok = status == "ok";
      const bool dense = ok && automatic.route == Route::kDenseMha;
      const double nan = std::numeric_limits<double>::quiet_NaN();
      const double auto_s = ok ? automatic.times.total_s : nan;
      const double mqa_s = ok ? mqa.times.total_s : nan;
      const double speedup = dense ? mqa_s / auto_s : nan;
      const double dense_flops =
          heads * mha_flops_per_key * shape.SelectedKeys(std::numeric_limits<int>::max());
      const double sparse_flops = heads * mqa_flops_per_key * shape.SelectedKeys(o.index_topk);
      const double auto_attn = ok ? automatic.phases_s[kAttentionPhase] : nan;
      const double mqa_attn = ok ? mqa.phases_s[kAttentionPhase] : nan;

      std::vector<std::string> row = lead;
      const std::vector<std::string> cells = {
          FormatInt(heads),
          FormatInt(o.index_topk),
          FormatInt(shape.num_tokens),
          ok ? route_name(automatic.route) : "-",
          Microseconds(auto_s),
          Microseconds(ok ? automatic.times.min_total_s : nan),
          Microseconds(mqa_s),
          Microseconds(ok ? mqa.times.min_total_s : nan),
          FormatFixed(speedup, 2),
          Microseconds(auto_attn),
          Microseconds(mqa_attn),
          FormatSig((dense ? dense_flops : sparse_flops) / auto_attn * 1e-12),
          FormatSig(sparse_flops / mqa_attn * 1e-12)};
      row.insert(row.end(), cells.begin(), cells.end());
      for (const RouteResult* route : {&std::as_const(automatic), &mqa}) {
        for (int p = 0; p < kNumPhases; ++p) {
          row.push_back(Microseconds(ok ? route->phases_s[p] : nan));
        }
      }
      row.push_back(FormatSig(ok && !same ? errors[0] : nan));
      row.push_back(FormatSig(ok && !same ? errors[1] : nan));
      row.push_back(FormatInt(comparison.wrong));
      row.push_back(status);
      table.AddRow(std::move(row));

      if (dense && uniform && !shape.has_context) {
        grid[{heads, static_cast<int>(shape.requests.size())}].push_back(
            {shape.max_seq_len, speedup});
      }
    }
  }
  table.AddNote(
      "auto: the planner's route (dense_mha when every prefill has seq_len <= K and "
      "query_len > decode_threshold 1); mqa: sparse MQA forced. Times: whole "
      "DcpContext::Forward, median over iterations of the slowest rank.");
  table.AddNote(
      "mqa/auto > 1: the dense MHA route is faster. attnTF/s: attention phase only, "
      "useful FLOPs (dense: causal keys x (qk + v); sparse: selected keys x (2R + Dr)). "
      "other_us: validation, input staging and output scatter inside Forward.");
  result.tables.push_back({"", std::move(table)});

  ResultTable crossover({{"heads", "heads"},
                         {"num_seqs", "batch_size"},
                         {"points", "points"},
                         {"min_speedup", "min_mqa/mha"},
                         {"max_speedup", "max_mqa/mha"},
                         {"mqa_wins_at_seq_len", "mqa_wins_at"},
                         {"crossover_seq_len", "crossover"}});
  AddCrossovers(grid, &crossover);
  crossover.AddNote(
      "Pure prefills routed to dense MHA. crossover: the smallest seq_len from "
      "which sparse MQA is faster at every longer one ('none': MHA wins at the "
      "longest).");
  result.tables.push_back({"crossover", std::move(crossover)});
  return result;
}

}  // namespace dcp::bench
