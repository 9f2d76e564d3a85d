#include "runtime/config.h"

#include <string>

#include "attention/attention_params.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

void ExpectInvalid(const absl::Status& status, const std::string& field) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(field), std::string::npos)
      << "message does not name " << field << ": " << status.message();
}

TEST(ConfigTest, DefaultsAndDeepSeekAreValid) {
  EXPECT_TRUE(ValidateConfigs(ModelDims{}, DcpConfig{}, SchedulerConfig{}, AttentionConfig{}).ok());
  const ModelDims deepseek = ModelDims::DeepSeekV32();
  EXPECT_EQ(deepseek.latent_width(), 576);
  EXPECT_EQ(deepseek.qk_head_dim(), 192);
  EXPECT_FLOAT_EQ(deepseek.scale(), 1.0f / std::sqrt(192.0f));
  DcpConfig dcp;
  dcp.world_size = 8;
  dcp.rank = 7;
  EXPECT_TRUE(ValidateConfigs(deepseek, dcp, SchedulerConfig{}, AttentionConfig{}).ok());
}

TEST(ConfigTest, Fp8DsMlaNeedsDeepSeekLatentWidths) {
  AttentionConfig attention;
  attention.kv_cache_dtype = KvCacheDType::kFp8DsMla;
  EXPECT_TRUE(
      ValidateConfigs(ModelDims::DeepSeekV32(), DcpConfig{}, SchedulerConfig{}, attention).ok());
  ExpectInvalid(ValidateConfigs(ModelDims{}, DcpConfig{}, SchedulerConfig{}, attention),
                "fp8_ds_mla needs kv_lora_rank 512 and qk_rope_head_dim 64");
  ModelDims rope32 = ModelDims::DeepSeekV32();
  rope32.qk_rope_head_dim = 32;
  ExpectInvalid(ValidateConfigs(rope32, DcpConfig{}, SchedulerConfig{}, attention),
                "qk_rope_head_dim");
  attention.kv_cache_dtype = static_cast<KvCacheDType>(5);
  ExpectInvalid(attention.Validate(), "not supported by this build");
}

TEST(ConfigTest, HeadsNotDivisibleByWorld) {
  ModelDims model;
  model.num_heads = 6;
  DcpConfig dcp;
  dcp.world_size = 4;
  ExpectInvalid(ValidateConfigs(model, dcp, SchedulerConfig{}, AttentionConfig{}),
                "model.num_heads");
}

TEST(ConfigTest, InterleaveMustDivideBlockSize) {
  DcpConfig dcp;
  dcp.interleave = 3;
  SchedulerConfig scheduler;
  scheduler.block_size = 64;
  ExpectInvalid(ValidateConfigs(ModelDims{}, dcp, scheduler, AttentionConfig{}), "dcp.interleave");
}

TEST(ConfigTest, ZeroSizesNameTheField) {
  ModelDims model;
  model.kv_lora_rank = 0;
  ExpectInvalid(model.Validate(), "model.kv_lora_rank");
  SchedulerConfig scheduler;
  scheduler.block_size = 0;
  ExpectInvalid(scheduler.Validate(), "scheduler.block_size");
  scheduler = SchedulerConfig{};
  scheduler.max_num_seqs = 0;
  ExpectInvalid(scheduler.Validate(), "scheduler.max_num_seqs");
  AttentionConfig attention;
  attention.index_topk = 0;
  ExpectInvalid(attention.Validate(), "attention.index_topk");
  attention.index_topk = kMaxTopkWidth;
  EXPECT_TRUE(attention.Validate().ok());
  attention.index_topk = kMaxTopkWidth + 1;
  ExpectInvalid(attention.Validate(), "attention.index_topk 1048577 is above the limit 1048576");
  DcpConfig dcp;
  dcp.world_size = 0;
  ExpectInvalid(dcp.Validate(), "dcp.world_size");
  dcp = DcpConfig{};
  dcp.rank = 1;
  ExpectInvalid(dcp.Validate(), "dcp.rank");
}

TEST(ConfigTest, CombineBackendParsing) {
  CombineBackend backend;
  ASSERT_TRUE(ParseCombineBackend("a2a", &backend).ok());
  EXPECT_EQ(backend, CombineBackend::kAllToAll);
  ASSERT_TRUE(ParseCombineBackend("ag_rs", &backend).ok());
  EXPECT_EQ(backend, CombineBackend::kAllGatherReduceScatter);
  ExpectInvalid(ParseCombineBackend("ring", &backend), "dcp.combine");
}

}  // namespace
}  // namespace dcp
