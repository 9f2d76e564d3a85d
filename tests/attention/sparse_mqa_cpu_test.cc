// cpu::SparseMqa against ReferenceSoftmaxAttention over the selected cache rows (key = the whole
// row, value = its first v_dim columns): random shapes and selections with -1 holes, DeepSeek's
// 576/512 latent width, empty selections, one key, huge logits, out-of-range indices skipped
// unchecked and rejected with validate=true.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "attention/cpu/attention_cpu.h"
#include "tests/attention/attention_test_util.h"
#include "tests/reference/mla_reference.h"

namespace dcp {
namespace {

using testing::FreshSeed;
using testing::Rng;
using testing::Stored;

struct SparseCase {
  int tokens = 1, heads = 1, head_dim = 8, v_dim = 8, topk = 4;
  int64_t num_slots = 16;
  DType dtype = DType::kF32;
  int pad = 0;
  bool integer_qk = false;       // exact logits (huge-logit test)
  float scale = 0.0f;            // 0 = 1/sqrt(head_dim)
  std::vector<int32_t> indices;  // [tokens, topk]; row stride topk + pad
  std::vector<int32_t> counts;   // valid_counts when not empty: only columns [0, count) count
};

std::string Describe(const SparseCase& c) {
  return absl::StrFormat("tokens=%d heads=%d head_dim=%d v_dim=%d topk=%d slots=%d dtype=%s pad=%d",
                         c.tokens, c.heads, c.head_dim, c.v_dim, c.topk, c.num_slots,
                         dtype_name(c.dtype), c.pad);
}

// Row of `count` distinct random slots, the rest -1, in random order.
std::vector<int32_t> RandomRow(Rng& rng, int topk, int64_t num_slots, int count) {
  std::vector<int32_t> all(num_slots);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng.engine());
  std::vector<int32_t> row(topk, -1);
  std::copy(all.begin(), all.begin() + std::min<int64_t>(count, num_slots), row.begin());
  std::shuffle(row.begin(), row.end(), rng.engine());
  return row;
}

void FillRandomIndices(SparseCase& c, Rng& rng) {
  c.indices.clear();
  for (int t = 0; t < c.tokens; ++t) {
    const int count = rng.Int(0, 4) == 0 ? 0 : rng.Int(1, c.topk);
    const std::vector<int32_t> row = RandomRow(rng, c.topk, c.num_slots, count);
    c.indices.insert(c.indices.end(), row.begin(), row.end());
  }
}

void CheckSparse(const SparseCase& c, Rng& rng, bool validate = false) {
  const int64_t q_token = int64_t{c.heads} * c.head_dim + c.pad;
  const int64_t kv_row = c.head_dim + c.pad, index_row = c.topk + c.pad;
  Stored q = testing::RandomStored(rng, c.dtype, c.tokens * q_token);
  Stored kv = testing::RandomStored(rng, c.dtype, c.num_slots * kv_row);
  if (c.integer_qk) {
    for (size_t i = 0; i < q.size(); ++i) q.Set(i, rng.Int(-4, 4));
    for (size_t i = 0; i < kv.size(); ++i) kv.Set(i, rng.Int(-4, 4));
  }
  std::vector<int32_t> indices(c.tokens * index_row, 12345);  // padding: garbage, never read
  for (int t = 0; t < c.tokens; ++t) {
    std::copy(c.indices.begin() + t * c.topk, c.indices.begin() + (t + 1) * c.topk,
              indices.begin() + t * index_row);
  }
  const int64_t out_token = int64_t{c.heads} * c.v_dim + c.pad, lse_token = c.heads + c.pad;
  std::vector<float> out(c.tokens * out_token), lse(c.tokens * lse_token);
  testing::Poison(out);
  testing::Poison(lse);

  SparseMqaParams p;
  p.q = q.data(), p.kv_cache = kv.data(), p.indices = indices.data();
  p.out = out.data(), p.lse = lse.data();
  p.dtype = c.dtype;
  p.num_tokens = c.tokens, p.num_heads = c.heads, p.head_dim = c.head_dim, p.v_dim = c.v_dim;
  p.topk = c.topk, p.num_slots = c.num_slots;
  p.q_token_stride = q_token, p.q_head_stride = c.head_dim;
  p.kv_row_stride = kv_row, p.indices_token_stride = index_row;
  p.out_token_stride = out_token, p.out_head_stride = c.v_dim;
  p.lse_token_stride = lse_token;
  p.scale = c.scale != 0.0f ? c.scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (!c.counts.empty()) p.valid_counts = c.counts.data();
  ASSERT_TRUE(cpu::SparseMqa(p, validate).ok());

  std::vector<double> want_out, want_lse, keys, values, query(c.head_dim), o(c.v_dim);
  std::vector<float> got_out, got_lse;
  for (int t = 0; t < c.tokens; ++t) {
    // The selected rows: in-range entries of the row (-1 and out-of-range ones are skipped).
    keys.clear(), values.clear();
    int n = 0;
    const int columns = c.counts.empty() ? c.topk : std::clamp(c.counts[t], 0, c.topk);
    for (int col = 0; col < columns; ++col) {
      const int64_t slot = c.indices[t * c.topk + col];
      if (slot < 0 || slot >= c.num_slots) continue;
      ++n;
      for (int d = 0; d < c.head_dim; ++d) keys.push_back(kv.exact[slot * kv_row + d]);
      for (int e = 0; e < c.v_dim; ++e) values.push_back(kv.exact[slot * kv_row + e]);
    }
    for (int h = 0; h < c.heads; ++h) {
      for (int d = 0; d < c.head_dim; ++d) query[d] = q.exact[t * q_token + h * c.head_dim + d];
      double l;
      reference::ReferenceSoftmaxAttention(query.data(), keys.data(), values.data(), n, c.head_dim,
                                           c.v_dim, p.scale, o.data(), &l);
      for (int e = 0; e < c.v_dim; ++e) {
        want_out.push_back(o[e]);
        got_out.push_back(out[t * out_token + h * c.v_dim + e]);
      }
      want_lse.push_back(l);
      got_lse.push_back(lse[t * lse_token + h]);
    }
  }
  EXPECT_TRUE(testing::AllClose("o_lat", got_out, want_out, testing::kF32Tolerance));
  EXPECT_TRUE(testing::LseClose("lse", got_lse, want_lse, testing::kF32Tolerance));
  for (int t = 0; t < c.tokens; ++t) {
    for (int64_t e = int64_t{c.heads} * c.v_dim; e < out_token; ++e) {
      ASSERT_TRUE(std::isnan(out[t * out_token + e])) << "out padding written";
    }
    for (int64_t e = c.heads; e < lse_token; ++e) {
      ASSERT_TRUE(std::isnan(lse[t * lse_token + e])) << "lse padding written";
    }
  }
}

TEST(SparseMqaCpuTest, RandomShapesAndSelections) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  for (int iteration = 0; iteration < 40; ++iteration) {
    SparseCase c;
    c.tokens = rng.Int(1, 6), c.heads = rng.Int(1, 20);
    c.head_dim = rng.Int(1, 90), c.v_dim = rng.Int(1, c.head_dim);
    c.num_slots = rng.Int(1, 300), c.topk = rng.Int(1, 160);
    c.dtype = testing::RandomFloatDType(rng);
    c.pad = rng.Int(0, 2);
    FillRandomIndices(c, rng);
    SCOPED_TRACE(Describe(c));
    CheckSparse(c, rng, rng.Bool());
    if (::testing::Test::HasFailure()) return;
  }
}

