#include "runtime/planner.h"

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/device.h"
#include "runtime/plan.h"

namespace dcp {
namespace {

PlannerConfig MakeConfig(int world, int interleave) {
  PlannerConfig config;
  config.scheduler.block_size = 16;
  config.scheduler.max_num_seqs = 8;
  config.scheduler.max_model_len = 4096;
  config.attention.index_topk = 512;
  config.layout = KvLayout{world, interleave};
  config.dense_mha_available = true;
  config.workspace = ComputeWorkspaceSize({16, 8, 4096, 512, world, interleave, 576, 0}).value();
  return config;
}

TEST(PlannerTest, RoutingRuleIsTheSeeds) {
  AttentionConfig attention;
  attention.index_topk = 512;
  EXPECT_EQ(ChooseRoute(attention, true, 2, 512), Route::kDenseMha);
  EXPECT_EQ(ChooseRoute(attention, true, 2, 513), Route::kSparseMqa);  // seq_len > K
  EXPECT_EQ(ChooseRoute(attention, true, 0, 0), Route::kSparseMqa);     // decodes only
  EXPECT_EQ(ChooseRoute(attention, false, 2, 64), Route::kSparseMqa);   // no prefill backend
  attention.force_mqa = true;
  EXPECT_EQ(ChooseRoute(attention, true, 2, 64), Route::kSparseMqa);
  attention.force_mqa = false;
  attention.is_sparse = false;
  EXPECT_EQ(ChooseRoute(attention, true, 2, 64), Route::kSparseMqa);
}

// TopkRowsRead against the plan itself, on hand-picked and random batches: the range holds every
// token the plan reads a row for (every token on the sparse route, the decodes on the dense), it
// is empty exactly when there is none, and it is exactly those rows when the caller lists the
// decodes first.
TEST(PlannerTest, TopkRowsReadFollowsThePlan) {
  PlannerConfig config = MakeConfig(2, 1);
  using Batch = std::vector<BatchRequest>;
  using Range = std::pair<int64_t, int64_t>;
  auto rows = [&](const Batch& batch) {
    const TopkRows r = TopkRowsRead(batch, config);
    return Range(r.begin, r.end);
  };
  EXPECT_TRUE(TopkRowsRead(Batch{{1, 64, 64}, {2, 128, 32}}, config).empty());  // dense prefills
  EXPECT_EQ(rows(Batch{{1, 64, 64}, {2, 40, 1}}), Range(64, 65));               // + a decode
  EXPECT_EQ(rows(Batch{{2, 40, 1}, {3, 9, 1}, {1, 64, 64}}), Range(0, 2));      // decodes first
  EXPECT_EQ(rows(Batch{{2, 40, 1}, {1, 64, 64}, {3, 9, 1}}), Range(0, 66));     // around a prefill
  EXPECT_EQ(rows(Batch{{1, 64, 64}, {2, 600, 32}}), Range(0, 96));              // seq_len > K
  EXPECT_EQ(rows(Batch{{1, 40, 1}}), Range(0, 1));                              // decodes only
  config.attention.force_mqa = true;
  EXPECT_EQ(rows(Batch{{1, 64, 64}}), Range(0, 64));
  config.attention.force_mqa = false;
  config.dense_mha_available = false;
  EXPECT_EQ(rows(Batch{{1, 64, 64}}), Range(0, 64));

  std::mt19937_64 rng(20261203);
  for (int trial = 0; trial < 2000; ++trial) {
    config = MakeConfig(1 + int(rng() % 4), 1);
    config.dense_mha_available = rng() % 4 != 0;
    config.attention.force_mqa = rng() % 8 == 0;
    config.scheduler.decode_threshold = 1 + int(rng() % 3);
    auto is_decode = [&](const BatchRequest& r) {
      return r.query_len <= config.scheduler.decode_threshold;
    };
    Batch batch;
    const int count = 1 + int(rng() % 6);
    for (int i = 0; i < count; ++i) {
      const int seq_len = 1 + int(rng() % 700);
      const int query_len = rng() % 2 ? 1 + int(rng() % 3) : 1 + int(rng() % seq_len);
      batch.push_back({i, seq_len, std::min(query_len, seq_len)});
    }
    // Half the trials list the decodes first, as vLLM does.
    if (rng() % 2) std::stable_partition(batch.begin(), batch.end(), is_decode);
    auto plan = BuildPlan(batch, config);
    ASSERT_TRUE(plan.ok()) << plan.status();
    // The caller's rows the plan reads, a flag per token.
    std::vector<char> reads(plan->num_tokens, 0);
    for (const PlannedRequest& r : plan->requests) {
      if (plan->route == Route::kDenseMha && !r.is_decode) continue;
      std::fill_n(reads.begin() + r.caller_token_begin, r.query_len, 1);
    }
    int64_t first = plan->num_tokens, last = -1;
    for (int64_t t = 0; t < plan->num_tokens; ++t) {
      if (!reads[t]) continue;
      first = std::min(first, t);
      last = t;
    }
    const TopkRows got = TopkRowsRead(batch, config);
    if (last < 0) {
      EXPECT_TRUE(got.empty()) << "trial " << trial;
    } else {
      EXPECT_EQ(Range(got.begin, got.end), Range(first, last + 1)) << "trial " << trial;
    }
    // Decodes first: the range holds no row the plan does not read.
    if (std::is_partitioned(batch.begin(), batch.end(), is_decode)) {
      for (int64_t t = got.begin; t < got.end; ++t) EXPECT_TRUE(reads[t]) << "trial " << trial;
    }
  }
}

TEST(PlannerTest, DecodesFirstInCallerOrderAndChunks) {
  const PlannerConfig config = MakeConfig(2, 1);
  const std::vector<BatchRequest> batch = {{7, 100, 40}, {3, 50, 1}, {9, 30, 30}, {4, 9, 1}};
  auto plan = BuildPlan(batch, config);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->route, Route::kDenseMha);
  ASSERT_EQ(plan->requests.size(), 4u);
  const int64_t want_ids[] = {3, 4, 7, 9};
  const int64_t want_begin[] = {0, 1, 2, 42};
  const int64_t want_caller[] = {40, 71, 0, 41};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(plan->requests[i].request_id, want_ids[i]);
    EXPECT_EQ(plan->requests[i].token_begin, want_begin[i]);
    EXPECT_EQ(plan->requests[i].caller_token_begin, want_caller[i]);
  }
  EXPECT_EQ(plan->num_decodes, 2);
  EXPECT_EQ(plan->num_decode_tokens, 2);
  EXPECT_EQ(plan->num_tokens, 72);
  ASSERT_EQ(plan->chunks.size(), 1u);  // one prefill has context (60 rows)
  EXPECT_EQ(plan->chunks[0].num_keys, 60);
}

