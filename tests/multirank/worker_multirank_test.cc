// The core promise: W ranks give, for their heads, the single-rank float64 reference of the
// whole problem, on both routes, for I in {1, B}, both combines, and any number of chunks.
//
// Data comes from (seed, tensor, global index) so every rank builds its own shard (its heads,
// the cached rows it owns, found by scanning positions) and the reference builds the whole,
// with no scatter code shared with the runtime.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives/communicator.h"
#include "core/status.h"
#include "runtime/dcp.h"
#include "runtime/engine.h"
#include "runtime/scratch.h"
#include "tests/multirank/layer_test_harness.h"
#include "tests/multirank/multirank_test.h"
#include "tests/reference/fp8_ds_mla_reference.h"
#include "tests/reference/mla_reference.h"

namespace dcp::testing {
namespace {

enum Tensor { kQNope = 1, kQRope, kKvC, kKPe, kWUk, kWUv };

struct Scenario {
  std::vector<int> seq_lens, query_lens;
  int block_size = 16;
  int interleave = 1;
  int index_topk = 64;
  bool give_topk = false;  // else every causal key (needs seq_len <= K)
  bool force_mqa = false;
  bool validate_topk = true;
  CombineBackend combine = CombineBackend::kAllGatherReduceScatter;
  int64_t workspace_rows = 0;
  int max_num_seqs = 16;
  int max_model_len = 1024;
  std::string prefill_backend = "auto";
  int num_kv_blocks = 0;
  std::vector<int> order;  // request ids in batch order (default: 0..B-1)
  bool fp8 = false;  // attention.kv_cache_dtype fp8_ds_mla (needs R = 512, Dr = 64)
  bool bf16_out = false;  // the layer writes out as BF16 (host buffer of bf16 values)
};

// The whole problem, as the reference sees it, and each rank's share of it.
struct Problem {
  reference::MlaProblem whole;
  std::vector<int64_t> token_begin;  // [B+1] first token of each request (batch order)
  std::vector<int64_t> row_begin;    // [B+1] first kv row of each request
};

Problem BuildProblem(const Scenario& s, const Dims& d, uint64_t seed) {
  Problem p;
  auto& w = p.whole;
  w.num_heads = d.heads;
  w.kv_lora_rank = d.r;
  w.qk_nope_head_dim = d.dn;
  w.qk_rope_head_dim = d.dr;
  w.v_head_dim = d.dv;
  w.seq_lens = s.seq_lens;
  w.query_lens = s.query_lens;
  const size_t b = s.seq_lens.size();
  p.token_begin.assign(b + 1, 0);
  p.row_begin.assign(b + 1, 0);
  for (size_t i = 0; i < b; ++i) {
    p.token_begin[i + 1] = p.token_begin[i] + s.query_lens[i];
    p.row_begin[i + 1] = p.row_begin[i] + s.seq_lens[i];
  }
  const int64_t t = p.token_begin[b], n = p.row_begin[b];
  auto fill = [&](std::vector<double>& v, int tensor, int64_t count, float scale) {
    v.resize(count);
    for (int64_t i = 0; i < count; ++i) v[i] = Value(seed, tensor, i, scale);
  };
  fill(w.q_nope, kQNope, t * d.heads * d.dn, 1.0f);
  fill(w.q_rope, kQRope, t * d.heads * d.dr, 1.0f);
  fill(w.kv_c, kKvC, n * d.r, 1.0f);
  fill(w.k_pe, kKPe, n * d.dr, 1.0f);
  fill(w.w_uk, kWUk, int64_t(d.heads) * d.dn * d.r, 0.3f);
  fill(w.w_uv, kWUv, int64_t(d.heads) * d.r * d.dv, 0.3f);
  if (s.give_topk) {
    w.topk_width = s.index_topk;
    w.topk.assign(t * s.index_topk, -1);
    for (size_t i = 0; i < b; ++i) {
      for (int q = 0; q < s.query_lens[i]; ++q) {
        const int64_t token = p.token_begin[i] + q;
        const int position = s.seq_lens[i] - s.query_lens[i] + q;
        std::vector<int32_t> keys(position + 1);
        std::iota(keys.begin(), keys.end(), 0);
        std::mt19937_64 rng(Mix(seed + token));
        std::shuffle(keys.begin(), keys.end(), rng);
        if (int(keys.size()) > s.index_topk) {
          // Keep the newest token, as an indexer would, and a random rest.
          std::iter_swap(keys.begin(), std::find(keys.begin(), keys.end(), position));
          keys.resize(s.index_topk - (token % 3 == 0 ? 5 : 0));  // some rows padded with -1
        }
        std::shuffle(keys.begin(), keys.end(), rng);
        std::copy(keys.begin(), keys.end(), w.topk.begin() + token * s.index_topk);
      }
    }
  }
  return p;
}

struct RankRun {
  absl::Status status;
  std::vector<float> out, lse;  // this rank's heads (a bf16 out widened)
  ForwardStats stats;
  bool bf16_out = false;
};

// The options of a scenario on this rank.
DcpOptions ScenarioOptions(const Scenario& s, const Dims& d, int world, int rank) {
  DcpOptions options = RankOptions(d, world, rank);
  options.dcp.interleave = s.interleave;
  options.dcp.combine = s.combine;
  options.scheduler.block_size = s.block_size;
  options.scheduler.max_num_seqs = s.max_num_seqs;
  options.scheduler.max_model_len = s.max_model_len;
  options.scheduler.num_kv_blocks = s.num_kv_blocks;
  options.attention.index_topk = s.index_topk;
  options.attention.force_mqa = s.force_mqa;
  options.attention.validate_topk = s.validate_topk;
  options.attention.prefill_backend = s.prefill_backend;
  if (s.fp8) options.attention.kv_cache_dtype = KvCacheDType::kFp8DsMla;
  options.workspace_rows_override = s.workspace_rows;
  return options;
}

// One Forward of the scenario's batch through `ctx` (its requests registered and their context
// cached), inputs and outputs in `s.order`; the outputs come back in the problem's order.
RankRun ForwardScenario(DcpContext& ctx, const Scenario& s, const Dims& d, const Problem& p,
                        int world, int rank, bool damage_plan = false) {
  const int hl = d.heads / world, width = d.r + d.dr;
  const auto& w = p.whole;
  RankRun run;
  const size_t b = s.seq_lens.size();
  std::vector<int> order = s.order;
  if (order.empty()) {
    order.resize(b);
    std::iota(order.begin(), order.end(), 0);
  }
  auto row = [&](int64_t global_row, std::vector<float>& dst) {
    for (int c = 0; c < d.r; ++c) dst.push_back(float(w.kv_c[global_row * d.r + c]));
    for (int c = 0; c < d.dr; ++c) dst.push_back(float(w.k_pe[global_row * d.dr + c]));
  };
  // The batch in `order`; inputs follow it.
  std::vector<BatchRequest> batch;
  std::vector<float> q_nope, q_rope, kv_new;
  std::vector<int32_t> topk;
  for (int i : order) {
    batch.push_back({int64_t(i) + 100, s.seq_lens[i], s.query_lens[i]});
    for (int q = 0; q < s.query_lens[i]; ++q) {
      const int64_t token = p.token_begin[i] + q;
      for (int h = rank * hl; h < (rank + 1) * hl; ++h) {
        for (int c = 0; c < d.dn; ++c) q_nope.push_back(float(w.q_nope[(token * d.heads + h) * d.dn + c]));
        for (int c = 0; c < d.dr; ++c) q_rope.push_back(float(w.q_rope[(token * d.heads + h) * d.dr + c]));
      }
      row(p.row_begin[i] + s.seq_lens[i] - s.query_lens[i] + q, kv_new);
      if (s.give_topk) {
        topk.insert(topk.end(), w.topk.begin() + token * s.index_topk,
                    w.topk.begin() + (token + 1) * s.index_topk);
      }
    }
  }
  const int64_t t = int64_t(q_nope.size()) / (hl * d.dn);
  BatchInputs inputs{{q_nope.data(), DType::kF32, {t, hl, d.dn}},
                     {q_rope.data(), DType::kF32, {t, hl, d.dr}},
                     {kv_new.data(), DType::kF32, {t, width}},
                     {}};
  if (s.give_topk) inputs.topk = {topk.data(), DType::kI32, {t, s.index_topk}};
  std::vector<float> out(size_t(t) * hl * d.dv, std::nanf("")), lse(size_t(t) * hl, std::nanf(""));
  std::vector<uint16_t> out_bf16(s.bf16_out ? out.size() : 0, 0x7fc0);  // bf16 NaN
  BatchOutputs outputs{{out.data(), DType::kF32, {t, hl, d.dv}},
                       {lse.data(), DType::kF32, {t, hl}}};
  if (s.bf16_out) outputs.out = {out_bf16.data(), DType::kBF16, {t, hl, d.dv}};
  if (damage_plan && rank == 0) ctx.DamageNextPlanForTesting();
  run.status = ctx.Forward(batch, inputs, outputs);
  run.bf16_out = s.bf16_out;
  for (size_t i = 0; i < out_bf16.size(); ++i) {
    out[i] = std::bit_cast<float>(uint32_t{out_bf16[i]} << 16);
  }
  run.stats = ctx.last_stats();
  // Back to the reference's request order for comparison.
  std::vector<int64_t> caller_begin;
  int64_t offset = 0;
  for (int i : order) {
    caller_begin.push_back(offset);
    offset += s.query_lens[i];
  }
  run.out.resize(out.size());
  run.lse.resize(lse.size());
  for (size_t k = 0; k < order.size(); ++k) {
    const int i = order[k];
    for (int q = 0; q < s.query_lens[i]; ++q) {
      const int64_t from = caller_begin[k] + q, to = p.token_begin[i] + q;
      std::copy_n(out.begin() + from * hl * d.dv, hl * d.dv, run.out.begin() + to * hl * d.dv);
      std::copy_n(lse.begin() + from * hl, hl, run.lse.begin() + to * hl);
    }
  }
  return run;
}

// A DcpContext on this rank (the scenario's options, this rank's heads of the problem's
// weights) with every request of the scenario registered and its context cached as earlier
// steps would have left it.
struct RankContext {
  RankDevice device;
  std::unique_ptr<DcpContext> ctx;
};

absl::StatusOr<RankContext> MakeLoadedContext(MpiCommunicator& mpi, const Scenario& s,
                                              const Dims& d, const Problem& p) {
  const int world = mpi.world_size(), rank = mpi.rank();
  const int hl = d.heads / world, width = d.r + d.dr;
  const auto& w = p.whole;
  std::vector<float> w_uk(size_t(hl) * d.dn * d.r), w_uv(size_t(hl) * d.r * d.dv);
  for (size_t i = 0; i < w_uk.size(); ++i) w_uk[i] = float(w.w_uk[size_t(rank) * hl * d.dn * d.r + i]);
  for (size_t i = 0; i < w_uv.size(); ++i) w_uv[i] = float(w.w_uv[size_t(rank) * hl * d.r * d.dv + i]);
  LayerWeights weights{{w_uk.data(), DType::kF32, {hl, d.dn, d.r}},
                       {w_uv.data(), DType::kF32, {hl, d.r, d.dv}}};
  RankContext rc;
  DCP_ASSIGN_OR_RETURN(rc.device, MakeRankDevice(mpi));
  DCP_ASSIGN_OR_RETURN(rc.ctx, DcpContext::Create(ScenarioOptions(s, d, world, rank),
                                                  *rc.device.comm, *rc.device.device, weights));
  for (size_t i = 0; i < s.seq_lens.size(); ++i) {
    DCP_RETURN_IF_ERROR(rc.ctx->AddRequest(int64_t(i) + 100));
    // Cached rows this rank owns: scan the context's positions for runs dealt to this rank.
    const int context = std::max(0, s.seq_lens[i] - s.query_lens[i]);
    std::vector<float> rows;
    int64_t count = 0;
    for (int g = 0; g < context; ++g) {
      if ((g / s.interleave) % world != rank) continue;
      const int64_t j = p.row_begin[i] + g;
      for (int c = 0; c < d.r; ++c) rows.push_back(float(w.kv_c[j * d.r + c]));
      for (int c = 0; c < d.dr; ++c) rows.push_back(float(w.k_pe[j * d.dr + c]));
      ++count;
    }
    DCP_RETURN_IF_ERROR(rc.ctx->LoadCachedKv(
        int64_t(i) + 100, context, TensorView{rows.data(), DType::kF32, {count, width}}));
  }
  return rc;
}

// Runs the scenario on this rank; the context is loaded as earlier steps would have left it.
RankRun RunRank(MpiCommunicator& mpi, const Scenario& s, const Dims& d, const Problem& p,
                bool damage_plan = false) {
  absl::StatusOr<RankContext> rc = MakeLoadedContext(mpi, s, d, p);
  if (!rc.ok()) return RankRun{rc.status()};
  return ForwardScenario(*rc->ctx, s, d, p, mpi.world_size(), mpi.rank(), damage_plan);
}

// Every value of this rank's heads against the reference (layer_test_harness.h).
void ExpectMatchesReference(const RankRun& run, const Problem& p, const Dims& d, int world,
                            int rank) {
  ASSERT_TRUE(run.status.ok()) << run.status;
  ExpectRankOutputsMatch(run.out, run.lse, run.bf16_out, p.whole,
                         reference::ReferenceAttention(p.whole), d, world, rank);
}

// The problem the ranks solve with an fp8_ds_mla cache, as vLLM defines it: every key read from
// the cache is its dequantized row (the independent host model, tests/reference, applied to the
// values as the rank stores them: f32 on CPU ranks, bf16 on CUDA ranks); the new tokens of the
// prefills that take the dense route attend with their fresh values (kv_new), every other new
// token (decodes, and every token on the sparse route) is read back from the cache after the
// write, dequantized.
Problem DequantizedProblem(const Problem& p, const Scenario& s, const Dims& d, Route route) {
  Problem q = p;
  auto& w = q.whole;
  const bool bf16 = UseCuda();
  auto stored = [&](double x) {
    const float f = float(x);
    if (!bf16) return f;
    return std::bit_cast<float>(uint32_t{reference::Bf16Nearest(f)} << 16);
  };
  std::vector<float> kv_c(d.r), k_pe(d.dr);
  for (size_t i = 0; i < s.seq_lens.size(); ++i) {
    const int context = s.seq_lens[i] - s.query_lens[i];
    const bool fresh_new = route == Route::kDenseMha && s.query_lens[i] > 1;
    for (int g = 0; g < s.seq_lens[i]; ++g) {
      if (g >= context && fresh_new) continue;
      const int64_t j = p.row_begin[i] + g;
      for (int c = 0; c < d.r; ++c) kv_c[c] = stored(p.whole.kv_c[j * d.r + c]);
      for (int c = 0; c < d.dr; ++c) k_pe[c] = stored(p.whole.k_pe[j * d.dr + c]);
      const std::vector<uint8_t> row = reference::QuantizeFp8DsMlaRow(kv_c.data(), k_pe.data());
      const std::vector<double> values = reference::DequantizeFp8DsMlaRow(row.data());
      std::copy_n(values.begin(), d.r, w.kv_c.begin() + j * d.r);
      std::copy_n(values.begin() + d.r, d.dr, w.k_pe.begin() + j * d.dr);
    }
  }
  return q;
}

class WorkerTest : public LayerRankTest {};

// Random mixed batch: decodes, short prefills, prefills with context, seq_len 1, lengths not
// multiples of B or W*I; all seq_len <= K so the dense route applies.
Scenario RandomMixedBatch(std::mt19937_64& rng, int index_topk, int count) {
  Scenario s;
  s.index_topk = index_topk;
  for (int i = 0; i < count; ++i) {
    const int kind = rng() % 4;
    int seq = 1 + rng() % index_topk, query;
    if (kind == 0) query = 1;                                  // decode
    else if (kind == 1) query = seq;                           // prefill without context
    else query = 1 + rng() % seq;                              // extend (context + new)
    if (i == 0) seq = query = 1;                               // the lone one-token prefill
    s.seq_lens.push_back(seq);
    s.query_lens.push_back(query);
  }
  s.order.resize(count);
  std::iota(s.order.begin(), s.order.end(), 0);
  std::shuffle(s.order.begin(), s.order.end(), rng);  // decodes and prefills mixed
  return s;
}

TEST_F(WorkerTest, RandomMixedBatchesMatchTheReferenceOnBothRoutes) {
  const uint64_t seed = SharedSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const Dims dims = TestDims(UseCuda() ? 8 : 12);
  for (int interleave : {1, 16}) {
    for (CombineBackend combine :
         {CombineBackend::kAllGatherReduceScatter, CombineBackend::kAllToAll}) {
      for (bool force_mqa : {false, true}) {
        Scenario s = RandomMixedBatch(rng, 48, 6);
        s.interleave = interleave;
        s.combine = combine;
        s.force_mqa = force_mqa;
        s.give_topk = rng() % 2;
        SCOPED_TRACE(::testing::Message() << "I " << interleave << " combine "
                                          << combine_backend_name(combine) << " force_mqa "
                                          << force_mqa << " topk " << s.give_topk);
        const Problem p = BuildProblem(s, dims, seed + interleave);
        const RankRun run = RunRank(mpi_comm(), s, dims, p);
        ExpectMatchesReference(run, p, dims, world(), rank());
        const bool any_prefill = std::any_of(s.query_lens.begin(), s.query_lens.end(),
                                             [](int q) { return q > 1; });
        EXPECT_EQ(run.stats.route,
                  !force_mqa && any_prefill ? Route::kDenseMha : Route::kSparseMqa);
      }
    }
  }
}

// A bf16 out (LayerTensors::out_dtype): both routes, both combines, requests in and out of
// execution order (in place, or through the scatter back), context in several chunks (the
// dense route's merge, then the rounding) and none (the prefill kernel writes bf16 itself).
TEST_F(WorkerTest, Bf16OutputMatchesTheReferenceOnBothRoutes) {
  const uint64_t seed = SharedSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const Dims dims = TestDims(UseCuda() ? 8 : 12);
  for (CombineBackend combine :
       {CombineBackend::kAllGatherReduceScatter, CombineBackend::kAllToAll}) {
    for (bool force_mqa : {false, true}) {
      Scenario mixed = RandomMixedBatch(rng, 48, 6);
      Scenario fresh;  // prefills without context, decodes first: the caller's order is used
      fresh.seq_lens = {1, 40, 33};
      fresh.query_lens = {1, 40, 33};
      Scenario chunked;
      chunked.index_topk = 128;
      chunked.interleave = 4;
      chunked.seq_lens = {120, 1, 75};
      chunked.query_lens = {7, 1, 30};
      chunked.order = {2, 1, 0};
      chunked.workspace_rows = std::lcm<int64_t>(16, world() * 4);
      Scenario* const scenarios[] = {&mixed, &fresh, &chunked};
      for (int k = 0; k < 3; ++k) {
        Scenario* s = scenarios[k];
        s->combine = combine;
        s->force_mqa = force_mqa;
        s->give_topk = rng() % 2;
        s->bf16_out = true;
        SCOPED_TRACE(::testing::Message()
                     << "combine " << combine_backend_name(combine) << " force_mqa " << force_mqa
                     << " topk " << s->give_topk << " scenario " << k);
        const Problem p = BuildProblem(*s, dims, seed + 7);
        const RankRun run = RunRank(mpi_comm(), *s, dims, p);
        ExpectMatchesReference(run, p, dims, world(), rank());
        const bool any_prefill = std::any_of(s->query_lens.begin(), s->query_lens.end(),
                                             [](int q) { return q > 1; });
        EXPECT_EQ(run.stats.route,
                  !force_mqa && any_prefill ? Route::kDenseMha : Route::kSparseMqa);
        if (s == &chunked && !force_mqa) EXPECT_GE(run.stats.num_chunks, 2);
      }
    }
  }
}

// Fewer tokens than ranks with a top-k: the ranks whose share of the rows to check is empty
// begin no check but still join the verdict's agreement (a rank that skipped it hung the rest).
TEST_F(WorkerTest, FewerTokensThanRanksWithATopkMatch) {
  const uint64_t seed = SharedSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Dims dims = TestDims(UseCuda() ? 8 : 12);
  Scenario s;
  s.give_topk = true;
  s.seq_lens = {37};
  s.query_lens = {1};
  for (bool validate : {true, false}) {
    s.validate_topk = validate;
    const Problem p = BuildProblem(s, dims, seed);
    const RankRun run = RunRank(mpi_comm(), s, dims, p);
    ExpectMatchesReference(run, p, dims, world(), rank());
  }
}

// The top-k is checked where the step reads it: a dense step of prefills reads no row (they
// attend to every causal key), so a future key in one of its rows is no error and changes
// nothing; the same row on the sparse route (force_mqa) is an error on every rank.
TEST_F(WorkerTest, TopkIsCheckedWhereTheStepReadsIt) {
  const uint64_t seed = SharedSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Dims dims = TestDims(UseCuda() ? 8 : 12);
  Scenario s;
  s.give_topk = true;
  s.seq_lens = {40, 24};
  s.query_lens = {40, 10};
  const Problem p = BuildProblem(s, dims, seed);
  Problem bad = p;
  // Token 3 of request 0 (position 3; its row holds keys 0-3) selects position 9.
  bad.whole.topk[3 * s.index_topk] = 9;
  {
    const RankRun run = RunRank(mpi_comm(), s, dims, bad);
    ExpectMatchesReference(run, p, dims, world(), rank());
    EXPECT_EQ(run.stats.route, Route::kDenseMha);
  }
  {
    s.force_mqa = true;
    const RankRun run = RunRank(mpi_comm(), s, dims, bad);
    EXPECT_EQ(run.status.code(), absl::StatusCode::kInvalidArgument) << run.status;
    EXPECT_NE(std::string(run.status.message()).find("future key"), std::string::npos)
        << run.status;
  }
  // A dense step with decodes, listed first as vLLM does: only the decodes' rows are read and
  // checked (each rank its share of them), so the prefill's bad row is still no error ...
  s.force_mqa = false;
  s.seq_lens = {30, 17, 40, 24};
  s.query_lens = {1, 1, 40, 10};
  const Problem mixed = BuildProblem(s, dims, seed);
  Problem mixed_bad = mixed;
  mixed_bad.whole.topk[(2 + 3) * s.index_topk] = 9;  // token 3 of the first prefill
  {
    const RankRun run = RunRank(mpi_comm(), s, dims, mixed_bad);
    ExpectMatchesReference(run, mixed, dims, world(), rank());
    EXPECT_EQ(run.stats.route, Route::kDenseMha);
  }
  // ... and a decode's is, named by its token.
  mixed_bad = mixed;
  mixed_bad.whole.topk[1 * s.index_topk + 2] = 17;  // the second decode sits at position 16
  const RankRun run = RunRank(mpi_comm(), s, dims, mixed_bad);
  EXPECT_EQ(run.status.code(), absl::StatusCode::kInvalidArgument) << run.status;
  EXPECT_NE(std::string(run.status.message()).find("top-k index 17 of token 1 (column 2)"),
            std::string::npos)
      << run.status;
}

TEST_F(WorkerTest, PrefillLongerThanTopkTakesSparseMqaAndMatches) {
  const uint64_t seed = SharedSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Dims dims = TestDims(UseCuda() ? 8 : 12);
  for (CombineBackend combine :
       {CombineBackend::kAllGatherReduceScatter, CombineBackend::kAllToAll}) {
    Scenario s;
    s.index_topk = 32;
    s.give_topk = true;
    s.combine = combine;
    s.interleave = 4;
    s.seq_lens = {70, 1, 33, 200};
    s.query_lens = {20, 1, 33, 3};
    s.order = {3, 1, 0, 2};
    const Problem p = BuildProblem(s, dims, seed);
    const RankRun run = RunRank(mpi_comm(), s, dims, p);
    ExpectMatchesReference(run, p, dims, world(), rank());
    EXPECT_EQ(run.stats.route, Route::kSparseMqa);
  }
}

TEST_F(WorkerTest, ChunkCountDoesNotChangeTheAnswer) {
  const uint64_t seed = SharedSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Dims dims = TestDims(UseCuda() ? 8 : 12);
  const int unit = world() * 4;  // W*I with I = 4; lcm(B = 16, W*I) below
  const int64_t align = std::lcm<int64_t>(16, unit);
  Scenario s;
  s.index_topk = 128;
  s.interleave = 4;
  s.seq_lens = {120, 90, 1, 75, 128};
  s.query_lens = {7, 90, 1, 30, 1};  // contexts 113, 0, -, 45, (decode)
  // Many chunks: the smallest aligned workspace; two: about half the padded context; one: all.
  struct Want {
    int64_t rows;
    int min_chunks, max_chunks;
  };
  for (const Want& want : {Want{align, 3, 1000}, Want{align * ((180 / align) / 2 + 1), 2, 2},
                           Want{0, 1, 1}}) {
    s.workspace_rows = want.rows;
    const Problem p = BuildProblem(s, dims, seed);
    const RankRun run = RunRank(mpi_comm(), s, dims, p);
    ExpectMatchesReference(run, p, dims, world(), rank());
    EXPECT_EQ(run.stats.route, Route::kDenseMha);
    EXPECT_GE(run.stats.num_chunks, want.min_chunks) << "rows " << want.rows;
    EXPECT_LE(run.stats.num_chunks, want.max_chunks) << "rows " << want.rows;
  }
}

// The seed's test cases (vLLM test_sparse_backend_prefill_correctness), heads scaled down.
TEST_F(WorkerTest, SeedCasesRouteAsTheSeedSays) {
  const uint64_t seed = SharedSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Dims dims = TestDims(4 * (world() == 3 ? 3 : 4));
  struct Case {
    const char* name;
    std::vector<int> seq_lens, query_lens;
    bool force_mqa;
    Route route;
  };
  const Case cases[] = {
      {"short_dense_mha", {64, 128}, {64, 128}, false, Route::kDenseMha},
      {"short_context_dense_mha", {128, 160}, {64, 32}, false, Route::kDenseMha},
      {"short_dense_mha force_mqa", {64, 128}, {64, 128}, true, Route::kSparseMqa},
      {"short_context_dense_mha force_mqa", {128, 160}, {64, 32}, true, Route::kSparseMqa},
      {"one prefill of 513", {64, 513}, {64, 17}, false, Route::kSparseMqa},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Scenario s;
    s.index_topk = 512;
    s.block_size = 64;
    s.max_num_seqs = 2;
    s.max_model_len = 1024;
    s.seq_lens = c.seq_lens;
    s.query_lens = c.query_lens;
    s.force_mqa = c.force_mqa;
    s.give_topk = c.seq_lens[1] > 512;
    const Problem p = BuildProblem(s, dims, seed);
    const RankRun run = RunRank(mpi_comm(), s, dims, p);
    ExpectMatchesReference(run, p, dims, world(), rank());
    EXPECT_EQ(run.stats.route, c.route);
  }
}

// vLLM's two dense prefill cases at both models' head sizes (DeepSeek-V3.2: qk 192 / v 128;
// GLM-5: qk 256 / v 256), through every prefill backend of the device: the route is dense, the
// answer the reference's, and the backends agree with each other within bf16 tolerance.
TEST_F(WorkerTest, VllmPrefillCasesAtBothModelsOnEveryBackend) {
  const uint64_t seed = SharedSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  // Heads divisible by every world size the suite runs at (np 1-4).
  auto heads_for = [&](int heads) { return heads % world() == 0 ? heads : 4 * world(); };
  Dims deepseek = TestDims(heads_for(16)), glm5 = TestDims(heads_for(16));
  glm5.r = 512;
  glm5.dn = 192;
  glm5.dr = 64;
  glm5.dv = 256;
  if (!UseCuda()) {  // CPU ranks: the dense kernel takes any size; keep the float64 reference fast
    deepseek = glm5 = TestDims(heads_for(8));
    glm5.dn = 24;
    glm5.dv = 32;
  }
  const std::vector<std::string> backends =
      UseCuda() ? std::vector<std::string>{"native", "cudnn", "auto"}
                : std::vector<std::string>{"native", "auto"};
  struct Case {
    const char* name;
    std::vector<int> seq_lens, query_lens;
  };
  const Case cases[] = {{"short_dense_mha", {64, 128}, {64, 128}},
                        {"short_context_dense_mha", {128, 160}, {64, 32}}};
  for (const Dims& dims : {deepseek, glm5}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message() << c.name << " qk " << dims.dn + dims.dr << " v " << dims.dv);
      Scenario s;
      s.index_topk = 2048;
      s.block_size = 64;
      s.max_num_seqs = 2;
      s.max_model_len = 1024;
      s.seq_lens = c.seq_lens;
      s.query_lens = c.query_lens;
      const Problem p = BuildProblem(s, dims, seed);
      std::vector<float> first_out;
      for (const std::string& backend : backends) {
        SCOPED_TRACE(backend);
        s.prefill_backend = backend;
        const RankRun run = RunRank(mpi_comm(), s, dims, p);
        if (backend == "cudnn" && !run.status.ok() && !GpuRequiredHere()) {
          std::cout << "cudnn unavailable here: " << run.status << "\n";
          continue;
        }
        ExpectMatchesReference(run, p, dims, world(), rank());
        EXPECT_EQ(run.stats.route, Route::kDenseMha);
        if (first_out.empty()) {
          first_out = run.out;
          continue;
        }
        ASSERT_EQ(run.out.size(), first_out.size());
        double diff = 0, norm = 0;
        for (size_t i = 0; i < run.out.size(); ++i) {
          diff += double(run.out[i] - first_out[i]) * (run.out[i] - first_out[i]);
          norm += double(first_out[i]) * first_out[i];
        }
        EXPECT_LT(std::sqrt(diff / std::max(norm, 1e-30)), Tolerance());
      }
    }
  }
}

