// LSE merge and both DCP combines on the GPU (attention/cuda/merge_states.h) against float64
// loops: random partials, -inf / NaN / +inf LSEs (treated as -inf), all-empty rows, in-place
// merge, and a rank's correction that a sum over ranks turns into the combined output.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "attention/cuda/merge_states.h"
#include "gtest/gtest.h"
#include "tests/common/gpu_test_util.h"

namespace dcp::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

double Clean(float lse) { return (std::isnan(lse) || lse == kInf) ? -INFINITY : double(lse); }

// Random LSEs with special values sprinkled in: -inf, NaN, +inf (all mean "no keys").
std::vector<float> RandomLse(std::mt19937_64& rng, size_t count) {
  std::uniform_real_distribution<float> value(-30.f, 30.f);
  std::uniform_int_distribution<int> kind(0, 9);
  std::vector<float> out(count);
  for (float& v : out) {
    const int k = kind(rng);
    v = k == 0 ? -kInf : k == 1 ? std::nanf("") : k == 2 ? kInf : value(rng);
  }
  return out;
}

// Combined (out, lse) of W partials in float64.
void Combine(const std::vector<const float*>& outs, const std::vector<float>& lses, int dim,
             std::vector<double>* out, double* lse) {
  double m = -INFINITY;
  for (float l : lses) m = std::max(m, Clean(l));
  out->assign(dim, 0.0);
  if (m == -INFINITY) {
    *lse = -INFINITY;
    return;
  }
  double sum = 0;
  for (float l : lses) sum += std::exp(Clean(l) - m);
  *lse = m + std::log(sum);
  for (size_t r = 0; r < outs.size(); ++r) {
    if (Clean(lses[r]) == -INFINITY) continue;
    const double w = std::exp(Clean(lses[r]) - *lse);
    for (int i = 0; i < dim; ++i) (*out)[i] += w * outs[r][i];
  }
}

void ExpectRow(const float* got, float got_lse, const std::vector<double>& want, double want_lse,
               int dim, const char* what, int64_t row, bool check_lse = true) {
  for (int i = 0; i < dim; ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << what << " row " << row;
  }
  if (!check_lse) return;
  if (want_lse == -INFINITY) {
    ASSERT_TRUE(std::isinf(got_lse) && got_lse < 0) << what << " row " << row;
  } else {
    ASSERT_NEAR(got_lse, want_lse, 1e-5 * (1 + std::abs(want_lse))) << what << " row " << row;
  }
}

class MergeStatesCudaTest : public GpuTest {};

TEST_F(MergeStatesCudaTest, MergeTwoPartialsAndInPlace) {
  std::mt19937_64 rng(TestSeed());
  const int tokens = 37, heads = 5, dim = 130;
  const size_t rows = size_t(tokens) * heads;
  const auto out_a = RandomFloats(rng, rows * dim), out_b = RandomFloats(rng, rows * dim);
  const auto lse_a = RandomLse(rng, rows), lse_b = RandomLse(rng, rows);
  DeviceArray<float> da(out_a), db(out_b), dla(lse_a), dlb(lse_b), dout(rows * dim), dlse(rows);
  dout.Poison();
  dlse.Poison();
  MergeStatesParams p{da.get(), dla.get(), db.get(), dlb.get(), dout.get(), dlse.get(),
                      tokens, heads, dim};
  ASSERT_TRUE(cuda::MergeStates(p, nullptr).ok());
  auto got = dout.Download();
  auto got_lse = dlse.Download();
  std::vector<double> want;
  double want_lse;
  for (size_t r = 0; r < rows; ++r) {
    Combine({&out_a[r * dim], &out_b[r * dim]}, {lse_a[r], lse_b[r]}, dim, &want, &want_lse);
    ExpectRow(&got[r * dim], got_lse[r], want, want_lse, dim, "merge", r);
  }
  // In place: out/lse alias a.
  p.out = da.get();
  p.lse = dla.get();
  ASSERT_TRUE(cuda::MergeStates(p, nullptr).ok());
  const auto in_place = da.Download();
  const auto in_place_lse = dla.Download();
  for (size_t i = 0; i < rows * dim; ++i) ASSERT_EQ(in_place[i], got[i]);
  for (size_t r = 0; r < rows; ++r) {
    ASSERT_TRUE(in_place_lse[r] == got_lse[r] || (std::isinf(got_lse[r]) && std::isinf(in_place_lse[r])));
  }
}