TEST(PlannerTest, SerializationRoundTripsAndDetectsDamage) {
  const PlannerConfig config = MakeConfig(4, 2);
  const std::vector<BatchRequest> batch = {{1, 300, 20}, {2, 1, 1}, {5, 77, 7}};
  const Plan plan = BuildPlan(batch, config).value();
  const std::string bytes = SerializePlan(plan);
  auto back = DeserializePlan(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(SerializePlan(*back), bytes);
  for (size_t at : {size_t{40}, bytes.size() / 2, bytes.size() - 1}) {
    std::string damaged = bytes;
    damaged[at] ^= 0x10;
    auto status = DeserializePlan(damaged).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << at;
    EXPECT_NE(status.message().find("checksum"), std::string::npos) << status;
  }
  std::string old_version = bytes;
  old_version[8] = 9;
  EXPECT_NE(DeserializePlan(old_version).status().message().find("version"), std::string::npos);
  EXPECT_FALSE(DeserializePlan(bytes.substr(0, 20)).ok());
}

TEST(PlannerTest, PlanJsonFollowsFormats) {
  const PlannerConfig config = MakeConfig(4, 1);
  const Plan plan = BuildPlan(std::vector<BatchRequest>{{1, 64, 64}, {2, 10, 1}}, config).value();
  EXPECT_EQ(PlanToJson(plan, 4),
            "{\"route\": \"dense_mha\", \"num_decodes\": 1, \"num_prefills\": 1, \"workspace\": "
            "{\"rows_S\": " + std::to_string(plan.workspace.rows_per_chunk) +
                ", \"total_rows\": " +
                std::to_string(plan.workspace.rows_per_chunk * 5 / 4) +
                ", \"row_width\": 576}, \"chunks\": 0}");
}

TEST(PlannerTest, PrefillBackendResolution) {
  AttentionConfig attention;
  attention.prefill_backend = "auto";
  EXPECT_TRUE(ResolvePrefillBackend(attention, absl::OkStatus()).value());
  EXPECT_FALSE(ResolvePrefillBackend(attention, absl::UnimplementedError("qk 96")).value());
  attention.prefill_backend = "none";
  EXPECT_FALSE(ResolvePrefillBackend(attention, absl::OkStatus()).value());
  attention.prefill_backend = "native";
  EXPECT_FALSE(ResolvePrefillBackend(attention, absl::UnimplementedError("qk 96")).ok());
  attention.prefill_backend = "flashinfer";
  auto status = ResolvePrefillBackend(attention, absl::OkStatus()).status();
  EXPECT_NE(status.message().find("'flashinfer' is not available"), std::string::npos) << status;
  attention.prefill_backend = "cudnn";
  EXPECT_TRUE(ResolvePrefillBackend(attention, absl::OkStatus()).value());
  status = ResolvePrefillBackend(attention, absl::UnavailableError("no libcudnn.so.9")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("'cudnn' was requested but is unavailable: no libcudnn.so.9"),
            std::string::npos)
      << status;
}

// A CPU rank has no cuDNN: an explicit cudnn is a clear error, auto and native its own kernel.
TEST(PlannerTest, CpuDeviceSelectsPrefillBackends) {
  auto device = MakeCpuDevice();
  const absl::Status cudnn = device->SelectPrefillBackend("cudnn", 16, 192, 128);
  EXPECT_EQ(cudnn.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(cudnn.message().find("needs a CUDA rank"), std::string::npos) << cudnn;
  EXPECT_TRUE(device->SelectPrefillBackend("auto", 16, 256, 256).ok());
  EXPECT_TRUE(device->SelectPrefillBackend("native", 16, 192, 128).ok());
  EXPECT_TRUE(device->SelectPrefillBackend("none", 16, 192, 128).ok());
  AttentionConfig attention;
  attention.prefill_backend = "cudnn";
  EXPECT_FALSE(ResolvePrefillBackend(attention, cudnn).ok());
  attention.prefill_backend = "auto";
  EXPECT_TRUE(ResolvePrefillBackend(attention,
                                    device->SelectPrefillBackend("auto", 16, 192, 128))
                  .value());
}

TEST(PlannerTest, BatchValidationNamesTheProblem) {
  const SchedulerConfig scheduler = MakeConfig(1, 1).scheduler;
  auto message = [&](std::vector<BatchRequest> batch) {
    return std::string(ValidateBatch(batch, scheduler).message());
  };
  EXPECT_NE(message({{1, 5000, 1}}).find("max_model_len"), std::string::npos);
  EXPECT_NE(message({{1, 5, 6}}).find("query_len 6"), std::string::npos);
  EXPECT_NE(message({{1, 5, 0}}).find("query_len 0"), std::string::npos);
  EXPECT_NE(message({{1, 5, 1}, {1, 6, 1}}).find("appears twice"), std::string::npos);
  std::vector<BatchRequest> many(9);
  for (int i = 0; i < 9; ++i) many[i] = {i, 2, 1};
  EXPECT_NE(message(many).find("max_num_seqs"), std::string::npos);
}

}  // namespace
}  // namespace dcp