// prefill_backend cudnn where it cannot run (a CPU rank) is a clear error at start-up on every
// rank; auto there falls back to the rank's own dense kernel (the test above).
TEST_F(WorkerTest, CudnnBackendOnACpuRankIsAClearError) {
  if (UseCuda()) GTEST_SKIP() << "CPU ranks only";
  const Dims dims = TestDims(4 * world());
  Scenario s;
  s.seq_lens = {16};
  s.query_lens = {16};
  s.prefill_backend = "cudnn";
  const Problem p = BuildProblem(s, dims, SharedSeed());
  const RankRun run = RunRank(mpi_comm(), s, dims, p);
  ASSERT_FALSE(run.status.ok());
  EXPECT_EQ(run.status.code(), absl::StatusCode::kFailedPrecondition) << run.status;
  EXPECT_NE(run.status.message().find("'cudnn' was requested but is unavailable"),
            std::string::npos)
      << run.status;
}

// fp8_ds_mla KV cache: every world size, both routes, both combines, I in {1, 4}, one and
// several chunks, against the float64 reference on the dequantized cache (CPU ranks at the fp32
// tolerance: the dequantized values are exact floats). The dequantization changes keys by ~2^-4
// relative, so the reference on the original values would fail: the test can tell the two
// apart (checked below on the first case).
TEST_F(WorkerTest, Fp8DsMlaCacheMatchesTheReferenceOnDequantizedRows) {
  const uint64_t seed = SharedSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Dims dims = TestDims(4 * world());
  dims.r = 512;
  dims.dr = 64;
  const int unit = world() * 4;
  const int64_t align = std::lcm<int64_t>(16, unit);
  struct Case {
    const char* name;
    std::vector<int> seq_lens, query_lens;
    bool give_topk, force_mqa;
    int64_t workspace_rows;
    Route route;
  };
  const Case cases[] = {
      // Decodes, a prefill with context, a fresh prefill, a one-token prefill: dense route.
      {"dense, one chunk", {90, 40, 1, 77, 60}, {1, 40, 1, 12, 1}, false, false, 0,
       Route::kDenseMha},
      {"dense, several chunks", {90, 40, 1, 77, 60}, {1, 40, 1, 12, 1}, false, false, align,
       Route::kDenseMha},
      {"sparse (force_mqa), top-k", {90, 40, 1, 77, 60}, {1, 40, 1, 12, 1}, true, true, 0,
       Route::kSparseMqa},
      {"sparse (prefill past K)", {200, 70, 33}, {3, 20, 1}, true, false, 0, Route::kSparseMqa},
  };
  bool checked_distinguishes = false;
  // CUDA ranks: I = 1 only (the float64 reference at DeepSeek's dims dominates the time; the
  // interleave is runtime indexing that the CPU ranks cover).
  for (int interleave : UseCuda() ? std::vector<int>{1} : std::vector<int>{1, 4}) {
    for (CombineBackend combine :
         {CombineBackend::kAllGatherReduceScatter, CombineBackend::kAllToAll}) {
      for (const Case& c : cases) {
        SCOPED_TRACE(::testing::Message() << c.name << " I " << interleave << " combine "
                                          << combine_backend_name(combine));
        Scenario s;
        s.fp8 = true;
        s.index_topk = 128;
        s.interleave = interleave;
        s.combine = combine;
        s.seq_lens = c.seq_lens;
        s.query_lens = c.query_lens;
        s.give_topk = c.give_topk;
        s.force_mqa = c.force_mqa;
        s.workspace_rows = c.workspace_rows;
        if (c.route == Route::kSparseMqa && !c.force_mqa) s.index_topk = 32;
        const Problem p = BuildProblem(s, dims, seed + interleave);
        const RankRun run = RunRank(mpi_comm(), s, dims, p);
        ASSERT_TRUE(run.status.ok()) << run.status;
        EXPECT_EQ(run.stats.route, c.route);
        if (c.workspace_rows > 0) EXPECT_GE(run.stats.num_chunks, 2);
        const Problem dequantized = DequantizedProblem(p, s, dims, run.stats.route);
        ExpectMatchesReference(run, dequantized, dims, world(), rank());
        if (!checked_distinguishes && !UseCuda()) {
          // The original values' reference is far off: the cache really is quantized.
          checked_distinguishes = true;
          const reference::MlaResult original = reference::ReferenceAttention(p.whole);
          const reference::MlaResult want = reference::ReferenceAttention(dequantized.whole);
          double diff = 0;
          for (size_t i = 0; i < original.out.size(); ++i) {
            diff = std::max(diff, std::abs(original.out[i] - want.out[i]));
          }
          EXPECT_GT(diff, 100 * Tolerance() * ValueRms(p.whole, dims));
        }
      }
    }
  }
}