// The latent width of DeepSeek-V3.2 (R + Dr = 576, v = R = 512), a decode batch of few tokens
// and many heads (the head-split thread path) and a longer one (token-split path).
TEST(SparseMqaCpuTest, DeepSeekLatentWidths) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  for (auto [tokens, heads] : {std::pair{1, 32}, std::pair{6, 8}}) {
    SparseCase c;
    c.tokens = tokens, c.heads = heads, c.head_dim = 576, c.v_dim = 512;
    c.num_slots = 700, c.topk = 256;
    c.dtype = testing::RandomFloatDType(rng);
    c.scale = static_cast<float>(1.0 / std::sqrt(192.0));
    FillRandomIndices(c, rng);
    SCOPED_TRACE(Describe(c));
    CheckSparse(c, rng);
  }
}

// A lone query whose row is all -1: out 0, lse -inf (a rank that owns none of its keys).
TEST(SparseMqaCpuTest, LoneQueryWithEmptySelection) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  SparseCase c;
  c.tokens = 1, c.heads = rng.Int(1, 8), c.head_dim = 24, c.v_dim = 16, c.topk = rng.Int(1, 70);
  c.indices.assign(c.topk, -1);
  CheckSparse(c, rng, true);
  // And with no cache at all.
  c.num_slots = 0;
  CheckSparse(c, rng, true);
}