TEST_F(MergeStatesCudaTest, CombineOfRanksAndCorrectionSum) {
  std::mt19937_64 rng(TestSeed());
  const int world = 4, tokens = 9, heads = 6, dim = 512;
  const size_t rows = size_t(tokens) * heads;
  const auto outs = RandomFloats(rng, world * rows * dim);
  auto lses = RandomLse(rng, world * rows);
  for (int r = 0; r < world; ++r) lses[r * rows + 3] = -kInf;  // a row empty on every rank
  DeviceArray<float> douts(outs), dlses(lses), dout(rows * dim), dlse(rows);
  dout.Poison();
  dlse.Poison();
  ASSERT_TRUE(cuda::DcpCombine({douts.get(), dlses.get(), dout.get(), dlse.get(), world, tokens,
                                heads, dim},
                               nullptr)
                  .ok());
  const auto got = dout.Download();
  const auto got_lse = dlse.Download();
  std::vector<double> want;
  double want_lse;
  for (size_t r = 0; r < rows; ++r) {
    std::vector<const float*> parts;
    std::vector<float> part_lse;
    for (int w = 0; w < world; ++w) {
      parts.push_back(&outs[(w * rows + r) * dim]);
      part_lse.push_back(lses[w * rows + r]);
    }
    Combine(parts, part_lse, dim, &want, &want_lse);
    ExpectRow(&got[r * dim], got_lse[r], want, want_lse, dim, "combine", r);
  }

  // ag_rs form: each rank scales its own partial; the sum over ranks is the combine.
  std::vector<double> sum(rows * dim, 0.0);
  for (int rank = 0; rank < world; ++rank) {
    std::vector<float> mine(outs.begin() + rank * rows * dim,
                            outs.begin() + (rank + 1) * rows * dim);
    DeviceArray<float> dmine(mine), dtotal(rows);
    dtotal.Poison();
    ASSERT_TRUE(cuda::DcpCorrect({dmine.get(), dlses.get(), dtotal.get(), world, rank, tokens,
                                  heads, dim},
                                 nullptr)
                    .ok());
    const auto scaled = dmine.Download();
    const auto total = dtotal.Download();
    for (size_t i = 0; i < rows * dim; ++i) {
      ASSERT_TRUE(std::isfinite(scaled[i]));
      sum[i] += scaled[i];
    }
    for (size_t r = 0; r < rows; ++r) {
      ASSERT_TRUE(total[r] == got_lse[r] ||
                  std::abs(total[r] - got_lse[r]) <= 1e-5 * (1 + std::abs(got_lse[r])) ||
                  (std::isinf(total[r]) && std::isinf(got_lse[r])));
    }
  }
  for (size_t i = 0; i < rows * dim; ++i) {
    ASSERT_NEAR(sum[i], got[i], 1e-5 * (1 + std::abs(got[i]))) << "element " << i;
  }
}

// Ranks whose partial LSEs tie far from zero (some ranks empty): both combines give the mean of
// the tied partials (and LSE + log(count)) at any offset. Past ~1e7 fp32 cannot hold
// offset + log(count): weights taken relative to the merged LSE would sum the partials instead.
TEST_F(MergeStatesCudaTest, TiedLsesFarFromZero) {
  std::mt19937_64 rng(TestSeed());
  const int world = 4, tokens = 3, heads = 4, dim = 64;
  const size_t rows = size_t(tokens) * heads;
  for (float offset : {-1e19f, -3e7f, 0.5f, 1e6f, 1e19f}) {
    SCOPED_TRACE(offset);
    auto outs = RandomFloats(rng, world * rows * dim);
    std::vector<float> lses(world * rows, offset);
    std::vector<double> want(rows * dim, 0.0);
    std::vector<int> count(rows, 0);
    for (size_t r = 0; r < rows; ++r) {
      for (int w = 0; w < world; ++w) {
        if (w > 0 && (r + w) % 3 == 0) {  // an empty rank: its values must not be read
          lses[w * rows + r] = -kInf;
          for (int i = 0; i < dim; ++i) outs[(w * rows + r) * dim + i] = std::nanf("");
          continue;
        }
        ++count[r];
        for (int i = 0; i < dim; ++i) want[r * dim + i] += outs[(w * rows + r) * dim + i];
      }
      for (int i = 0; i < dim; ++i) want[r * dim + i] /= count[r];
    }
    DeviceArray<float> douts(outs), dlses(lses), dout(rows * dim), dlse(rows);
    dout.Poison();
    ASSERT_TRUE(
        cuda::DcpCombine(
            {douts.get(), dlses.get(), dout.get(), dlse.get(), world, tokens, heads, dim}, nullptr)
            .ok());
    const auto got = dout.Download();
    const auto got_lse = dlse.Download();
    std::vector<double> sum(rows * dim, 0.0);
    for (int rank = 0; rank < world; ++rank) {
      std::vector<float> mine(outs.begin() + rank * rows * dim,
                              outs.begin() + (rank + 1) * rows * dim);
      DeviceArray<float> dmine(mine);
      ASSERT_TRUE(cuda::DcpCorrect(
                      {dmine.get(), dlses.get(), nullptr, world, rank, tokens, heads, dim}, nullptr)
                      .ok());
      const auto scaled = dmine.Download();
      for (size_t i = 0; i < rows * dim; ++i) sum[i] += scaled[i];
    }
    for (size_t r = 0; r < rows; ++r) {
      const double want_lse = double(offset) + std::log(double(count[r]));
      ASSERT_NEAR(got_lse[r], want_lse, 1e-6 * (1 + std::abs(want_lse))) << "row " << r;
      for (int i = 0; i < dim; ++i) {
        const double w = want[r * dim + i];
        ASSERT_NEAR(got[r * dim + i], w, 1e-5 * (1 + std::abs(w))) << "combine row " << r;
        ASSERT_NEAR(sum[r * dim + i], w, 1e-5 * (1 + std::abs(w))) << "correct row " << r;
      }
    }
  }
}

