// The float64 reference itself, on problems small enough to work out by hand: if the reference
// were wrong, every kernel test would agree with the wrong answer.
#include "tests/reference/mla_reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

namespace dcp::reference {
namespace {

// H = R = Dn = Dr = Dv = 1: k = [w_uk kv_c | k_pe], v = w_uv kv_c, all scalars.
MlaProblem Scalar(std::vector<double> kv_c, std::vector<double> k_pe, int query_len) {
  MlaProblem pb;
  pb.num_heads = pb.kv_lora_rank = pb.qk_nope_head_dim = pb.qk_rope_head_dim = pb.v_head_dim = 1;
  pb.softmax_scale = 0.5;
  pb.seq_lens = {static_cast<int>(kv_c.size())};
  pb.query_lens = {query_len};
  pb.kv_c = std::move(kv_c);
  pb.k_pe = std::move(k_pe);
  pb.w_uk = {2.0};
  pb.w_uv = {3.0};
  pb.q_nope.assign(query_len, 1.0);
  pb.q_rope.assign(query_len, 4.0);
  return pb;
}

TEST(MlaReferenceTest, OneKeyByHand) {
  // k = [2 * 1.5, 0.5] = [3, 0.5]; q = [1, 4]; q.k = 5; logit 2.5; v = 4.5.
  const MlaResult result = ReferenceAttention(Scalar({1.5}, {0.5}, 1));
  EXPECT_DOUBLE_EQ(result.out[0], 4.5);
  EXPECT_DOUBLE_EQ(result.lse[0], 2.5);
}

TEST(MlaReferenceTest, CausalPrefillByHand) {
  // Keys: j=0 -> k = [2, 0], v = 3, logit 0.5 * 2 = 1; j=1 -> k = [0, 0.25], v = 0, logit 0.5.
  // Token 0 (position 0) sees key 0 only; token 1 sees both.
  const MlaResult result = ReferenceAttention(Scalar({1.0, 0.0}, {0.0, 0.25}, 2));
  EXPECT_DOUBLE_EQ(result.out[0], 3.0);
  EXPECT_DOUBLE_EQ(result.lse[0], 1.0);
  const double lse = std::log(std::exp(1.0) + std::exp(0.5));
  EXPECT_NEAR(result.lse[1], lse, 1e-15);
  EXPECT_NEAR(result.out[1], 3.0 * std::exp(1.0 - lse), 1e-15);
}

TEST(MlaReferenceTest, TopkSelectsAndEmptyRowGivesZeroAndMinusInf) {
  MlaProblem pb = Scalar({1.0, 0.0}, {0.0, 0.25}, 2);
  pb.topk_width = 2;
  pb.topk = {-1, -1, 1, -1};  // token 0 selects nothing, token 1 only key 1
  const MlaResult result = ReferenceAttention(pb);
  EXPECT_EQ(result.out[0], 0.0);
  EXPECT_EQ(result.lse[0], -std::numeric_limits<double>::infinity());
  EXPECT_DOUBLE_EQ(result.out[1], 0.0);
  EXPECT_DOUBLE_EQ(result.lse[1], 0.5);
}

TEST(MlaReferenceTest, RejectsInvalidTopk) {
  MlaProblem pb = Scalar({1.0, 0.0}, {0.0, 0.25}, 2);
  pb.topk_width = 2;
  pb.topk = {1, -1, 0, 1};  // token 0 (position 0) selects the future key 1
  EXPECT_THROW(ReferenceAttention(pb), std::invalid_argument);
  pb.topk = {0, -1, 1, 1};  // repeated
  EXPECT_THROW(ReferenceAttention(pb), std::invalid_argument);
}

TEST(MlaReferenceTest, SoftmaxAttentionIsStableForHugeLogits) {
  const double q[1] = {1.0}, keys[2] = {1000.0, 999.0}, values[2] = {1.0, -1.0};
  double out, lse;
  ReferenceSoftmaxAttention(q, keys, values, 2, 1, 1, 1.0, &out, &lse);
  const double w = 1.0 / (1.0 + std::exp(-1.0));
  EXPECT_NEAR(out, w - (1.0 - w), 1e-15);
  EXPECT_NEAR(lse, 1000.0 + std::log1p(std::exp(-1.0)), 1e-12);
  ReferenceSoftmaxAttention(q, keys, values, 0, 1, 1, 1.0, &out, &lse);
  EXPECT_EQ(out, 0.0);
  EXPECT_EQ(lse, -std::numeric_limits<double>::infinity());
}

}  // namespace
}  // namespace dcp::reference
