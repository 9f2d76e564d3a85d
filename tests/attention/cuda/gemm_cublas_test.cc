// The cuBLAS GEMM wrapper (attention/cuda/gemm_cublas.h) against float64 loops: every
// transpose combination, batches with a shared (stride 0) operand, bf16 and fp32 inputs, bf16
// and fp32 outputs, alpha/beta, padded leading dimensions, and the dtype errors.
#include <cublas_v2.h>

#include <cmath>
#include <random>
#include <vector>

#include "attention/cuda/gemm_cublas.h"
#include "gtest/gtest.h"
#include "tests/attention/cuda/cublas_test.h"
#include "tests/common/gpu_test_util.h"

namespace dcp::testing {
namespace {

class GemmCublasTest : public CublasTest {};

template <typename T>
std::vector<T> Store(const std::vector<float>& values) {
  if constexpr (std::is_same_v<T, bf16>) return ToBf16(values);
  else return values;
}
template <typename T>
double Load(T v) {
  if constexpr (std::is_same_v<T, bf16>) return bf16_to_float(v);
  else return v;
}

template <typename In, typename Out>
void RunCase(cublasHandle_t handle, std::mt19937_64& rng, bool trans_a, bool trans_b, int m,
             int n, int k, int batch, bool shared_b, float alpha, float beta) {
  const int64_t lda = (trans_a ? m : k) + 3, ldb = (trans_b ? k : n) + 5, ldc = n + 2;
  const int64_t a_rows = trans_a ? k : m, b_rows = trans_b ? n : k;
  const int64_t stride_a = a_rows * lda, stride_b = shared_b ? 0 : b_rows * ldb,
                stride_c = int64_t(m) * ldc;
  const auto a = Store<In>(RandomFloats(rng, size_t(stride_a) * batch));
  const auto b = Store<In>(RandomFloats(rng, size_t(b_rows * ldb) * (shared_b ? 1 : batch)));
  const auto c0 = Store<Out>(RandomFloats(rng, size_t(stride_c) * batch));
  DeviceArray<In> da(a), db(b);
  DeviceArray<Out> dc(c0);
  GemmParams p;
  p.a = da.get();
  p.b = db.get();
  p.c = dc.get();
  p.a_dtype = p.b_dtype = dtype_of<In>();
  p.c_dtype = dtype_of<Out>();
  p.trans_a = trans_a;
  p.trans_b = trans_b;
  p.m = m;
  p.n = n;
  p.k = k;
  p.batch = batch;
  p.lda = lda;
  p.ldb = ldb;
  p.ldc = ldc;
  p.stride_a = stride_a;
  p.stride_b = stride_b;
  p.stride_c = stride_c;
  p.alpha = alpha;
  p.beta = beta;
  const absl::Status status = cuda::Gemm(handle, p, nullptr);
  ASSERT_TRUE(status.ok()) << status;
  const auto c = dc.Download();
  const double tolerance = std::is_same_v<Out, bf16> ? 1e-2 : (std::is_same_v<In, bf16> ? 1e-4 : 1e-5);
  double diff = 0, norm = 0;
  for (int bi = 0; bi < batch; ++bi) {
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double sum = 0;
        for (int x = 0; x < k; ++x) {
          const double av = Load(a[bi * stride_a + (trans_a ? x * lda + i : i * lda + x)]);
          const double bv = Load(b[bi * stride_b + (trans_b ? j * ldb + x : x * ldb + j)]);
          sum += av * bv;
        }
        const size_t ci = bi * stride_c + i * ldc + j;
        const double want = alpha * sum + beta * Load(c0[ci]);
        diff += (Load(c[ci]) - want) * (Load(c[ci]) - want);
        norm += want * want;
      }
      // Padding columns of C untouched.
      for (int j = n; j < ldc; ++j) {
        ASSERT_EQ(Load(c[bi * stride_c + i * ldc + j]), Load(c0[bi * stride_c + i * ldc + j]));
      }
    }
  }
  // norm == 0 (k == 0, beta == 0: C must be all zeros): the absolute error then.
  EXPECT_LT(norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff), tolerance)
      << "trans_a " << trans_a << " trans_b " << trans_b << " m " << m << " n " << n << " k " << k;
}

TEST_F(GemmCublasTest, AllTransposesAndDtypes) {
  std::mt19937_64 rng(TestSeed());
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      RunCase<bf16, float>(handle_, rng, ta, tb, 33, 47, 70, 3, false, 1.f, 0.f);
      RunCase<bf16, bf16>(handle_, rng, ta, tb, 16, 20, 64, 2, true, 0.5f, 0.f);
      RunCase<float, float>(handle_, rng, ta, tb, 9, 13, 31, 2, true, 1.f, 0.5f);
    }
  }
  // k == 0: C = beta * C (beta 0 writes zeros without reading C).
  RunCase<bf16, float>(handle_, rng, false, false, 5, 6, 0, 2, false, 1.f, 0.5f);
  RunCase<bf16, float>(handle_, rng, true, false, 5, 6, 0, 1, false, 1.f, 0.f);
  // The up-projection shape: [T, R] kv_c times per-head w_uk^T, shared A across heads.
  RunCase<bf16, float>(handle_, rng, false, true, 64, 128, 512, 4, false, 1.f, 0.f);
}

TEST_F(GemmCublasTest, RejectsMixedDtypes) {
  GemmParams p;
  p.a_dtype = DType::kBF16;
  p.b_dtype = DType::kF32;
  EXPECT_EQ(cuda::Gemm(handle_, p, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dcp::testing
