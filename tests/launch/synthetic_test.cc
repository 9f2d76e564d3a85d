#include "launch/synthetic.h"

#include <algorithm>

#include "gtest/gtest.h"
#include "launch/problem.h"

namespace dcp::launch {
namespace {

TEST(SyntheticTest, ValuesAreUniformInMinusOneOne) {
  float low = 1, high = -1;
  for (uint64_t i = 0; i < 10000; ++i) {
    const float v = SyntheticWorkload::Value(3, 1, i);
    low = std::min(low, v);
    high = std::max(high, v);
  }
  EXPECT_GE(low, -1.0f);
  EXPECT_LT(high, 1.0f);
  EXPECT_LT(low, -0.99f);
  EXPECT_GT(high, 0.99f);
  EXPECT_NE(SyntheticWorkload::Value(3, 1, 0), SyntheticWorkload::Value(4, 1, 0));
}

// Each rank's shard, generated alone, equals its part of the whole batch.
TEST(SyntheticTest, ShardsMatchTheWhole) {
  ModelDims model;
  model.num_heads = 8;
  const int world = 4, interleave = 2, k = 16;
  SyntheticWorkload workload(model, k, 11);
  const std::vector<RequestShape> requests = {{40, 1}, {12, 12}, {30, 6}};
  const RankView whole_view = RankView::Of(model, 1, interleave, 0);
  const RankBatch whole = workload.Batch(requests, 2, 100, whole_view);
  const RankWeights whole_weights = workload.Weights(whole_view);
  const int64_t width = model.latent_width(), dn = model.qk_nope_head_dim;
  for (int rank = 0; rank < world; ++rank) {
    const RankView view = RankView::Of(model, world, interleave, rank);
    const RankBatch shard = workload.Batch(requests, 2, 100, view);
    const RankWeights weights = workload.Weights(view);
    const int hl = view.num_heads();
    EXPECT_EQ(shard.kv_new, whole.kv_new);
    EXPECT_EQ(shard.topk, whole.topk);
    EXPECT_TRUE(std::equal(weights.w_uk.begin(), weights.w_uk.end(),
                           whole_weights.w_uk.begin() + rank * hl * dn * model.kv_lora_rank));
    for (int64_t t = 0; t < whole.num_tokens(); ++t) {
      for (int h = 0; h < hl; ++h) {
        EXPECT_EQ(shard.q_nope[(t * hl + h) * dn],
                  whole.q_nope[(t * model.num_heads + view.head_begin + h) * dn]);
      }
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      const auto& rows = shard.cached_rows[i];
      for (size_t j = 0; j * width < rows.size(); ++j) {
        const int64_t g = view.layout.global_index(int64_t(j), rank);
        EXPECT_TRUE(std::equal(rows.begin() + j * width, rows.begin() + (j + 1) * width,
                               whole.cached_rows[i].begin() + g * width));
      }
    }
  }
}

TEST(SyntheticTest, TopkIsCausalDeterministicAndKeepsTheNewestToken) {
  ModelDims model;
  const int k = 8;
  SyntheticWorkload workload(model, k, 5);
  const std::vector<RequestShape> requests = {{6, 6}, {30, 1}, {20, 4}};
  const std::vector<int32_t> topk = workload.TopK(requests, 0);
  ASSERT_EQ(topk.size(), size_t(11 * k));
  EXPECT_TRUE(ValidateTopk(requests, topk, k, "synthetic").ok());
  EXPECT_EQ(topk, workload.TopK(requests, 0));
  EXPECT_NE(topk, workload.TopK(requests, 1));
  // seq_len <= K: every causal position in order, then -1.
  EXPECT_EQ(std::vector<int32_t>(topk.begin() + 2 * k, topk.begin() + 3 * k),
            (std::vector<int32_t>{0, 1, 2, -1, -1, -1, -1, -1}));
  // seq_len > K: K positions, the newest (the token itself) among them.
  for (int t = 6; t < 11; ++t) {
    const auto row = std::vector<int32_t>(topk.begin() + t * k, topk.begin() + (t + 1) * k);
    const int32_t position = t == 6 ? 29 : 16 + (t - 7);
    EXPECT_EQ(std::count(row.begin(), row.end(), -1), 0) << t;
    EXPECT_NE(std::find(row.begin(), row.end(), position), row.end()) << t;
  }
}

}  // namespace
}  // namespace dcp::launch