// An fp8_ds_mla cache whose rows are not 656 bytes apart, or a cache of the other format than
// attention.kv_cache_dtype: a clear InvalidArgument from the engine before anything runs.
TEST_F(WorkerTest, Fp8DsMlaCacheWithTheWrongRowStrideIsAClearError) {
  if (UseCuda()) GTEST_SKIP() << "CPU ranks only";
  Dims dims = TestDims(4 * world());
  dims.r = 512;
  dims.dr = 64;
  Scenario fp8;
  fp8.max_num_seqs = 2;
  fp8.max_model_len = 64;
  fp8.fp8 = true;
  const DcpOptions options = ScenarioOptions(fp8, dims, world(), rank());
  auto device = MakeCpuDevice(DType::kF32);
  auto engine = DcpEngine::Create(options, mpi_comm(), *device);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const int hl = dims.heads / world(), width = dims.r + dims.dr;
  const std::vector<BatchRequest> batch = {{100, 1, 1}};
  const std::vector<int32_t> table = {0};
  ASSERT_TRUE((*engine)->Plan(batch, StepTables{table.data(), 1, 4, 16}, 0).ok());
  std::vector<uint8_t> cache(4 * 16 * 1152 + 64);
  std::vector<float> q_nope(hl * dims.dn, 0.5f), q_rope(hl * dims.dr, 0.5f), kv_new(width, 1.f);
  std::vector<float> w_uk(size_t(hl) * dims.dn * dims.r, 0.1f), w_uv(size_t(hl) * dims.r * dims.dv, 0.1f);
  std::vector<float> out(hl * dims.dv), lse(hl);
  const LayerTensors tensors{q_nope.data(), q_rope.data(), kv_new.data(), nullptr, out.data(),
                             lse.data()};
  struct Bad {
    int64_t row_stride;
    KvCacheDType format;
    const char* message;
  };
  for (const Bad& bad : {Bad{576, KvCacheDType::kFp8DsMla, "row stride is 576 bytes; its rows are 656"},
                         Bad{1152, KvCacheDType::kFp8DsMla, "row stride is 1152 bytes"},
                         Bad{672, KvCacheDType::kFp8DsMla, "row stride is 672 bytes"},
                         Bad{576, KvCacheDType::kBF16, "holds bf16 rows, attention.kv_cache_dtype is fp8_ds_mla"}}) {
    SCOPED_TRACE(bad.message);
    const KvCacheView view{cache.data(), DType::kF32, 4, 16, bad.row_stride, bad.format};
    const absl::Status status =
        (*engine)->Run({w_uk.data(), w_uv.data()}, view, tensors);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(bad.message), std::string::npos) << status;
  }
  // The right stride runs.
  const KvCacheView good{cache.data(), DType::kF32, 4, 16, 656, KvCacheDType::kFp8DsMla};
  EXPECT_TRUE((*engine)->Run({w_uk.data(), w_uv.data()}, good, tensors).ok());
}

