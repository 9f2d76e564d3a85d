// The GEMM tuner (attention/cuda/gemm_tuner.h) through cuda::Gemm, against float64 loops
// written here: the dense up-projection's layout (A shared by the heads, B stored [n, k] per
// head, the heads interleaved in C with a gap before each head's columns, C starting 16 bytes
// past an allocation), BF16 and F32 C, several m of one shape class, alpha / beta. The
// cuBLASLt choice is forced (Options::force_lt) so that its path runs whatever the timing says.
// A class is also its operands' alignment: C tuned 16 elements in runs there, not 8 in.
// C starts poisoned (NaN): every element of the GEMM must be written and finite, every gap
// element untouched. Also where the tuner must not apply: m below kMinRows, a class not tuned,
// a pointer off 16 bytes, the tuner disabled; those run cuBLAS's default with the same result.
#include "attention/cuda/gemm_tuner.h"

#include <cublas_v2.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention/cuda/gemm_cublas.h"
#include "gtest/gtest.h"
#include "tests/attention/cuda/cublas_test.h"
#include "tests/common/gpu_test_util.h"

namespace dcp::testing {
namespace {

// The up-projection's shape, scaled down: per head [m, k] x [k, n], A rows of width k + 64
// shared by the heads, B[h] stored [n, k], C[t][h] = [gap | n columns] with a row of
// heads * (gap + n).
struct Shape {
  int n = 96, k = 128, heads = 3, gap = 16;
  int64_t lda() const { return k + 64; }
  int64_t stride_c() const { return gap + n; }
  int64_t ldc() const { return int64_t(heads) * stride_c(); }
};

template <typename Out>
struct Operands {
  std::vector<bf16> a, b;
  DeviceArray<bf16> da, db;
  DeviceArray<Out> dc;
};

template <typename Out>
GemmParams Params(const Shape& s, int m, const bf16* a, const bf16* b, Out* c_base,
                  int64_t c_offset) {
  GemmParams p;
  p.a = a;
  p.b = b;
  // For Tune (no buffers): the bare offset, the address whose alignment the tuner reads.
  p.c = c_base == nullptr ? reinterpret_cast<void*>(uintptr_t(c_offset) * sizeof(Out))
                          : static_cast<void*>(c_base + c_offset);
  p.a_dtype = p.b_dtype = DType::kBF16;
  p.c_dtype = dtype_of<Out>();
  p.trans_b = true;
  p.m = m;
  p.n = s.n;
  p.k = s.k;
  p.batch = s.heads;
  p.lda = s.lda();
  p.ldb = s.k;
  p.ldc = s.ldc();
  p.stride_a = 0;
  p.stride_b = int64_t(s.n) * s.k;
  p.stride_c = s.stride_c();
  return p;
}

template <typename T>
double Load(T v) {
  if constexpr (std::is_same_v<T, bf16>) return bf16_to_float(v);
  else return v;
}

class GemmTunerTest : public CublasTest {
 protected:
  void SetUp() override {
    CublasTest::SetUp();
    if (IsSkipped() || HasFailure()) return;
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    CublasTest::TearDown();
  }

  // Runs C = alpha A B + beta C0 through cuda::Gemm with `tuner` for m rows, C at `c_offset`
  // elements into its buffer (the gap elements poisoned, the GEMM's own from c0 or NaN), and
  // checks against float64; returns the kernel name Gemm reported beforehand.
  template <typename Out>
  std::string RunAndCheck(std::mt19937_64& rng, const Shape& s, int m, cuda::GemmTuner* tuner,
                          int64_t c_offset, float alpha = 1.f, float beta = 0.f) {
    SCOPED_TRACE("m " + std::to_string(m) + (std::is_same_v<Out, bf16> ? " bf16" : " f32") +
                 " C offset " + std::to_string(c_offset));
    const auto a = ToBf16(RandomFloats(rng, size_t(m) * s.lda()));
    const auto b = ToBf16(RandomFloats(rng, size_t(s.heads) * s.n * s.k));
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const size_t c_count = size_t(c_offset) + size_t(m) * s.ldc();
    std::vector<float> c0f(c_count, nan);
    if (beta != 0.f) {  // the GEMM's elements get values to accumulate onto
      const auto values = RandomFloats(rng, c_count);
      for (int i = 0; i < m; ++i) {
        for (int h = 0; h < s.heads; ++h) {
          for (int j = 0; j < s.n; ++j) {
            const size_t at = c_offset + i * s.ldc() + h * s.stride_c() + j;
            c0f[at] = values[at];
          }
        }
      }
    }
    std::vector<Out> c0;
    if constexpr (std::is_same_v<Out, bf16>) c0 = ToBf16(c0f);
    else c0 = c0f;
    DeviceArray<bf16> da(a), db(b);
    DeviceArray<Out> dc(c0);
    GemmParams p = Params<Out>(s, m, da.get(), db.get(), dc.get(), c_offset);
    p.alpha = alpha;
    p.beta = beta;
    const std::string kernel = cuda::GemmKernelName(p, tuner);
    const absl::Status status = cuda::Gemm(handle_, p, stream_, tuner);
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    const auto c = dc.Download();
    double diff = 0, norm = 0;
    int bad = 0;
    for (int i = 0; i < m; ++i) {
      for (int h = 0; h < s.heads; ++h) {
        for (int j = 0; j < s.n; ++j) {
          double sum = 0;
          for (int x = 0; x < s.k; ++x) {
            sum += double(bf16_to_float(a[size_t(i) * s.lda() + x])) *
                   double(bf16_to_float(b[(size_t(h) * s.n + j) * s.k + x]));
          }
          const size_t at = c_offset + i * s.ldc() + h * s.stride_c() + j;
          const double want = alpha * sum + (beta != 0.f ? beta * Load(c0[at]) : 0.0);
          const double got = Load(c[at]);
          if (!std::isfinite(got)) ++bad;
          diff += (got - want) * (got - want);
          norm += want * want;
        }
        for (int j = 0; j < s.gap; ++j) {  // the gap before head h + 1 (or the row's end)
          const size_t at = c_offset + i * s.ldc() + h * s.stride_c() + s.n + j;
          if (!std::isnan(Load(c[at]))) ++bad;
        }
      }
    }
    for (int64_t x = 0; x < c_offset; ++x) {
      if (!std::isnan(Load(c[x]))) ++bad;
    }
    EXPECT_EQ(bad, 0) << "non-finite GEMM elements or written gap elements";
    const double tolerance = std::is_same_v<Out, bf16> ? 1e-2 : 1e-4;
    EXPECT_LT(std::sqrt(diff / norm), tolerance);
    return kernel;
  }