TEST(SparseMqaCpuTest, OneKey) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  SparseCase c;
  c.tokens = 3, c.heads = 5, c.head_dim = 20, c.v_dim = 13, c.topk = 7, c.num_slots = 9;
  for (int t = 0; t < c.tokens; ++t) {
    std::vector<int32_t> row(c.topk, -1);
    row[rng.Int(0, c.topk - 1)] = rng.Int(0, 8);
    c.indices.insert(c.indices.end(), row.begin(), row.end());
  }
  CheckSparse(c, rng, true);
}

// Compacted rows with valid_counts: the columns past a token's count hold valid slots too,
// and must not be read.
TEST(SparseMqaCpuTest, ValidCountsLimitTheColumns) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  SparseCase c;
  c.tokens = 5, c.heads = 4, c.head_dim = 24, c.v_dim = 16, c.topk = 40, c.num_slots = 60;
  for (int t = 0; t < c.tokens; ++t) {
    const std::vector<int32_t> row = RandomRow(rng, c.topk, c.num_slots, c.topk);
    c.indices.insert(c.indices.end(), row.begin(), row.end());
  }
  c.counts = {0, 1, 17, 40, 99};  // 99: clamped to topk
  CheckSparse(c, rng, true);
}

// Exact logits far beyond +-80 (integer q, kv and a power-of-two scale).
TEST(SparseMqaCpuTest, HugeLogits) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  SparseCase c;
  c.tokens = 4, c.heads = 6, c.head_dim = 16, c.v_dim = 12, c.topk = 100, c.num_slots = 150;
  c.integer_qk = true, c.scale = 2.0f;
  FillRandomIndices(c, rng);
  CheckSparse(c, rng);
}

// Unchecked, indices outside [0, num_slots) are skipped, never read (the reference skips them).
TEST(SparseMqaCpuTest, OutOfRangeIndicesAreSkippedUnchecked) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  SparseCase c;
  c.tokens = 3, c.heads = 3, c.head_dim = 10, c.v_dim = 10, c.topk = 12, c.num_slots = 20;
  FillRandomIndices(c, rng);
  c.indices[0] = -7, c.indices[5] = 20, c.indices[13] = 1 << 30, c.indices[30] = -2147483647;
  CheckSparse(c, rng, false);
}

TEST(SparseMqaCpuTest, ValidateRejectsOutOfRangeAndRepeatedSlots) {
  std::vector<float> q(2 * 4, 1.0f), kv(10 * 4, 1.0f), out(2 * 4), lse(2);
  std::vector<int32_t> indices = {0, 1, -1, 2, 3, -1};
  SparseMqaParams p;
  p.q = q.data(), p.kv_cache = kv.data(), p.indices = indices.data();
  p.out = out.data(), p.lse = lse.data();
  p.num_tokens = 2, p.num_heads = 1, p.head_dim = 4, p.v_dim = 4, p.topk = 3, p.num_slots = 10;
  p.q_token_stride = 4, p.q_head_stride = 4, p.kv_row_stride = 4, p.indices_token_stride = 3;
  p.out_token_stride = 4, p.out_head_stride = 4, p.lse_token_stride = 1;
  ASSERT_TRUE(cpu::SparseMqa(p, true).ok());
  auto expect_error = [&](const std::string& needle) {
    const absl::Status status = cpu::SparseMqa(p, true);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(std::string(status.message()).find(needle), std::string::npos) << status.message();
  };
  indices[4] = 10;
  expect_error("token 1 column 1: slot 10");
  indices[4] = -2;
  expect_error("token 1 column 1: slot -2");
  indices[4] = 2;
  expect_error("token 1: slot 2 repeated");
  indices[4] = 3;
  p.lse = nullptr;
  expect_error("lse is null");
  p.lse = lse.data(), p.v_dim = 5;
  expect_error("v_dim");
  p.v_dim = 4, p.dtype = DType::kI32;
  expect_error("dtype");
  p.dtype = DType::kF32, p.kv_row_stride = 3;
  expect_error("kv_row_stride");
  // bf16 o_lat is a CUDA option: refused, not ignored (out would be written, out_bf16 not).
  p.kv_row_stride = 4;
  uint16_t bf16_out[8] = {};
  p.out_bf16 = bf16_out;
  expect_error("out_bf16 is a CUDA option");
}

}  // namespace
}  // namespace dcp
