// The LSE merges: attention over any split of a key set (2 to 8 parts, some empty), merged by
// MergeStates (folded), DcpCorrect + sum (ag_rs) or DcpCombine (a2a), equals attention over the
// whole set. Partials come from the float64 reference, rounded to fp32, so only the merge
// itself is under test. Plus the -inf / NaN / +inf LSE rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
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

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInfF = std::numeric_limits<float>::infinity();

struct Split {
  int parts, tokens, heads, dim;
  std::vector<float> outs;                 // [parts, T, H, dim]
  std::vector<float> lses;                 // [parts, T, H]
  std::vector<double> want_out, want_lse;  // attention over the whole set, [T, H, dim] / [T, H]
};

// Per (token, head): n keys with random logit scale, each assigned to a random part; some
// parts are forced empty everywhere, and some (token, head) rows have no key at all.
Split MakeSplit(Rng& rng, int parts, double logit_scale) {
  Split s;
  s.parts = parts, s.tokens = rng.Int(1, 5), s.heads = rng.Int(1, 4), s.dim = rng.Int(1, 40);
  const int rows = s.tokens * s.heads;
  s.outs.assign(static_cast<size_t>(parts) * rows * s.dim, 0.0f);
  s.lses.assign(static_cast<size_t>(parts) * rows, 0.0f);
  s.want_out.assign(static_cast<size_t>(rows) * s.dim, 0.0);
  s.want_lse.assign(rows, 0.0);
  std::vector<bool> empty_part(parts, false);
  for (int part = 0; part < parts; ++part) empty_part[part] = rng.Int(0, 3) == 0;
  const int d = 6;
  std::vector<double> query(d), out(s.dim);
  for (int row = 0; row < rows; ++row) {
    const int n = rng.Int(0, 5) == 0 ? 0 : rng.Int(1, 60);
    std::vector<double> keys(static_cast<size_t>(n) * d), values(static_cast<size_t>(n) * s.dim);
    for (double& x : keys) x = rng.Normal();
    for (double& x : values) x = rng.Normal();
    for (double& x : query) x = logit_scale * rng.Normal();
    std::vector<int> owner(n);
    for (int j = 0; j < n; ++j) {
      do owner[j] = rng.Int(0, parts - 1);
      while (empty_part[owner[j]] &&
             !std::all_of(empty_part.begin(), empty_part.end(), [](bool e) { return e; }));
    }
    double lse;
    reference::ReferenceSoftmaxAttention(query.data(), keys.data(), values.data(), n, d, s.dim, 1.0,
                                         &s.want_out[static_cast<size_t>(row) * s.dim], &lse);
    s.want_lse[row] = lse;
    for (int part = 0; part < parts; ++part) {
      std::vector<double> part_keys, part_values;
      int count = 0;
      for (int j = 0; j < n; ++j) {
        if (owner[j] != part) continue;
        ++count;
        part_keys.insert(part_keys.end(), keys.begin() + j * d, keys.begin() + (j + 1) * d);
        part_values.insert(part_values.end(), values.begin() + j * s.dim,
                           values.begin() + (j + 1) * s.dim);
      }
      double part_lse;
      reference::ReferenceSoftmaxAttention(query.data(), part_keys.data(), part_values.data(),
                                           count, d, s.dim, 1.0, out.data(), &part_lse);
      s.lses[static_cast<size_t>(part) * rows + row] = static_cast<float>(part_lse);
      for (int e = 0; e < s.dim; ++e) {
        s.outs[(static_cast<size_t>(part) * rows + row) * s.dim + e] = static_cast<float>(out[e]);
      }
    }
  }
  return s;
}

std::string Describe(const Split& s) {
  return absl::StrFormat("parts=%d tokens=%d heads=%d dim=%d", s.parts, s.tokens, s.heads, s.dim);
}