  cudaStream_t stream_ = nullptr;
};

TEST_F(GemmTunerTest, ChosenAlgorithmMatchesFloat64OnTheUpProjectionLayout) {
  std::mt19937_64 rng(TestSeed());
  cuda::GemmTuner tuner(handle_, {.enabled = true, .force_lt = true});
  const Shape s;
  // C 16 elements in: bf16 32 bytes, f32 64 bytes past the allocation (16-byte aligned).
  for (const bool bf16_out : {true, false}) {
    const GemmParams shape = bf16_out ? Params<bf16>(s, 400, nullptr, nullptr, nullptr, 16)
                                      : Params<float>(s, 400, nullptr, nullptr, nullptr, 16);
    ASSERT_TRUE(tuner.Tune(shape, stream_).ok());
  }
  EXPECT_EQ(tuner.tuned_classes(), 2);
  ASSERT_EQ(tuner.lt_classes(), 2) << "cuBLASLt offered no candidate for the shape";
  // Every m of the class (257-512 rows), the chosen algorithm checked per m.
  for (const int m : {400, 257, 512, 333}) {
    EXPECT_EQ(RunAndCheck<bf16>(rng, s, m, &tuner, 16), "cublaslt");
    EXPECT_EQ(RunAndCheck<float>(rng, s, m, &tuner, 16), "cublaslt");
  }
  EXPECT_EQ(RunAndCheck<float>(rng, s, 300, &tuner, 16, 0.5f, 0.75f), "cublaslt");
  EXPECT_EQ(tuner.tuned_classes(), 2);  // running tunes nothing
}

TEST_F(GemmTunerTest, DefaultWhereTheTunerDoesNotApply) {
  std::mt19937_64 rng(TestSeed());
  cuda::GemmTuner tuner(handle_, {.enabled = true, .force_lt = true});
  const Shape s;
  ASSERT_TRUE(tuner.Tune(Params<bf16>(s, 300, nullptr, nullptr, nullptr, 16), stream_).ok());
  ASSERT_EQ(tuner.lt_classes(), 1);
  // Below kMinRows: neither tuned nor taken.
  ASSERT_TRUE(tuner.Tune(Params<bf16>(s, 100, nullptr, nullptr, nullptr, 16), stream_).ok());
  EXPECT_EQ(tuner.tuned_classes(), 1);
  EXPECT_EQ(RunAndCheck<bf16>(rng, s, 100, &tuner, 16), "cublas");
  // Another class (m 1024, not tuned) and another dtype of C.
  EXPECT_EQ(RunAndCheck<bf16>(rng, s, 1000, &tuner, 16), "cublas");
  EXPECT_EQ(RunAndCheck<float>(rng, s, 300, &tuner, 16), "cublas");
  // C one element (2 bytes) off 16 bytes: below what any class is tuned at.
  EXPECT_EQ(RunAndCheck<bf16>(rng, s, 300, &tuner, 17), "cublas");
  ASSERT_TRUE(tuner.Tune(Params<bf16>(s, 300, nullptr, nullptr, nullptr, 17), stream_).ok());
  EXPECT_EQ(tuner.tuned_classes(), 1);
  // C 8 elements in (16 bytes): another alignment class (32 bytes tuned), not tuned.
  EXPECT_EQ(RunAndCheck<bf16>(rng, s, 300, &tuner, 8), "cublas");
  // The tuned class itself still takes it.
  EXPECT_EQ(RunAndCheck<bf16>(rng, s, 300, &tuner, 16), "cublaslt");
  // Disabled: Tune does nothing.
  cuda::GemmTuner off(handle_, {.enabled = false});
  ASSERT_TRUE(off.Tune(Params<bf16>(s, 300, nullptr, nullptr, nullptr, 16), stream_).ok());
  EXPECT_EQ(off.tuned_classes(), 0);
  EXPECT_EQ(RunAndCheck<bf16>(rng, s, 300, &off, 16), "cublas");
}

TEST_F(GemmTunerTest, DoesNotTuneWhileTheStreamIsCaptured) {
  cuda::GemmTuner tuner(handle_, {.enabled = true, .force_lt = true});
  const Shape s;
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status status = tuner.Tune(Params<bf16>(s, 300, nullptr, nullptr, nullptr, 16),
                                         stream_);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  if (graph != nullptr) cudaGraphDestroy(graph);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(tuner.tuned_classes(), 0);
}

}  // namespace
}  // namespace dcp::testing