// Bad input: the same clear error on every rank, no hang.
TEST_F(WorkerTest, BadInputFailsOnEveryRankWithOneMessage) {
  const Dims dims = TestDims(UseCuda() ? 8 : 12);
  Scenario good;
  good.seq_lens = {20, 5};
  good.query_lens = {4, 5};
  good.max_num_seqs = 4;
  good.max_model_len = 64;
  good.index_topk = 32;
  struct Case {
    const char* name;
    Scenario scenario;
    const char* message;
    bool damage_plan = false;
  };
  std::vector<Case> cases;
  {
    Scenario s = good;
    s.seq_lens[0] = 65;
    cases.push_back({"seq_len > max_model_len", s, "exceeds scheduler.max_model_len"});
  }
  {
    Scenario s = good;
    s.seq_lens = {3, 3, 3, 3, 3};
    s.query_lens = {1, 1, 1, 1, 1};
    s.num_kv_blocks = 64;  // room in the cache: the batch itself is what is too large
    cases.push_back({"more requests than max_num_seqs", s, "more than scheduler.max_num_seqs"});
  }
  {
    Scenario s = good;
    s.query_lens[1] = 6;
    cases.push_back({"query_len > seq_len", s, "query_len"});
  }
  {
    // On the sparse route, which reads every row (a dense step of prefills reads none and does
    // not check it: TopkIsCheckedWhereTheStepReadsIt).
    Scenario s = good;
    s.give_topk = true;
    s.force_mqa = true;
    cases.push_back({"invalid top-k", s, "top-k"});
    // The last token's row: checked by the last rank (each rank checks its share of the rows),
    // named by its index in the caller's batch.
    cases.push_back(
        {"repeated top-k in the last token", s, "top-k index 4 of token 8 is repeated"});
  }
  cases.push_back({"plan checksum mismatch", good, "checksum", true});
  {
    Scenario s = good;
    s.num_kv_blocks = 1;
    s.block_size = 4;
    cases.push_back({"out of KV blocks", s, "out of KV blocks"});
  }
  for (Case& c : cases) {
    SCOPED_TRACE(c.name);
    Problem p = BuildProblem(c.scenario, dims, 7);
    if (std::string(c.name) == "invalid top-k") {
      p.whole.topk[3] = 19;  // token 0 sits at position 16: 19 is in its future
    }
    if (std::string(c.name) == "repeated top-k in the last token") {
      // Token 8 sits at position 4 and selects all of 0..4 in its first columns.
      p.whole.topk[8 * c.scenario.index_topk + 30] = 4;
    }
    const RankRun run = RunRank(mpi_comm(), c.scenario, dims, p, c.damage_plan);
    ASSERT_FALSE(run.status.ok());
    EXPECT_NE(run.status.message().find(c.message), std::string::npos) << run.status;
    // The same message on every rank.
    std::vector<int64_t> hashes(world());
    ASSERT_TRUE(comm()
                    .HostAllGather(int64_t(std::hash<std::string>{}(std::string(run.status.message()))),
                                   absl::MakeSpan(hashes))
                    .ok());
    for (int64_t h : hashes) EXPECT_EQ(h, hashes[0]) << run.status;
  }
  {
    // validate_topk off: the engine vouches for its indexer; the future index is then dropped
    // by TopkToSlots instead of rejected, and the batch runs.
    Scenario s = good;
    s.give_topk = true;
    s.force_mqa = true;
    s.validate_topk = false;
    Problem p = BuildProblem(s, dims, 7);
    p.whole.topk[3] = 19;
    const RankRun run = RunRank(mpi_comm(), s, dims, p);
    EXPECT_TRUE(run.status.ok()) << run.status;
  }
}