// fold: check MergeStates folded over the parts too (off for LSEs far from zero: each step's
// merged LSE is rounded to fp32, which moves the next step's weights by up to its ulp, 4e-3 at
// 4e4; past ~1e7 the + log(count) is lost altogether).
void CheckMergesOfSplit(const Split& s, bool fold = true) {
  const int rows = s.tokens * s.heads;
  const size_t row_elements = static_cast<size_t>(rows) * s.dim;
  // 1. MergeStates folded over the parts, in place (out aliases out_a, lse aliases lse_a).
  if (fold) {
    std::vector<float> out(s.outs.begin(), s.outs.begin() + row_elements);
    std::vector<float> lse(s.lses.begin(), s.lses.begin() + rows);
    for (int part = 1; part < s.parts; ++part) {
      MergeStatesParams p;
      p.out_a = out.data(), p.lse_a = lse.data();
      p.out_b = s.outs.data() + part * row_elements, p.lse_b = s.lses.data() + part * rows;
      p.out = out.data(), p.lse = lse.data();
      p.num_tokens = s.tokens, p.num_heads = s.heads, p.dim = s.dim;
      ASSERT_TRUE(cpu::MergeStates(p).ok());
    }
    EXPECT_TRUE(testing::AllClose("MergeStates out", out, s.want_out, testing::kF32Tolerance));
    EXPECT_TRUE(testing::LseClose("MergeStates lse", lse, s.want_lse, testing::kF32Tolerance));
  }
  // 2. ag_rs: every rank scales its own partial given all LSEs; the sum is the result.
  {
    std::vector<float> sum(row_elements, 0.0f), lse_total;
    for (int rank = 0; rank < s.parts; ++rank) {
      std::vector<float> own(s.outs.begin() + rank * row_elements,
                             s.outs.begin() + (rank + 1) * row_elements);
      std::vector<float> total(rows);
      testing::Poison(total);
      DcpCorrectParams p;
      p.out = own.data(), p.lse_all = s.lses.data(), p.lse_total = total.data();
      p.world_size = s.parts, p.rank = rank;
      p.num_tokens = s.tokens, p.num_heads = s.heads, p.dim = s.dim;
      ASSERT_TRUE(cpu::DcpCorrect(p).ok());
      for (size_t i = 0; i < row_elements; ++i) sum[i] += own[i];
      if (rank == 0) lse_total = total;
      EXPECT_EQ(0, std::memcmp(total.data(), lse_total.data(), rows * sizeof(float)))
          << "ranks disagree on lse_total";
    }
    EXPECT_TRUE(testing::AllClose("DcpCorrect sum", sum, s.want_out, testing::kF32Tolerance));
    EXPECT_TRUE(
        testing::LseClose("DcpCorrect lse_total", lse_total, s.want_lse, testing::kF32Tolerance));
  }
  // 3. a2a: all partials combined at once.
  {
    std::vector<float> out(row_elements), lse(rows);
    testing::Poison(out);
    testing::Poison(lse);
    DcpCombineParams p;
    p.outs = s.outs.data(), p.lses = s.lses.data(), p.out = out.data(), p.lse = lse.data();
    p.world_size = s.parts, p.num_tokens = s.tokens, p.num_heads = s.heads, p.dim = s.dim;
    ASSERT_TRUE(cpu::DcpCombine(p).ok());
    EXPECT_TRUE(testing::AllClose("DcpCombine out", out, s.want_out, testing::kF32Tolerance));
    EXPECT_TRUE(testing::LseClose("DcpCombine lse", lse, s.want_lse, testing::kF32Tolerance));
  }
}

TEST(MergeCpuTest, AnySplitMergesToTheWhole) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  for (int iteration = 0; iteration < 60; ++iteration) {
    const Split split = MakeSplit(rng, rng.Int(2, 8), 1.0);
    SCOPED_TRACE(Describe(split));
    CheckMergesOfSplit(split);
    if (::testing::Test::HasFailure()) return;
  }
}

// Logits of tens: partial LSEs around +-80, where e^lse alone overflows fp32.
TEST(MergeCpuTest, HugeLseValues) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  for (int iteration = 0; iteration < 6; ++iteration) {
    Split split = MakeSplit(rng, rng.Int(2, 8), 30.0);
    SCOPED_TRACE(Describe(split));
    CheckMergesOfSplit(split);
    if (::testing::Test::HasFailure()) return;
  }
}

