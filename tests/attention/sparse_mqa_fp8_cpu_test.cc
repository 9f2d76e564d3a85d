// cpu::SparseMqa over fp8_ds_mla cache rows (kv_format kFp8DsMla) against the float64 reference
// computed on the DEQUANTIZED cache: the rows are quantized and dequantized by the independent
// host model of tests/reference (no code shared with the kernel), so the only difference left is
// fp32 arithmetic and the comparison is at fp32 tolerance. Random selections with holes, empty
// selections, one key, huge logits, q in F32 and BF16, and the clear errors on bad input.
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
#include "tests/reference/fp8_ds_mla_reference.h"
#include "tests/reference/mla_reference.h"

namespace dcp {
namespace {

using testing::FreshSeed;
using testing::Rng;
using testing::Stored;

constexpr int kR = 512, kDr = 64, kWidth = 576, kRowBytes = 656;

struct Fp8Case {
  int tokens = 1, heads = 1, topk = 8, num_slots = 16;
  DType q_dtype = DType::kF32;
  // Integer q in [-4, 4], integer kv_c in [-7, 7] with a 7 in every tile (scale 7/448 = 2^-6,
  // so every value quantizes exactly) and integer k_pe, scale 1: exact logits in the hundreds.
  bool integer = false;
  std::vector<int32_t> indices;  // [tokens, topk]
};

std::string Describe(const Fp8Case& c) {
  return absl::StrFormat("tokens=%d heads=%d topk=%d slots=%d q=%s integer=%d", c.tokens, c.heads,
                         c.topk, c.num_slots, dtype_name(c.q_dtype), c.integer);
}

// A cache of num_slots rows quantized by the reference, with the corners of the format: an
// all-zero tile, a tile of wide dynamic range; and its dequantized values [num_slots, 576].
void MakeCache(Rng& rng, int num_slots, bool integer, std::vector<uint8_t>* cache,
               std::vector<double>* dequantized) {
  cache->clear(), dequantized->clear();
  std::vector<float> kv_c(kR), k_pe(kDr);
  for (int s = 0; s < num_slots; ++s) {
    for (int i = 0; i < kR; ++i) {
      const int tile = i / 128;
      double v = rng.Normal();
      if (s % 5 == 1 && tile == 3) v = 0.0;
      if (s % 5 == 2 && tile == 0) v *= std::exp2(rng.Uniform(-12, 4));
      if (integer) v = i % 128 == 0 ? (rng.Bool() ? 7 : -7) : rng.Int(-7, 7);
      kv_c[i] = static_cast<float>(v);
    }
    for (int i = 0; i < kDr; ++i) {
      k_pe[i] = static_cast<float>(integer ? rng.Int(-7, 7) : rng.Normal());
    }
    const std::vector<uint8_t> row = reference::QuantizeFp8DsMlaRow(kv_c.data(), k_pe.data());
    cache->insert(cache->end(), row.begin(), row.end());
    const std::vector<double> values = reference::DequantizeFp8DsMlaRow(row.data());
    dequantized->insert(dequantized->end(), values.begin(), values.end());
  }
}

void RandomIndices(Fp8Case& c, Rng& rng) {
  c.indices.clear();
  std::vector<int32_t> all(c.num_slots);
  std::iota(all.begin(), all.end(), 0);
  for (int t = 0; t < c.tokens; ++t) {
    std::shuffle(all.begin(), all.end(), rng.engine());
    const int count = rng.Int(0, 5) == 0 ? 0 : rng.Int(1, std::min(c.topk, c.num_slots));
    std::vector<int32_t> row(c.topk, -1);
    std::copy(all.begin(), all.begin() + count, row.begin());
    std::shuffle(row.begin(), row.end(), rng.engine());
    c.indices.insert(c.indices.end(), row.begin(), row.end());
  }
}

SparseMqaParams Params(const Fp8Case& c, const Stored& q, const std::vector<uint8_t>& cache,
                       std::vector<float>& out, std::vector<float>& lse) {
  SparseMqaParams p;
  p.q = q.data(), p.kv_cache = cache.data(), p.indices = c.indices.data();
  p.out = out.data(), p.lse = lse.data();
  p.dtype = c.q_dtype;
  p.kv_format = KvCacheDType::kFp8DsMla;
  p.num_tokens = c.tokens, p.num_heads = c.heads, p.head_dim = kWidth, p.v_dim = kR;
  p.topk = c.topk, p.num_slots = c.num_slots;
  p.q_token_stride = int64_t{c.heads} * kWidth, p.q_head_stride = kWidth;
  p.kv_row_stride = kRowBytes, p.indices_token_stride = c.topk;
  p.out_token_stride = int64_t{c.heads} * kR, p.out_head_stride = kR;
  p.lse_token_stride = c.heads;
  p.scale = static_cast<float>(1.0 / std::sqrt(192.0));
  return p;
}

void CheckFp8(const Fp8Case& c, Rng& rng, bool validate = false) {
  std::vector<uint8_t> cache;
  std::vector<double> dequantized;
  MakeCache(rng, c.num_slots, c.integer, &cache, &dequantized);
  Stored q = testing::RandomStored(rng, c.q_dtype, size_t(c.tokens) * c.heads * kWidth);
  if (c.integer) {
    for (size_t i = 0; i < q.size(); ++i) q.Set(i, rng.Int(-4, 4));
    for (int i = 0; i < c.num_slots * kWidth; ++i) {
      ASSERT_EQ(dequantized[i], std::round(dequantized[i])) << "integer rows quantize exactly";
    }
  }
  std::vector<float> out(size_t(c.tokens) * c.heads * kR), lse(size_t(c.tokens) * c.heads);
  testing::Poison(out);
  testing::Poison(lse);
  SparseMqaParams p = Params(c, q, cache, out, lse);
  if (c.integer) p.scale = 1.0f;
  const absl::Status status = cpu::SparseMqa(p, validate);
  ASSERT_TRUE(status.ok()) << status;

  std::vector<double> want_out, want_lse, keys, values, o(kR);
  for (int t = 0; t < c.tokens; ++t) {
    keys.clear(), values.clear();
    int n = 0;
    for (int col = 0; col < c.topk; ++col) {
      const int64_t slot = c.indices[size_t(t) * c.topk + col];
      if (slot < 0 || slot >= c.num_slots) continue;
      ++n;
      const double* row = dequantized.data() + slot * kWidth;
      keys.insert(keys.end(), row, row + kWidth);
      values.insert(values.end(), row, row + kR);
    }
    for (int h = 0; h < c.heads; ++h) {
      const double* query = q.exact.data() + (size_t(t) * c.heads + h) * kWidth;
      double l;
      reference::ReferenceSoftmaxAttention(query, keys.data(), values.data(), n, kWidth, kR,
                                           p.scale, o.data(), &l);
      want_out.insert(want_out.end(), o.begin(), o.end());
      want_lse.push_back(l);
    }
  }
  EXPECT_TRUE(testing::AllClose("o_lat", out, want_out, testing::kF32Tolerance));
  EXPECT_TRUE(testing::LseClose("lse", lse, want_lse, testing::kF32Tolerance));
}

TEST(SparseMqaFp8CpuTest, RandomSelectionsOnTheDequantizedCache) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  for (int iteration = 0; iteration < 6; ++iteration) {
    Fp8Case c;
    c.tokens = rng.Int(1, 5), c.heads = rng.Int(1, 24);
    c.num_slots = rng.Int(1, 200), c.topk = rng.Int(1, 150);
    c.q_dtype = testing::RandomFloatDType(rng);
    RandomIndices(c, rng);
    SCOPED_TRACE(Describe(c));
    CheckFp8(c, rng, rng.Bool());
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SparseMqaFp8CpuTest, EmptySelectionAndOneKey) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  Fp8Case c;
  c.tokens = 3, c.heads = 4, c.topk = 9, c.num_slots = 12;
  c.indices.assign(size_t(c.tokens) * c.topk, -1);  // token 0: nothing
  c.indices[size_t(1) * c.topk + rng.Int(0, c.topk - 1)] = rng.Int(0, c.num_slots - 1);
  c.indices[size_t(2) * c.topk + 3] = 5;
  c.indices[size_t(2) * c.topk + 7] = 11;
  SCOPED_TRACE(Describe(c));
  CheckFp8(c, rng, true);
}

TEST(SparseMqaFp8CpuTest, HugeLogits) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  Fp8Case c;
  c.tokens = 2, c.heads = 3, c.topk = 40, c.num_slots = 64, c.integer = true;
  RandomIndices(c, rng);
  SCOPED_TRACE(Describe(c));
  CheckFp8(c, rng);
}