// ---- The engine layer (runtime/engine.h) over an engine-owned paged cache ----------------

// One step of an engine-driven run: the problem it must answer and the rows its requests have
// cached when it starts (the rest were written by earlier steps, or are its new tokens).
struct EngineStep {
  Scenario scenario;
  Problem problem;
};

struct EngineRun {
  absl::Status status;
  std::vector<RankRun> steps;
};

// Drives DcpEngine directly, as an engine would: the paged cache and the block tables are the
// test's (random block ids per rank; request 1 shares request 0's full prefix blocks when
// `shared_prefix` > 0, and the problem gives both the same prefix rows). The cache starts with
// the context of the first step; every step writes its new tokens; later steps may shorten a
// request (a rejected draft: rows past the new seq_len are stale and must not be read).
EngineRun RunEngineSteps(MpiCommunicator& mpi, const std::vector<EngineStep>& steps, const Dims& d,
                         int shared_prefix, uint64_t seed, bool damage_cache = false) {
  const int world = mpi.world_size(), rank = mpi.rank();
  const int hl = d.heads / world, width = d.r + d.dr;
  const Scenario& s0 = steps.front().scenario;
  EngineRun result;
  const DcpOptions options = ScenarioOptions(s0, d, world, rank);
  auto rank_device = MakeRankDevice(mpi);
  if (!rank_device.ok()) return {rank_device.status(), {}};
  Device* device = rank_device->device.get();
  Communicator* comm = rank_device->comm;
  auto made_engine = DcpEngine::Create(options, *comm, *device);
  if (!made_engine.ok()) return {made_engine.status(), {}};
  DcpEngine& engine = **made_engine;
  const DType storage = device->storage_dtype();
  const KvLayout layout{world, s0.interleave};

  // Block tables of this rank: enough blocks for each request's longest seq_len over the steps,
  // ids drawn from a random permutation; request 1 starts with request 0's full prefix blocks.
  const size_t b = s0.seq_lens.size();
  std::vector<int> longest(b, 0);
  for (const EngineStep& step : steps) {
    for (size_t i = 0; i < b; ++i) longest[i] = std::max(longest[i], step.scenario.seq_lens[i]);
  }
  const int block = s0.block_size;
  int64_t blocks_needed = 0, max_blocks = 1;
  for (size_t i = 0; i < b; ++i) {
    const int64_t n = (layout.local_length(longest[i], rank) + block - 1) / block;
    blocks_needed += n;
    max_blocks = std::max(max_blocks, n);
  }
  const int64_t num_blocks = blocks_needed + 3;  // some never used
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937_64 rng(Mix(seed + 7919 * rank));
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> tables(b * max_blocks, -1);
  size_t next = 0;
  const int64_t shared_blocks =
      shared_prefix > 0 ? layout.local_length(shared_prefix, rank) / block : 0;
  for (size_t i = 0; i < b; ++i) {
    const int64_t n = (layout.local_length(longest[i], rank) + block - 1) / block;
    for (int64_t k = 0; k < n; ++k) {
      tables[i * max_blocks + k] =
          i == 1 && k < shared_blocks ? tables[k] : ids[next++];
    }
  }
  StepTables step_tables{tables.data(), max_blocks, num_blocks, block};

  // The cache, filled with every request's cached context of the first step (this rank's rows).
  const Problem& p0 = steps.front().problem;
  std::vector<float> image(size_t(num_blocks) * block * width, 0.0f);
  for (size_t i = 0; i < b; ++i) {
    const int context = s0.seq_lens[i] - s0.query_lens[i];
    for (int g = 0; g < context; ++g) {
      if (layout.owner(g) != rank) continue;
      const int64_t j = layout.local_index(g);
      const int64_t slot = int64_t(tables[i * max_blocks + j / block]) * block + j % block;
      for (int c = 0; c < d.r; ++c) {
        image[slot * width + c] = float(p0.whole.kv_c[(p0.row_begin[i] + g) * d.r + c]);
      }
      for (int c = 0; c < d.dr; ++c) {
        image[slot * width + d.r + c] = float(p0.whole.k_pe[(p0.row_begin[i] + g) * d.dr + c]);
      }
    }
  }
  auto stage = [&](ScratchBuffer& buffer, const void* data, DType dtype,
                   std::vector<int64_t> shape, DType to) -> absl::StatusOr<void*> {
    return Stage(*device, buffer, TensorView{data, dtype, std::move(shape)}, to);
  };
  ScratchBuffer cache_buffer, w_uk_buffer, w_uv_buffer;
  auto cache_data = stage(cache_buffer, image.data(), DType::kF32,
                          {num_blocks * block, width}, storage);
  if (!cache_data.ok()) return {cache_data.status(), {}};
  KvCacheView cache{*cache_data, storage, num_blocks, block, width};
  if (damage_cache) cache.row_stride = width - 1;
  const auto& w = p0.whole;
  std::vector<float> w_uk(size_t(hl) * d.dn * d.r), w_uv(size_t(hl) * d.r * d.dv);
  for (size_t i = 0; i < w_uk.size(); ++i) w_uk[i] = float(w.w_uk[size_t(rank) * hl * d.dn * d.r + i]);
  for (size_t i = 0; i < w_uv.size(); ++i) w_uv[i] = float(w.w_uv[size_t(rank) * hl * d.r * d.dv + i]);
  auto uk = stage(w_uk_buffer, w_uk.data(), DType::kF32, {hl, d.dn, d.r}, storage);
  auto uv = stage(w_uv_buffer, w_uv.data(), DType::kF32, {hl, d.r, d.dv}, storage);
  if (!uk.ok() || !uv.ok()) return {uk.ok() ? uv.status() : uk.status(), {}};

  for (const EngineStep& step : steps) {
    const Scenario& s = step.scenario;
    const Problem& p = step.problem;
    std::vector<BatchRequest> batch;
    std::vector<float> q_nope, q_rope, kv_new;
    std::vector<int32_t> topk;
    for (size_t i = 0; i < b; ++i) {
      batch.push_back({int64_t(i) + 100, s.seq_lens[i], s.query_lens[i]});
      for (int q = 0; q < s.query_lens[i]; ++q) {
        const int64_t token = p.token_begin[i] + q;
        for (int h = rank * hl; h < (rank + 1) * hl; ++h) {
          for (int c = 0; c < d.dn; ++c) q_nope.push_back(float(p.whole.q_nope[(token * d.heads + h) * d.dn + c]));
          for (int c = 0; c < d.dr; ++c) q_rope.push_back(float(p.whole.q_rope[(token * d.heads + h) * d.dr + c]));
        }
        const int64_t r = p.row_begin[i] + s.seq_lens[i] - s.query_lens[i] + q;
        for (int c = 0; c < d.r; ++c) kv_new.push_back(float(p.whole.kv_c[r * d.r + c]));
        for (int c = 0; c < d.dr; ++c) kv_new.push_back(float(p.whole.k_pe[r * d.dr + c]));
        if (s.give_topk) {
          topk.insert(topk.end(), p.whole.topk.begin() + token * s.index_topk,
                      p.whole.topk.begin() + (token + 1) * s.index_topk);
        }
      }
    }
    const int64_t t = p.token_begin.back();
    absl::Status planned = engine.Plan(batch, step_tables, s.give_topk ? s.index_topk : 0);
    if (!planned.ok()) return {planned, result.steps};
    ScratchBuffer qn, qr, kn, tk, ob, lb;
    auto d_q_nope = stage(qn, q_nope.data(), DType::kF32, {t, hl, d.dn}, storage);
    auto d_q_rope = stage(qr, q_rope.data(), DType::kF32, {t, hl, d.dr}, storage);
    auto d_kv_new = stage(kn, kv_new.data(), DType::kF32, {t, width}, storage);
    absl::StatusOr<void*> d_topk = nullptr;
    if (s.give_topk) d_topk = stage(tk, topk.data(), DType::kI32, {t, s.index_topk}, DType::kI32);
    auto d_out = ob.Reserve(*device, size_t(t) * hl * d.dv * 4 + 4);
    auto d_lse = lb.Reserve(*device, size_t(t) * hl * 4 + 4);
    for (const absl::Status& st : {d_q_nope.status(), d_q_rope.status(), d_kv_new.status(),
                                   d_topk.status(), d_out.status(), d_lse.status()}) {
      if (!st.ok()) return {st, result.steps};
    }
    LayerTensors tensors{*d_q_nope, *d_q_rope, *d_kv_new, static_cast<const int32_t*>(*d_topk),
                         static_cast<float*>(*d_out), static_cast<float*>(*d_lse)};
    RankRun run;
    run.status = engine.Run({*uk, *uv}, cache, tensors);
    if (run.status.ok()) run.status = device->Synchronize();
    run.out.assign(size_t(t) * hl * d.dv, std::nanf(""));
    run.lse.assign(size_t(t) * hl, std::nanf(""));
    if (run.status.ok()) run.status = device->CopyToHost(run.out.data(), *d_out, run.out.size() * 4);
    if (run.status.ok()) run.status = device->CopyToHost(run.lse.data(), *d_lse, run.lse.size() * 4);
    run.stats.route = engine.plan().route;
    const bool ok = run.status.ok();
    result.steps.push_back(std::move(run));
    if (!ok) return {result.steps.back().status, result.steps};
  }
  return result;
}