// Partials with one LSE far from zero (several parts tie, others are empty): the merge is the
// mean of the tied parts, with LSE + log(count), at any offset. Past ~1e7, fp32 cannot hold
// offset + log(count), so a weight taken as e^(lse - merged lse) would be 1 for every part and
// the merge their sum (DcpCorrect and DcpCombine did that before they took weights relative to
// the maximum). MergeStates: a single merge of two parts here, or a fold near zero.
TEST(MergeCpuTest, TiedLsesFarFromZero) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  for (float offset : {-1e19f, -3e7f, 0.5f, 4e4f, 1e6f, 1e19f}) {
    Split s;
    s.parts = rng.Int(2, 8), s.tokens = 2, s.heads = 3, s.dim = rng.Int(1, 40);
    const int rows = s.tokens * s.heads;
    s.outs.resize(static_cast<size_t>(s.parts) * rows * s.dim);
    for (float& x : s.outs) x = static_cast<float>(rng.Normal());
    s.lses.assign(static_cast<size_t>(s.parts) * rows, offset);
    s.want_out.assign(static_cast<size_t>(rows) * s.dim, 0.0);
    s.want_lse.assign(rows, 0.0);
    for (int row = 0; row < rows; ++row) {
      int count = 0;
      for (int part = 0; part < s.parts; ++part) {
        if (part > 0 && rng.Int(0, 2) == 0) {  // an empty part: its out must not be read
          s.lses[static_cast<size_t>(part) * rows + row] = -kInfF;
          for (int e = 0; e < s.dim; ++e)
            s.outs[(static_cast<size_t>(part) * rows + row) * s.dim + e] = kNan;
          continue;
        }
        ++count;
        for (int e = 0; e < s.dim; ++e) {
          s.want_out[static_cast<size_t>(row) * s.dim + e] +=
              s.outs[(static_cast<size_t>(part) * rows + row) * s.dim + e];
        }
      }
      for (int e = 0; e < s.dim; ++e) s.want_out[static_cast<size_t>(row) * s.dim + e] /= count;
      s.want_lse[row] = double(offset) + std::log(double(count));
    }
    SCOPED_TRACE(Describe(s) + absl::StrFormat(" lse=%g", offset));
    CheckMergesOfSplit(s, /*fold=*/s.parts == 2 || std::abs(offset) < 100.0f);
    if (::testing::Test::HasFailure()) return;
  }
}

// NaN and +inf LSEs count as empty partials (whatever their out holds); all empty -> (0, -inf).
TEST(MergeCpuTest, NonFiniteLsesAreEmptyPartials) {
  const int dim = 3;
  // Row 0: a real partial and a NaN one (out NaN too); row 1: +inf and -inf; row 2: all -inf
  // with NaN outs; row 3: real and real.
  std::vector<float> out_a = {1, 2, 3, kNan, kNan, kNan, kNan, kNan, kNan, 1, 1, 1};
  std::vector<float> lse_a = {0.5f, kInfF, -kInfF, 0.0f};
  std::vector<float> out_b = {kNan, kNan, kNan, 4, 5, 6, kNan, 0, 0, 3, 3, 3};
  std::vector<float> lse_b = {kNan, -kInfF, -kInfF, 0.0f};
  std::vector<float> out(12), lse(4);
  testing::Poison(out);
  MergeStatesParams p;
  p.out_a = out_a.data(), p.lse_a = lse_a.data(), p.out_b = out_b.data(), p.lse_b = lse_b.data();
  p.out = out.data(), p.lse = lse.data();
  p.num_tokens = 4, p.num_heads = 1, p.dim = dim;
  ASSERT_TRUE(cpu::MergeStates(p).ok());
  const std::vector<float> want_out = {1, 2, 3, 0, 0, 0, 0, 0, 0, 2, 2, 2};
  for (int i = 0; i < 12; ++i) EXPECT_FLOAT_EQ(out[i], want_out[i]) << i;
  EXPECT_FLOAT_EQ(lse[0], 0.5f);
  EXPECT_EQ(lse[1], -kInfF);
  EXPECT_EQ(lse[2], -kInfF);
  EXPECT_FLOAT_EQ(lse[3], std::log(2.0f));

  // The same rows as W = 2 partials through both DCP combine forms.
  std::vector<float> outs = out_a, lses = lse_a;
  outs.insert(outs.end(), out_b.begin(), out_b.end());
  lses.insert(lses.end(), lse_b.begin(), lse_b.end());
  std::vector<float> combined(12), combined_lse(4);
  testing::Poison(combined);
  DcpCombineParams combine;
  combine.outs = outs.data(), combine.lses = lses.data();
  combine.out = combined.data(), combine.lse = combined_lse.data();
  combine.world_size = 2, combine.num_tokens = 4, combine.num_heads = 1, combine.dim = dim;
  ASSERT_TRUE(cpu::DcpCombine(combine).ok());
  for (int i = 0; i < 12; ++i) EXPECT_FLOAT_EQ(combined[i], want_out[i]) << i;
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(combined_lse[i], lse[i]) << i;

  std::vector<float> sum(12, 0.0f), total(4);
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<float> own(outs.begin() + rank * 12, outs.begin() + (rank + 1) * 12);
    DcpCorrectParams correct;
    correct.out = own.data(), correct.lse_all = lses.data(), correct.lse_total = total.data();
    correct.world_size = 2, correct.rank = rank;
    correct.num_tokens = 4, correct.num_heads = 1, correct.dim = dim;
    ASSERT_TRUE(cpu::DcpCorrect(correct).ok());
    for (int i = 0; i < 12; ++i) sum[i] += own[i];
  }
  for (int i = 0; i < 12; ++i) EXPECT_FLOAT_EQ(sum[i], want_out[i]) << i;
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(total[i], lse[i]) << i;
}