TEST(SparseMqaFp8CpuTest, BadInputIsAClearError) {
  Rng rng(1);
  Fp8Case c;
  c.tokens = 1, c.heads = 2, c.topk = 4, c.num_slots = 4;
  c.indices = {0, 1, 2, 3};
  std::vector<uint8_t> cache(size_t(c.num_slots) * 1152);
  Stored q = testing::RandomStored(rng, DType::kF32, size_t(c.heads) * kWidth);
  std::vector<float> out(size_t(c.heads) * kR), lse(c.heads);
  SparseMqaParams p = Params(c, q, cache, out, lse);
  p.kv_row_stride = 576;  // elements of a bf16 row, not the 656 bytes of the format
  absl::Status status = cpu::SparseMqa(p);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("656"), std::string::npos) << status.message();

  p = Params(c, q, cache, out, lse);
  p.head_dim = 192, p.v_dim = 128, p.q_head_stride = 192;
  status = cpu::SparseMqa(p);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("fp8_ds_mla"), std::string::npos) << status.message();

  p = Params(c, q, cache, out, lse);
  p.kv_format = static_cast<KvCacheDType>(9);
  status = cpu::SparseMqa(p);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("not supported by this build"), std::string::npos)
      << status.message();
}

}  // namespace
}  // namespace dcp