// The sparse MQA split merge (MergeSplits) at split counts around its unroll of 8 and up to
// the maximum, into strided outputs (float4 stores, and scalar stores for an odd stride):
// -inf / NaN / +inf LSEs select their partial out (its values are NaN here and must not leak),
// rows of only empty partials end 0 / -inf, the gaps between strided rows stay untouched.
TEST_F(MergeStatesCudaTest, MergeSplitsEverySplitCountAndStride) {
  std::mt19937_64 rng(TestSeed());
  const int tokens = 3, heads = 5;
  for (int dim : {512, 132, 4}) {
    for (int splits : {1, 2, 7, 8, 9, 17, 33, 64}) {
      for (int extra : {4, 1}) {  // out_head_stride = dim + extra: float4 stores, then scalar
        const int64_t rows = int64_t(tokens) * heads;
        auto parts = RandomFloats(rng, size_t(splits) * rows * dim);
        auto part_lse = RandomLse(rng, size_t(splits) * rows);
        // Row 0 of every split empty: 0 / -inf expected.
        for (int s = 0; s < splits; ++s) part_lse[size_t(s) * rows] = -kInf;
        for (int64_t i = 0; i < int64_t(splits) * rows; ++i) {
          if (Clean(part_lse[i]) == -INFINITY) {
            for (int d = 0; d < dim; ++d) parts[i * dim + d] = std::nanf("");
          }
        }
        const int64_t head_stride = dim + extra, token_stride = heads * head_stride + 4;
        const int64_t lse_stride = heads + 3;
        DeviceArray<float> dparts(parts), dlse_in(part_lse), dout(size_t(tokens) * token_stride),
            dlse(size_t(tokens) * lse_stride);
        dout.Poison();
        dlse.Poison();
        const auto before = dout.Download();
        const auto before_lse = dlse.Download();
        ASSERT_TRUE(cuda::MergeSplits(dparts.get(), dlse_in.get(), splits, tokens, heads, dim,
                                      dout.get(), token_stride, head_stride, dlse.get(), lse_stride,
                                      nullptr)
                        .ok());
        const auto got = dout.Download();
        const auto got_lse = dlse.Download();
        std::vector<double> want;
        double want_lse;
        for (int64_t row = 0; row < rows; ++row) {
          std::vector<const float*> outs;
          std::vector<float> lses;
          for (int s = 0; s < splits; ++s) {
            outs.push_back(&parts[(s * rows + row) * dim]);
            lses.push_back(part_lse[s * rows + row]);
          }
          Combine(outs, lses, dim, &want, &want_lse);
          const int64_t token = row / heads, head = row % heads;
          SCOPED_TRACE(::testing::Message()
                       << "dim " << dim << " splits " << splits << " stride " << head_stride);
          ExpectRow(&got[token * token_stride + head * head_stride],
                    got_lse[token * lse_stride + head], want, want_lse, dim, "split merge", row);
          if (row == 0) ASSERT_TRUE(std::isinf(got_lse[0]) && got_lse[0] < 0);
        }
        for (int64_t token = 0; token < tokens; ++token) {
          for (int64_t i = heads * head_stride - extra; i < token_stride; ++i) {
            const int64_t at = token * token_stride + i;
            ASSERT_EQ(std::memcmp(&got[at], &before[at], 4), 0) << "gap written at " << at;
          }
          for (int64_t i = heads; i < lse_stride; ++i) {
            const int64_t at = token * lse_stride + i;
            ASSERT_EQ(std::memcmp(&got_lse[at], &before_lse[at], 4), 0) << "lse gap at " << at;
          }
        }
      }
    }
  }
}

TEST_F(MergeStatesCudaTest, EmptySizesAndBadRank) {
  EXPECT_TRUE(cuda::MergeStates(MergeStatesParams{}, nullptr).ok());
  DcpCorrectParams p;
  p.world_size = 2;
  p.rank = 2;
  EXPECT_EQ(cuda::DcpCorrect(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dcp::testing