// Enough rows to take the threaded path.
TEST(MergeCpuTest, LargeGridThreaded) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  const int tokens = 64, heads = 16, dim = 512;
  const size_t size = static_cast<size_t>(tokens) * heads * dim, rows = tokens * heads;
  std::vector<float> a(size), b(size), lse_a(rows), lse_b(rows), out(size), lse(rows);
  for (float& x : a) x = static_cast<float>(rng.Normal());
  for (float& x : b) x = static_cast<float>(rng.Normal());
  for (float& x : lse_a) x = static_cast<float>(rng.Uniform(-5, 5));
  for (float& x : lse_b) x = static_cast<float>(rng.Uniform(-5, 5));
  testing::Poison(out);
  testing::Poison(lse);
  MergeStatesParams p;
  p.out_a = a.data(), p.lse_a = lse_a.data(), p.out_b = b.data(), p.lse_b = lse_b.data();
  p.out = out.data(), p.lse = lse.data();
  p.num_tokens = tokens, p.num_heads = heads, p.dim = dim;
  ASSERT_TRUE(cpu::MergeStates(p).ok());
  std::vector<double> want_out(size), want_lse(rows);
  for (size_t r = 0; r < rows; ++r) {
    const double la = lse_a[r], lb = lse_b[r], m = std::max(la, lb);
    want_lse[r] = m + std::log(std::exp(la - m) + std::exp(lb - m));
    for (int e = 0; e < dim; ++e) {
      want_out[r * dim + e] =
          std::exp(la - want_lse[r]) * a[r * dim + e] + std::exp(lb - want_lse[r]) * b[r * dim + e];
    }
  }
  EXPECT_TRUE(testing::AllClose("out", out, want_out, testing::kF32Tolerance));
  EXPECT_TRUE(testing::LseClose("lse", lse, want_lse, testing::kF32Tolerance));
}

TEST(MergeCpuTest, RejectsBadParams) {
  std::vector<float> x(8), l(2);
  MergeStatesParams merge;
  merge.out_a = merge.out_b = x.data(), merge.lse_a = merge.lse_b = l.data();
  merge.out = x.data(), merge.lse = l.data();
  merge.num_tokens = 1, merge.num_heads = 2, merge.dim = 4;
  ASSERT_TRUE(cpu::MergeStates(merge).ok());
  merge.lse_b = nullptr;
  EXPECT_NE(std::string(cpu::MergeStates(merge).message()).find("lse_b"), std::string::npos);
  merge.lse_b = l.data(), merge.dim = 0;
  EXPECT_NE(std::string(cpu::MergeStates(merge).message()).find("dim"), std::string::npos);

  DcpCorrectParams correct;
  correct.out = x.data(), correct.lse_all = l.data();
  correct.world_size = 2, correct.rank = 2, correct.num_tokens = 1, correct.num_heads = 1;
  correct.dim = 4;
  EXPECT_NE(std::string(cpu::DcpCorrect(correct).message()).find("rank 2"), std::string::npos);

  DcpCombineParams combine;
  combine.outs = x.data(), combine.lses = l.data(), combine.out = nullptr;
  combine.world_size = 2, combine.num_tokens = 1, combine.num_heads = 1, combine.dim = 4;
  EXPECT_NE(std::string(cpu::DcpCombine(combine).message()).find("out is null"), std::string::npos);
  combine.out = x.data(), combine.world_size = 0;
  EXPECT_NE(std::string(cpu::DcpCombine(combine).message()).find("world_size"), std::string::npos);
}

}  // namespace
}  // namespace dcp