// A second problem that continues `first` after a rollback: request `i` keeps only
// `keep` tokens (the rest were rejected drafts), then decodes one fresh token at position
// `keep`; every other request decodes one token after its whole sequence.
EngineStep RollbackStep(const EngineStep& first, const Dims& d, size_t rolled, int keep,
                        uint64_t seed) {
  EngineStep next;
  next.scenario = first.scenario;
  const Scenario& s1 = first.scenario;
  const size_t b = s1.seq_lens.size();
  for (size_t i = 0; i < b; ++i) {
    next.scenario.seq_lens[i] = (i == rolled ? keep : s1.seq_lens[i]) + 1;
    next.scenario.query_lens[i] = 1;
  }
  next.scenario.give_topk = false;
  next.problem = BuildProblem(next.scenario, d, seed);  // fresh queries and new rows
  // Same layer: the first step's weights. The kept rows are the first step's; the new token's
  // row is fresh.
  auto& w = next.problem.whole;
  w.w_uk = first.problem.whole.w_uk;
  w.w_uv = first.problem.whole.w_uv;
  for (size_t i = 0; i < b; ++i) {
    const int kept = next.scenario.seq_lens[i] - 1;
    for (int g = 0; g < kept; ++g) {
      const int64_t from = first.problem.row_begin[i] + g, to = next.problem.row_begin[i] + g;
      std::copy_n(first.problem.whole.kv_c.begin() + from * d.r, d.r, w.kv_c.begin() + to * d.r);
      std::copy_n(first.problem.whole.k_pe.begin() + from * d.dr, d.dr, w.k_pe.begin() + to * d.dr);
    }
  }
  return next;
}

// Plan/Run over an engine-owned paged cache: random, non-contiguous block ids, two requests
// sharing prefix blocks, both routes, both combines, several context chunks; then a second
// step after a rollback (one request shortened by rejected drafts) is still exact.
TEST_F(WorkerTest, EngineOverAnExternalPagedCacheMatchesTheReference) {
  const uint64_t seed = SharedSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Dims dims = TestDims(UseCuda() ? 8 : 4 * world());
  for (bool force_mqa : {false, true}) {
    for (CombineBackend combine :
         {CombineBackend::kAllGatherReduceScatter, CombineBackend::kAllToAll}) {
      SCOPED_TRACE(::testing::Message() << "force_mqa " << force_mqa << " combine "
                                        << combine_backend_name(combine));
      EngineStep first;
      Scenario& s = first.scenario;
      s.seq_lens = {100, 90, 7, 40};
      s.query_lens = {20, 26, 1, 1};  // two extends sharing a 64-token prefix, two decodes
      s.index_topk = 128;
      s.interleave = 2;
      s.combine = combine;
      s.force_mqa = force_mqa;
      s.workspace_rows = 32;  // several context chunks
      first.problem = BuildProblem(s, dims, seed + force_mqa);
      const int prefix = 64;
      auto& w = first.problem.whole;
      for (int g = 0; g < prefix; ++g) {  // request 1's first rows are request 0's
        std::copy_n(w.kv_c.begin() + (first.problem.row_begin[0] + g) * dims.r, dims.r,
                    w.kv_c.begin() + (first.problem.row_begin[1] + g) * dims.r);
        std::copy_n(w.k_pe.begin() + (first.problem.row_begin[0] + g) * dims.dr, dims.dr,
                    w.k_pe.begin() + (first.problem.row_begin[1] + g) * dims.dr);
      }
      const EngineStep second = RollbackStep(first, dims, /*rolled=*/0, /*keep=*/90, seed + 3);
      const EngineRun run = RunEngineSteps(mpi_comm(), {first, second}, dims, prefix, seed);
      ASSERT_TRUE(run.status.ok()) << run.status;
      ASSERT_EQ(run.steps.size(), 2u);
      {
        SCOPED_TRACE("first step");
        ExpectMatchesReference(run.steps[0], first.problem, dims, world(), rank());
        EXPECT_EQ(run.steps[0].stats.route, force_mqa ? Route::kSparseMqa : Route::kDenseMha);
      }
      SCOPED_TRACE("second step, after the rollback");
      ExpectMatchesReference(run.steps[1], second.problem, dims, world(), rank());
    }
  }
}

// Bad engine input: a block table entry outside the cache, a new token's slot written twice,
// a cache whose row stride is too small, Run before Plan: a clear error, on every rank.
TEST_F(WorkerTest, EngineRejectsBadTablesAndCaches) {
  const uint64_t seed = SharedSeed();
  const Dims dims = TestDims(UseCuda() ? 8 : 4 * world());
  EngineStep step;
  step.scenario.seq_lens = {40, 9};
  step.scenario.query_lens = {8, 1};
  step.problem = BuildProblem(step.scenario, dims, seed);
  const EngineRun bad_stride = RunEngineSteps(mpi_comm(), {step}, dims, 0, seed, true);
  EXPECT_EQ(bad_stride.status.code(), absl::StatusCode::kInvalidArgument) << bad_stride.status;
  EXPECT_NE(bad_stride.status.message().find("row stride"), std::string::npos)
      << bad_stride.status;

  // Tables checked in Plan, agreed: only rank 0's table is wrong, every rank fails with it.
  const DcpOptions options = ScenarioOptions(Scenario{}, dims, world(), rank());
  auto device = MakeCpuDevice(DType::kF32);  // the table checks are host code on every device
  auto engine = DcpEngine::Create(options, mpi_comm(), *device);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<BatchRequest> batch = {{1, 40, 8}, {2, 9, 1}};
  std::vector<int32_t> tables = {0, 1, 2, 3, 4, 5, 6, 7};  // rows of 4 blocks
  if (rank() == 0) tables[0] = 99;                           // outside the cache's 8 blocks
  absl::Status planned = (*engine)->Plan(batch, {tables.data(), 4, 8, 16}, 0);
  EXPECT_EQ(planned.code(), absl::StatusCode::kInvalidArgument) << planned;
  EXPECT_NE(planned.message().find("outside the cache's 8 blocks"), std::string::npos) << planned;
  const absl::Status run_unplanned = (*engine)->Run({nullptr, nullptr}, {}, {});
  EXPECT_NE(run_unplanned.message().find("before a successful Plan"), std::string::npos)
      << run_unplanned;
  // Two new tokens written to one slot (both requests' tables name the same block).
  tables = {0, 1, 2, 3, 0, 5, 6, 7};
  planned = (*engine)->Plan({{1, 8, 8}, {2, 8, 8}}, {tables.data(), 4, 8, 16}, 0);
  EXPECT_EQ(planned.code(), absl::StatusCode::kInvalidArgument) << planned;
  EXPECT_NE(planned.message().find("block tables overlap"), std::string::npos) << planned;
  // A new token written over a row the step reads as context: request 2's table starts with
  // request 1's first block, so its new token (position 8) lands in request 1's cached rows on
  // the rank that owns position 8 (an engine review's find: the write went through, and both
  // requests' answers were wrong). Every rank fails with it.
  tables = {0, 1, 2, 3, 0, 5, 6, 7};
  planned = (*engine)->Plan(batch, {tables.data(), 4, 8, 16}, 0);
  EXPECT_EQ(planned.code(), absl::StatusCode::kInvalidArgument) << planned;
  EXPECT_NE(planned.message().find("request id 1 reads as cached context"), std::string::npos)
      << planned;
  // The same among block ids past the dense marks' range (looked up by binary search).
  const int32_t big = (1 << 22) + 5;
  tables = {big, big + 1, big + 2, big + 3, big, big + 5, big + 6, big + 7};
  planned = (*engine)->Plan(batch, {tables.data(), 4, 1 << 23, 16}, 0);
  EXPECT_NE(planned.message().find("request id 1 reads as cached context"), std::string::npos)
      << planned;
  // The same tables without the new token there (request 2 decoding into a block of its own
  // after a shared, whole prefix block of 16 rows at W = 1) plan.
  tables = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_TRUE((*engine)->Plan(batch, {tables.data(), 4, 8, 16}, 0).ok());
  // An empty step needs no tables.
  EXPECT_TRUE((*engine)->Plan({}, StepTables{}, 0).ok());
}

