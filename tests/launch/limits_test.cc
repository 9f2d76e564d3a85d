// Finding 2 (ceilings on every value that sizes memory, and the memory estimate) and finding 3
// (an absurd comm_timeout_s) of the hardening work (docs/hardening.md).
#include "launch/limits.h"

#include <limits>

#include "gtest/gtest.h"

namespace dcp::launch {
namespace {

using Batches = std::vector<std::vector<RequestShape>>;

RunConfig Small() {
  RunConfig config;
  config.dcp.world_size = 2;
  return config;
}

std::string CeilingError(const RunConfig& config, const Batches& batches = {}) {
  const absl::Status status = CheckCeilings(config, batches);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  return std::string(status.message());
}

TEST(LimitsTest, DefaultsAndRealModelsPass) {
  EXPECT_TRUE(CheckCeilings(Small(), {{{4096, 1}}}).ok());
  RunConfig deepseek = Small();
  deepseek.model = ModelDims::DeepSeekV32();
  deepseek.scheduler.max_model_len = 163840;
  EXPECT_TRUE(CheckCeilings(deepseek, {}).ok());
}

TEST(LimitsTest, EveryValueThatSizesMemoryHasACeiling) {
  RunConfig config = Small();
  config.attention.index_topk = std::numeric_limits<int32_t>::max();
  EXPECT_NE(CeilingError(config).find("attention.index_topk = 2147483647 exceeds its ceiling"),
            std::string::npos);
  config = Small();
  config.scheduler.max_model_len = 1 << 30;
  EXPECT_NE(CeilingError(config).find("scheduler.max_model_len"), std::string::npos);
  config = Small();
  config.scheduler.max_num_seqs = 1 << 30;
  EXPECT_NE(CeilingError(config).find("scheduler.max_num_seqs"), std::string::npos);
  config = Small();
  config.scheduler.num_kv_blocks = 1 << 30;
  EXPECT_NE(CeilingError(config).find("scheduler.num_kv_blocks"), std::string::npos);
  config = Small();
  config.workspace_rows = int64_t{1} << 40;
  EXPECT_NE(CeilingError(config).find("scheduler.workspace_rows"), std::string::npos);
  config = Small();
  config.model.num_heads = 1 << 20;
  EXPECT_NE(CeilingError(config).find("model.num_heads"), std::string::npos);
  EXPECT_NE(CeilingError(Small(), {{{std::numeric_limits<int32_t>::max(), 1}}})
                .find("a request's seq_len"),
            std::string::npos);
  EXPECT_NE(CeilingError(Small(), {std::vector<RequestShape>(kMaxNumSeqs + 1, {1, 1})})
                .find("requests in one batch"),
            std::string::npos);
  EXPECT_NE(CeilingError(Small(), Batches(kMaxBatches + 1, {{1, 1}})).find("number of batches"),
            std::string::npos);
}

TEST(LimitsTest, CommTimeoutHasAStatedMinimum) {
  for (double absurd : {0.000001, 0.5, 0.0, -1.0, 1e9, std::numeric_limits<double>::infinity(),
                        std::numeric_limits<double>::quiet_NaN()}) {
    RunConfig config = Small();
    config.dcp.comm_timeout_s = absurd;
    EXPECT_NE(CeilingError(config).find("the minimum is 1 s"), std::string::npos) << absurd;
  }
  RunConfig config = Small();
  config.dcp.comm_timeout_s = 1.0;
  EXPECT_TRUE(CheckCeilings(config, {}).ok());
}

// `--batch q4 --index-topk 2^20` passes the ceiling, but 100000 decodes with it would not fit:
// the estimate counts the top-k rows (tokens x K x 4 bytes) and the check refuses the run.
TEST(LimitsTest, MemoryEstimateRefusesWhatTheMachineCannotHold) {
  RunConfig config = Small();
  config.attention.index_topk = 1 << 20;
  const Batches batches = {std::vector<RequestShape>(100000, {1024, 1})};
  const MemoryEstimate estimate = EstimateRankMemory(config, batches, 0);
  EXPECT_GE(estimate.batch, int64_t{100000} << 22);  // the top-k rows alone: 400 GB
  const absl::Status status = CheckMemory(estimate, estimate, 2, int64_t{64} << 30);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("64.00 GiB is available"), std::string::npos) << status;
  // A small run fits in a small machine.
  const MemoryEstimate small = EstimateRankMemory(Small(), {{{64, 64}}}, 0);
  EXPECT_GT(small.total(), 0);
  EXPECT_TRUE(CheckMemory(small, small, 4, int64_t{4} << 30).ok()) << small.ToString();
  EXPECT_GT(AvailableHostMemory(), 0);
}

// Without a dense route (prefill_backend none) the engine allocates no workspace: the estimate
// counts none.
TEST(LimitsTest, NoWorkspaceWithoutADenseRoute) {
  RunConfig config = Small();
  EXPECT_GT(EstimateRankMemory(config, {{{64, 64}}}, 0).workspace, 0);
  config.attention.prefill_backend = "none";
  EXPECT_EQ(EstimateRankMemory(config, {{{64, 64}}}, 0).workspace, 0);
}

// The --check reference is a world of one holding every rank's KV pool (Reference::Create
// multiplies num_kv_blocks by W): its estimate grows with W where the pool is given per rank,
// and stays where the formula sizes it for whole sequences.
TEST(LimitsTest, TheCheckReferenceHoldsEveryRanksPool) {
  const auto reference = [](int world, int64_t blocks) {
    RunConfig config = Small();
    config.dcp.world_size = world;
    config.run.check = true;
    config.scheduler.num_kv_blocks = blocks;
    return EstimateRankMemory(config, {{{64, 64}}}, 0).reference;
  };
  const RunConfig config = Small();
  const int64_t pool =
      int64_t{1000} * config.scheduler.block_size * config.model.latent_width() * 4;
  EXPECT_EQ(reference(2, 1000) - reference(1, 1000), pool);
  EXPECT_EQ(reference(4, 1000) - reference(1, 1000), 3 * pool);
  EXPECT_EQ(reference(4, 0), reference(1, 0));
}

}  // namespace
}  // namespace dcp::launch
