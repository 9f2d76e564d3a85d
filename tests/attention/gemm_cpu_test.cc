// cpu::Gemm against a naive float64 product of the stored values: random shapes, transposes,
// strides (batch stride 0 included), every mix of F32/BF16 operands, alpha/beta.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_format.h"
#include "attention/cpu/attention_cpu.h"
#include "tests/attention/attention_test_util.h"

namespace dcp {
namespace {

using testing::FreshSeed;
using testing::Rng;
using testing::Stored;

struct GemmCase {
  int m, n, k, batch;
  bool trans_a, trans_b;
  DType a_dtype, b_dtype, c_dtype;
  int64_t lda, ldb, ldc;
  int64_t stride_a, stride_b, stride_c;
  float alpha, beta;
};

GemmCase RandomCase(Rng& rng, int max_mn, int max_k, int max_batch, int min_m = 1) {
  GemmCase c{};
  c.m = rng.Int(min_m, std::max(min_m, max_mn)), c.n = rng.Int(1, max_mn), c.k = rng.Int(1, max_k);
  c.batch = rng.Int(1, max_batch);
  c.trans_a = rng.Bool(), c.trans_b = rng.Bool();
  c.a_dtype = testing::RandomFloatDType(rng);
  c.b_dtype = testing::RandomFloatDType(rng);
  c.c_dtype = testing::RandomFloatDType(rng);
  c.lda = (c.trans_a ? c.m : c.k) + rng.Int(0, 3);
  c.ldb = (c.trans_b ? c.k : c.n) + rng.Int(0, 3);
  c.ldc = c.n + rng.Int(0, 3);
  const int64_t rows_a = c.trans_a ? c.k : c.m, rows_b = c.trans_b ? c.n : c.k;
  c.stride_a = rng.Int(0, 3) == 0 ? 0 : rows_a * c.lda + rng.Int(0, 5);
  c.stride_b = rng.Int(0, 3) == 0 ? 0 : rows_b * c.ldb + rng.Int(0, 5);
  c.stride_c = int64_t{c.m} * c.ldc + rng.Int(0, 5);
  c.alpha = rng.Bool() ? 1.0f : static_cast<float>(rng.Uniform(-2, 2));
  c.beta = rng.Bool() ? 0.0f : static_cast<float>(rng.Uniform(-2, 2));
  return c;
}

// Runs one case and checks every element of C, padding included (untouched).
void CheckGemm(const GemmCase& g, Rng& rng) {
  const int64_t rows_a = g.trans_a ? g.k : g.m, rows_b = g.trans_b ? g.n : g.k;
  Stored a = testing::RandomStored(rng, g.a_dtype, (g.batch - 1) * g.stride_a + rows_a * g.lda);
  Stored b = testing::RandomStored(rng, g.b_dtype, (g.batch - 1) * g.stride_b + rows_b * g.ldb);
  const size_t c_size = (g.batch - 1) * g.stride_c + int64_t{g.m} * g.ldc;
  // beta == 0: C starts as NaN everywhere, which must neither be read nor survive in C.
  Stored c(g.c_dtype, c_size);
  std::vector<bool> inside(c_size, false);
  for (size_t i = 0; i < c_size; ++i) c.Set(i, g.beta == 0 ? std::nan("") : rng.Normal());
  std::vector<double> want = c.exact;  // padding keeps its value
  for (int bt = 0; bt < g.batch; ++bt) {
    for (int i = 0; i < g.m; ++i) {
      for (int j = 0; j < g.n; ++j) {
        double sum = 0.0;
        for (int p = 0; p < g.k; ++p) {
          const double av = a.exact[bt * g.stride_a + (g.trans_a ? p * g.lda + i : i * g.lda + p)];
          const double bv = b.exact[bt * g.stride_b + (g.trans_b ? j * g.ldb + p : p * g.ldb + j)];
          sum += av * bv;
        }
        const size_t index = bt * g.stride_c + i * g.ldc + j;
        inside[index] = true;
        want[index] = g.alpha * sum + (g.beta == 0 ? 0.0 : g.beta * c.exact[index]);
      }
    }
  }
  GemmParams p;
  p.a = a.data(), p.b = b.data(), p.c = c.data();
  p.a_dtype = g.a_dtype, p.b_dtype = g.b_dtype, p.c_dtype = g.c_dtype;
  p.trans_a = g.trans_a, p.trans_b = g.trans_b;
  p.m = g.m, p.n = g.n, p.k = g.k, p.batch = g.batch;
  p.lda = g.lda, p.ldb = g.ldb, p.ldc = g.ldc;
  p.stride_a = g.stride_a, p.stride_b = g.stride_b, p.stride_c = g.stride_c;
  p.alpha = g.alpha, p.beta = g.beta;
  ASSERT_TRUE(cpu::Gemm(p).ok());

  std::vector<double> got_inside, want_inside;
  for (size_t i = 0; i < c_size; ++i) {
    if (inside[i]) {
      got_inside.push_back(c.Get(i));
      want_inside.push_back(want[i]);
    } else if (g.beta == 0) {
      ASSERT_TRUE(std::isnan(c.Get(i))) << "padding element " << i << " was written";
    } else {
      ASSERT_EQ(c.Get(i), want[i]) << "padding element " << i << " was written";
    }
  }
  const double tol = g.c_dtype == DType::kBF16 ? testing::kBf16Tolerance : testing::kF32Tolerance;
  EXPECT_TRUE(testing::AllCloseBy(
      "C", [&](size_t i) { return got_inside[i]; }, want_inside, tol));
}

std::string Describe(const GemmCase& g) {
  return absl::StrFormat(
      "m=%d n=%d k=%d batch=%d trans_a=%d trans_b=%d dtypes=%s/%s/%s ld=%d/%d/%d "
      "strides=%d/%d/%d alpha=%g beta=%g",
      g.m, g.n, g.k, g.batch, g.trans_a, g.trans_b, dtype_name(g.a_dtype), dtype_name(g.b_dtype),
      dtype_name(g.c_dtype), g.lda, g.ldb, g.ldc, g.stride_a, g.stride_b, g.stride_c, g.alpha,
      g.beta);
}

TEST(GemmCpuTest, RandomSmallShapes) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  for (int iteration = 0; iteration < 60; ++iteration) {
    const GemmCase g = RandomCase(rng, 40, 80, 3);
    SCOPED_TRACE(Describe(g));
    CheckGemm(g, rng);
    if (::testing::Test::HasFailure()) return;
  }
}

// Sizes past the register tile and row block, large enough to take the threaded paths
// (batch-parallel with per-entry B, row-parallel with a shared B).
TEST(GemmCpuTest, RandomLargeShapesThreaded) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  for (int iteration = 0; iteration < 4; ++iteration) {
    const GemmCase g = RandomCase(rng, 230, 300, 4, /*min_m=*/97);  // > one 96-row block
    SCOPED_TRACE(Describe(g));
    CheckGemm(g, rng);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(GemmCpuTest, KZeroScalesC) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  GemmCase g = RandomCase(rng, 10, 1, 2);
  g.k = 0;
  g.beta = 0.5f;
  Stored c = testing::RandomStored(rng, DType::kF32, (g.batch - 1) * g.stride_c + g.m * g.ldc);
  GemmParams p;
  p.c = c.data(), p.m = g.m, p.n = g.n, p.k = 0, p.batch = g.batch;
  p.ldc = g.ldc, p.stride_c = g.stride_c, p.beta = g.beta;
  ASSERT_TRUE(cpu::Gemm(p).ok());
  for (int bt = 0; bt < g.batch; ++bt) {
    for (int i = 0; i < g.m; ++i) {
      for (int j = 0; j < g.n; ++j) {
        const size_t index = bt * g.stride_c + i * g.ldc + j;
        EXPECT_FLOAT_EQ(c.f32[index], 0.5f * static_cast<float>(c.exact[index]));
      }
    }
  }
}

// The side copy (GemmParams::side): its rows copied, nothing else of dst touched, also when the
// GEMM itself is empty; a short pitch is refused.
TEST(GemmCpuTest, SideCopy) {
  std::vector<float> a(16, 1.0f), b(16, 2.0f), c(16, -1.0f);
  std::vector<uint8_t> src(7 * 40), dst(7 * 100);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<uint8_t>(255 - i);
  for (int m : {4, 0}) {
    std::vector<uint8_t> out = dst;
    GemmParams p;
    p.a = a.data(), p.b = b.data(), p.c = c.data();
    p.m = m, p.n = p.k = 4;
    p.lda = p.ldb = p.ldc = 4;
    p.side.dst = out.data() + 1;
    p.side.src = src.data();
    p.side.dst_pitch = 100, p.side.src_pitch = 40, p.side.row_bytes = 33, p.side.rows = 7;
    ASSERT_TRUE(cpu::Gemm(p).ok());
    for (size_t i = 0; i < out.size(); ++i) {
      const int64_t row = int64_t(i) / 100, column = int64_t(i) % 100 - 1;
      const bool copied = column >= 0 && column < 33;
      EXPECT_EQ(out[i], copied ? src[row * 40 + column] : dst[i]) << "byte " << i << " m " << m;
    }
    p.side.src_pitch = 32;
    EXPECT_EQ(cpu::Gemm(p).code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_FLOAT_EQ(c[0], 8.0f);  // the m = 4 product: 4 x (1 x 2)
}

TEST(GemmCpuTest, RejectsBadParams) {
  std::vector<float> a(64, 1.0f), b(64, 1.0f), c(64);
  GemmParams good;
  good.a = a.data(), good.b = b.data(), good.c = c.data();
  good.m = good.n = good.k = 4;
  good.lda = good.ldb = good.ldc = 4;
  ASSERT_TRUE(cpu::Gemm(good).ok());
  auto expect_error = [&](GemmParams p, const std::string& needle) {
    const absl::Status status = cpu::Gemm(p);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(std::string(status.message()).find(needle), std::string::npos) << status.message();
  };
  GemmParams p = good;
  p.a = nullptr;
  expect_error(p, "a is null");
  p = good, p.b = nullptr;
  expect_error(p, "b is null");
  p = good, p.c = nullptr;
  expect_error(p, "c is null");
  p = good, p.a_dtype = DType::kI32;
  expect_error(p, "a_dtype");
  p = good, p.c_dtype = DType::kI32;
  expect_error(p, "c_dtype");
  p = good, p.m = -1;
  expect_error(p, "negative size");
  p = good, p.lda = 3;
  expect_error(p, "lda");
  p = good, p.trans_b = true, p.n = 8, p.ldb = 4, p.ldc = 8, p.m = 2;
  p.k = 5, p.lda = 5;
  expect_error(p, "ldb");
  p = good, p.ldc = 2;
  expect_error(p, "ldc");
  p = good, p.batch = 2, p.stride_c = 0;
  expect_error(p, "stride_c");
}

}  // namespace
}  // namespace dcp