// The top-k width is part of the plan: ranks that disagree on it fail on every rank (they
// combined partials over different key sets), and a prefill longer than a narrower width than
// index_topk takes the sparse route (its rows cannot hold every causal key; the dense route
// attended to all of them).
TEST_F(WorkerTest, EngineTopkWidthIsPlannedAndAgreed) {
  const Dims dims = TestDims(UseCuda() ? 8 : 4 * world());
  const DcpOptions options = ScenarioOptions(Scenario{}, dims, world(), rank());  // K 64
  auto device = MakeCpuDevice(DType::kF32);
  auto engine = DcpEngine::Create(options, mpi_comm(), *device);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<BatchRequest> batch = {{1, 40, 40}, {2, 9, 1}};  // a prefill of 40, a decode
  const std::vector<int32_t> tables = {0, 1, 2, 3, 4, 5, 6, 7};
  const StepTables step{tables.data(), 4, 8, 16};
  ASSERT_TRUE((*engine)->Plan(batch, step, 64).ok());
  EXPECT_EQ((*engine)->plan().route,
            (*engine)->dense_mha_available() ? Route::kDenseMha : Route::kSparseMqa);
  ASSERT_TRUE((*engine)->Plan(batch, step, 32).ok());
  EXPECT_EQ((*engine)->plan().route, Route::kSparseMqa) << "rows of 32 for a prefill of 40";
  EXPECT_EQ((*engine)->plan().topk_width, 32);
  if (world() > 1) {
    const absl::Status planned = (*engine)->Plan(batch, step, rank() == 0 ? 24 : 16);
    EXPECT_FALSE(planned.ok());
    EXPECT_NE(planned.message().find("differs"), std::string::npos) << planned;
  }
}

// Ranks created with different options fail their first Plan on every rank, naming the cause:
// different interleaves gave each rank another token ownership, and the plans (which carry no
// layout) still compared equal, so the layer combined partials over the wrong keys.
TEST_F(WorkerTest, EngineRanksWithDifferentOptionsFailThePlan) {
  if (world() == 1) GTEST_SKIP() << "needs two ranks";
  const Dims dims = TestDims(UseCuda() ? 8 : 4 * world());
  const std::vector<BatchRequest> batch = {{1, 40, 40}, {2, 9, 1}};
  const std::vector<int32_t> tables = {0, 1, 2, 3, 4, 5, 6, 7};
  const StepTables step{tables.data(), 4, 8, 16};
  auto device = MakeCpuDevice(DType::kF32);
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(::testing::Message() << "variant " << variant);
    DcpOptions options = ScenarioOptions(Scenario{}, dims, world(), rank());
    if (rank() == world() - 1) {
      if (variant == 0) options.dcp.interleave = options.dcp.interleave == 1 ? 2 : 1;
      if (variant == 1) {
        options.dcp.combine = options.dcp.combine == CombineBackend::kAllToAll
                                  ? CombineBackend::kAllGatherReduceScatter
                                  : CombineBackend::kAllToAll;
      }
      if (variant == 2) options.model.softmax_scale = 0.125f;
    }
    auto engine = DcpEngine::Create(options, mpi_comm(), *device);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const absl::Status planned = (*engine)->Plan(batch, step, 64);
    EXPECT_EQ(planned.code(), absl::StatusCode::kFailedPrecondition) << planned;
    EXPECT_NE(planned.message().find("options that differ from rank 0's"), std::string::npos)
        << planned;
  }
}

// Run refuses outputs that overlap what it reads or writes, before it writes anything (out over
// kv_new fed the decodes' outputs to the prefill's attention).
TEST_F(WorkerTest, EngineRunRefusesAliasedOutputs) {
  const Dims dims = TestDims(UseCuda() ? 8 : 4 * world());
  const DcpOptions options = ScenarioOptions(Scenario{}, dims, world(), rank());
  auto device = MakeCpuDevice(DType::kF32);
  auto engine = DcpEngine::Create(options, mpi_comm(), *device);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<BatchRequest> batch = {{1, 9, 1}, {2, 20, 4}};
  const std::vector<int32_t> tables = {0, 1, 2, 3, 4, 5, 6, 7};
  ASSERT_TRUE((*engine)->Plan(batch, {tables.data(), 4, 8, 16}, 0).ok());
  const int64_t t = 5, hl = (*engine)->heads(), width = dims.r + dims.dr;
  const float sentinel = 12345.f;
  std::vector<float> cache(size_t(8) * 16 * width, sentinel), q_nope(size_t(t) * hl * dims.dn),
      q_rope(size_t(t) * hl * dims.dr), kv_new(size_t(t) * width), out(size_t(t) * hl * dims.dv),
      lse(size_t(t) * hl), weights(size_t(hl) * dims.r * std::max(dims.dn, dims.dv));
  const KvCacheView view{cache.data(), DType::kF32, 8, 16, width, KvCacheDType::kBF16};
  auto run = [&](void* out_data, float* lse_data) {
    return (*engine)->Run(
        {weights.data(), weights.data()}, view,
        {q_nope.data(), q_rope.data(), kv_new.data(), nullptr, out_data, lse_data});
  };
  absl::Status status = run(kv_new.data(), lse.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("out overlaps"), std::string::npos) << status;
  status = run(out.data(), out.data() + 1);
  EXPECT_NE(status.message().find("out overlaps lse"), std::string::npos) << status;
  status = run(cache.data() + 7, lse.data());
  EXPECT_NE(status.message().find("out overlaps"), std::string::npos) << status;
  status = run(out.data(), q_rope.data());
  EXPECT_NE(status.message().find("lse overlaps q_rope"), std::string::npos) << status;
  // The weights are read too: an out over w_uv (this test passes one buffer as both).
  status = run(weights.data() + 3, lse.data());
  EXPECT_NE(status.message().find("out overlaps w_uk"), std::string::npos) << status;
  for (float v : cache) ASSERT_EQ(v, sentinel) << "the cache was written";
}

// A step whose collectives would carry more elements a rank than one MPI call takes (int) is
// refused by Plan on every rank, naming the count, before any Run writes a cache (it failed in
// the q' all-gather, after the cache write). Nothing is allocated for it: Plan refuses first.
TEST_F(WorkerTest, EnginePlanRefusesCollectivesPastTheCommunicatorsCount) {
  if (world() == 1) GTEST_SKIP() << "a group of one runs no collective";
  const Dims dims = TestDims(4 * world());
  DcpOptions options = ScenarioOptions(Scenario{}, dims, world(), rank());
  options.attention.prefill_backend = "none";  // no workspace for these lengths
  const int64_t hl = options.model.num_heads / world(), width = dims.r + dims.dr;
  // One prefill whose q' all-gather needs tokens x H/W x (R + Dr) = just past 2^31 - 1.
  const int query = int(int64_t{INT32_MAX} / (hl * width) + 1);
  options.scheduler.max_model_len = query;
  auto device = MakeCpuDevice(DType::kF32);
  auto engine = DcpEngine::Create(options, mpi_comm(), *device);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const int B = options.scheduler.block_size;
  const int64_t blocks = (int64_t(query) + B - 1) / B;  // enough for any rank's share
  std::vector<int32_t> tables(static_cast<size_t>(blocks), 0);
  std::iota(tables.begin(), tables.end(), 0);
  const std::vector<BatchRequest> batch = {{1, query, query}};
  const absl::Status refused = (*engine)->Plan(batch, {tables.data(), blocks, blocks, B}, 64);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(
      refused.message().find(absl::StrCat("a step of ", query, " tokens needs collectives of ",
                                          int64_t(query) * hl * width, " elements a rank")),
      std::string::npos)
      << refused;
  EXPECT_NE(refused.message().find("more than one mpi call carries (2147483647)"),
            std::string::npos)
      << refused;
  // One token fewer fits (and is not planned here: its buffers would take gigabytes).
  EXPECT_LE(uint64_t(query - 1) * hl * width, mpi_comm().max_count());

  // The same for the dense route's chunk all-gather, at Create: a workspace whose chunk gives a
  // rank more rows than one call carries (fp8 rows move as 328 16-bit units, more than R + Dr
  // here) is refused before anything is allocated.
  DcpOptions wide = ScenarioOptions(Scenario{}, dims, world(), rank());
  wide.workspace_rows_override = int64_t(world()) * (int64_t{INT32_MAX} / 328 + 1);
  const auto refused_create = DcpEngine::Create(wide, mpi_comm(), *device);
  ASSERT_FALSE(refused_create.ok());
  EXPECT_NE(refused_create.status().message().find("needs all-gathers of"), std::string::npos)
      << refused_create.status();
}

// Speculative decoding through the convenience layer: a step of extends (drafts being verified)
// and decodes, then TruncateRequest drops one request's rejected drafts (the blocks past the
// kept tokens go back to the pool, and a new request's rows land in them), and the next step's
// decodes equal the reference over the kept rows. Keeping more than is cached, or truncating an
// unknown request: InvalidArgument on every rank, nothing changed.
TEST_F(WorkerTest, TruncateRequestRollsBackRejectedDrafts) {
  const uint64_t seed = SharedSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Dims dims = TestDims(UseCuda() ? 8 : 4 * world());
  for (bool force_mqa : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "force_mqa " << force_mqa);
    EngineStep first;
    Scenario& s = first.scenario;
    s.seq_lens = {100, 90, 7, 40};
    s.query_lens = {20, 26, 1, 1};
    s.index_topk = 128;
    s.interleave = 2;
    s.force_mqa = force_mqa;
    s.workspace_rows = 32;  // several context chunks
    first.problem = BuildProblem(s, dims, seed + force_mqa);
    absl::StatusOr<RankContext> rc = MakeLoadedContext(mpi_comm(), s, dims, first.problem);
    ASSERT_TRUE(rc.ok()) << rc.status();
    DcpContext& ctx = *rc->ctx;
    {
      SCOPED_TRACE("first step");
      ExpectMatchesReference(ForwardScenario(ctx, s, dims, first.problem, world(), rank()),
                             first.problem, dims, world(), rank());
    }
    const absl::Status too_many = ctx.TruncateRequest(101, 91);
    EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument) << too_many;
    EXPECT_NE(too_many.message().find("cannot keep 91 tokens, it has 90 cached"),
              std::string::npos)
        << too_many;
    const absl::Status unknown = ctx.TruncateRequest(7, 1);
    EXPECT_NE(unknown.message().find("request 7 is not registered"), std::string::npos)
        << unknown;

    // Request 100 keeps 50 of its 100 tokens; request 300 takes the blocks it gave back and
    // fills them with rows of its own (request 100's kept rows must survive that).
    const int keep = 50;
    ASSERT_TRUE(ctx.TruncateRequest(100, keep).ok());
    ASSERT_TRUE(ctx.AddRequest(300).ok());
    const int other = 60, width = dims.r + dims.dr;
    std::vector<float> rows;
    int64_t count = 0;
    for (int g = 0; g < other; ++g) {
      if ((g / s.interleave) % world() != rank()) continue;
      for (int c = 0; c < width; ++c) rows.push_back(Value(seed + 17, kKvC, g * width + c, 1.0f));
      ++count;
    }
    ASSERT_TRUE(
        ctx.LoadCachedKv(300, other, TensorView{rows.data(), DType::kF32, {count, width}}).ok());

    const EngineStep second = RollbackStep(first, dims, /*rolled=*/0, keep, seed + 3);
    SCOPED_TRACE("second step, after the rollback");
    ExpectMatchesReference(ForwardScenario(ctx, second.scenario, dims, second.problem, world(),
                                           rank()),
                           second.problem, dims, world(), rank());
  }
}

// Failures give back what they took (a review's finds): a step refused for want of blocks
// gives back the blocks it grew for the requests before the one that did not fit (the next
// step that fits then runs), and a LoadCachedKv that fails after dropping the old rows leaves
// the request with nothing cached (it kept its old length while its blocks went to others).
TEST_F(WorkerTest, FailuresGiveBackTheirBlocks) {
  const uint64_t seed = SharedSeed();
  const Dims dims = TestDims(UseCuda() ? 8 : 4 * world());
  const int per_block = 16 * world();  // tokens that fill one block on every rank
  Scenario s;
  s.seq_lens = {2 * per_block, 3 * per_block};  // two prefills: 2 and 3 blocks on each rank
  s.query_lens = s.seq_lens;
  s.order = {1, 0};  // the 3-block request grows first, then the 2-block one does not fit
  s.index_topk = 4 * per_block;
  s.num_kv_blocks = 4;
  const Problem p = BuildProblem(s, dims, seed);
  absl::StatusOr<RankContext> rc = MakeLoadedContext(mpi_comm(), s, dims, p);
  ASSERT_TRUE(rc.ok()) << rc.status();
  DcpContext& ctx = *rc->ctx;
  const RankRun both = ForwardScenario(ctx, s, dims, p, world(), rank());
  EXPECT_EQ(both.status.code(), absl::StatusCode::kResourceExhausted) << both.status;
  // Request 100 alone (2 blocks) fits only if request 101 gave its 3 back.
  Scenario alone;
  alone.seq_lens = alone.query_lens = {2 * per_block};
  alone.index_topk = s.index_topk;
  alone.num_kv_blocks = s.num_kv_blocks;
  Problem p_alone = BuildProblem(alone, dims, seed + 1);
  p_alone.whole.w_uk = p.whole.w_uk;  // the context's layer
  p_alone.whole.w_uv = p.whole.w_uv;
  const RankRun run = ForwardScenario(ctx, alone, dims, p_alone, world(), rank());
  ASSERT_TRUE(run.status.ok()) << run.status;
  ExpectMatchesReference(run, p_alone, dims, world(), rank());

  // Two blocks left: request 101 caches one block, then a reload of three fails.
  const int width = dims.r + dims.dr;
  auto load = [&](int tokens) {
    const int64_t rows = tokens / world();
    std::vector<float> values(size_t(rows) * width, 0.5f);
    return ctx.LoadCachedKv(101, tokens, TensorView{values.data(), DType::kF32, {rows, width}});
  };
  ASSERT_TRUE(load(per_block).ok());
  const absl::Status reload = load(3 * per_block);
  EXPECT_EQ(reload.code(), absl::StatusCode::kResourceExhausted) << reload;
  const absl::Status kept = ctx.TruncateRequest(101, 1);
  EXPECT_NE(kept.message().find("it has 0 cached"), std::string::npos) << kept;
  EXPECT_TRUE(load(2 * per_block).ok()) << "the blocks the failed reload gave back";
}

// Prefix caching through the convenience layer (ForkRequest): only whole blocks on every rank
// are shared, never more than is cached, and a truncation that would leave a shared block
// partly kept is refused while another request holds that block (and allowed once it is the
// last holder). The values of shared prefixes are checked by engine_workload_multirank_test.
TEST_F(WorkerTest, ForkRequestSharesWholeBlocksOnly) {
  const uint64_t seed = SharedSeed();
  const Dims dims = TestDims(UseCuda() ? 8 : 4 * world());
  Scenario s;
  s.seq_lens = {100};
  s.query_lens = {20};
  s.index_topk = 128;
  const Problem p = BuildProblem(s, dims, seed);
  absl::StatusOr<RankContext> rc = MakeLoadedContext(mpi_comm(), s, dims, p);
  ASSERT_TRUE(rc.ok()) << rc.status();
  DcpContext& ctx = *rc->ctx;
  ExpectMatchesReference(ForwardScenario(ctx, s, dims, p, world(), rank()), p, dims, world(),
                         rank());  // request 100 now holds 100 tokens
  const int unit = s.block_size * world(), prefix = unit * (100 / unit);
  absl::Status st = ctx.ForkRequest(200, 100, unit + 1);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("must be a multiple of block_size x world size"), std::string::npos)
      << st;
  st = ctx.ForkRequest(200, 100, prefix + unit);
  EXPECT_NE(st.message().find("cannot share"), std::string::npos) << st;
  ASSERT_TRUE(ctx.ForkRequest(200, 100, prefix).ok());
  st = ctx.ForkRequest(200, 100, prefix);
  EXPECT_NE(st.message().find("already registered"), std::string::npos) << st;
  for (int64_t id : {200, 100}) {
    st = ctx.TruncateRequest(id, prefix - 1);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("is shared with another request"), std::string::npos) << st;
  }
  EXPECT_TRUE(ctx.TruncateRequest(100, prefix - unit).ok());  // whole blocks: allowed
  ASSERT_TRUE(ctx.FreeRequest(100).ok());
  EXPECT_TRUE(ctx.TruncateRequest(200, prefix - 1).ok());  // the last holder of its blocks
}

// LoadCachedKv into a forked request replaces its rows in blocks of its own: the request it
// shared a prefix with still reads its own rows (its next decode equals the reference).
TEST_F(WorkerTest, LoadIntoAForkedRequestLeavesTheSharedPrefixAlone) {
  const uint64_t seed = SharedSeed();
  const Dims dims = TestDims(UseCuda() ? 8 : 4 * world());
  EngineStep first;
  first.scenario.seq_lens = {100};
  first.scenario.query_lens = {20};
  first.scenario.index_topk = 128;
  first.problem = BuildProblem(first.scenario, dims, seed);
  absl::StatusOr<RankContext> rc = MakeLoadedContext(mpi_comm(), first.scenario, dims,
                                                     first.problem);
  ASSERT_TRUE(rc.ok()) << rc.status();
  DcpContext& ctx = *rc->ctx;
  ExpectMatchesReference(ForwardScenario(ctx, first.scenario, dims, first.problem, world(), rank()),
                         first.problem, dims, world(), rank());
  const int unit = first.scenario.block_size * world(), prefix = unit * (100 / unit);
  ASSERT_TRUE(ctx.ForkRequest(300, 100, prefix).ok());
  const int width = dims.r + dims.dr;
  std::vector<float> rows;
  int64_t count = 0;
  for (int g = 0; g < prefix; ++g) {
    if ((g / first.scenario.interleave) % world() != rank()) continue;
    for (int c = 0; c < width; ++c) rows.push_back(Value(seed + 29, kKvC, g * width + c, 4.0f));
    ++count;
  }
  ASSERT_TRUE(
      ctx.LoadCachedKv(300, prefix, TensorView{rows.data(), DType::kF32, {count, width}}).ok());
  // Request 100 decodes one more token over its own 100 rows.
  const EngineStep next = RollbackStep(first, dims, /*rolled=*/0, /*keep=*/100, seed + 5);
  ExpectMatchesReference(ForwardScenario(ctx, next.scenario, dims, next.problem, world(), rank()),
                         next.problem, dims, world(), rank());
}

}  // namespace
}  // namespace dcp::testing
