// The small-M GEMM kernels (attention/cuda/gemm_small_m.h: the CUDA-core GemmSmallM and the
// tensor-core GemmSmallMTc), directly and through cuda::Gemm's dispatch, against float64 loops
// written here (the tensor-core kernel rounds an F32 A to bf16, its contract: the reference
// takes that A): both weight orientations (B stored [K, N] and
// [N, K]), BF16 and F32 outputs, M = 1, odd M, M at the crossover (kSmallMGemmMaxM), odd batch
// counts, N and K off the kernel's tiles, padded leading dimensions, heads interleaved in C (the
// absorb's layout: ldc = H * width, stride_c = width), a shared A (stride 0), A in F32,
// alpha / beta, and the side copy (16-byte and byte paths). Outputs start poisoned (NaN): every
// element in range must be written and finite, every element outside untouched.
#include "attention/cuda/gemm_small_m.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention/cuda/gemm_cublas.h"
#include "attention/cuda/topk_to_slots.h"
#include "gtest/gtest.h"
#include "tests/attention/cuda/cublas_test.h"
#include "tests/common/gpu_test_util.h"

namespace dcp::testing {
namespace {

struct Case {
  int m, n, k, batch;
  bool trans_b;  // B stored [n, k] (else [k, n])
  bool bf16_out;
  int64_t lda, ldb, ldc;  // as stored
  int64_t stride_a, stride_b, stride_c;
  float alpha = 1.f, beta = 0.f;
  bool through_dispatch = false;  // cuda::Gemm instead of GemmSmallM
  bool tensor_core = false;       // GemmSmallMTc instead of GemmSmallM
  bool a_f32 = false;             // A F32 (B stays BF16)
  std::string name;
};

// Elements spanned by `batch` strided matrices of `rows` rows of pitch `ld` and `cols` columns.
int64_t Span(int batch, int64_t stride, int rows, int64_t ld, int cols) {
  return int64_t(batch - 1) * stride + int64_t(rows - 1) * ld + cols;
}

class GemmSmallMTest : public CublasTest {
 protected:
  void Run(std::mt19937_64& rng, const Case& c) {
    SCOPED_TRACE(c.name + ": m " + std::to_string(c.m) + " n " + std::to_string(c.n) + " k " +
                 std::to_string(c.k) + " batch " + std::to_string(c.batch) + " trans_b " +
                 std::to_string(c.trans_b) + " bf16_out " + std::to_string(c.bf16_out));
    const int b_rows = c.trans_b ? c.n : c.k, b_cols = c.trans_b ? c.k : c.n;
    const int64_t a_count = Span(c.batch, c.stride_a, c.m, c.lda, c.k);
    const int64_t b_count = Span(c.batch, c.stride_b, b_rows, c.ldb, b_cols);
    const int64_t c_count = Span(c.batch, c.stride_c, c.m, c.ldc, c.n);
    // A as the kernel sees it (bf16-rounded unless F32 into the CUDA-core kernel), in float
    // and double; which kernel the dispatch takes is asked after the params are made.
    const std::vector<float> a_float = RandomFloats(rng, a_count);
    const std::vector<bf16> a_bf16 = ToBf16(a_float);
    std::vector<double> a;
    const std::vector<bf16> b = ToBf16(RandomFloats(rng, b_count, -0.1f, 0.1f));
    // C starts NaN (beta == 0: must not be read) or random (beta != 0: it is read).
    std::vector<float> c0_float = RandomFloats(rng, c_count);
    if (c.beta == 0.f) c0_float.assign(c_count, std::nanf(""));
    DeviceArray<bf16> da(c.a_f32 ? std::vector<bf16>() : a_bf16), db(b);
    DeviceArray<float> da_f32(c.a_f32 ? a_float : std::vector<float>());
    DeviceArray<float> dc_f32;
    DeviceArray<bf16> dc_bf16;
    std::vector<bf16> c0_bf16 = ToBf16(c0_float);
    if (c.bf16_out) {
      dc_bf16 = DeviceArray<bf16>(c0_bf16);
    } else {
      dc_f32 = DeviceArray<float>(c0_float);
    }
    GemmParams p;
    p.a = c.a_f32 ? static_cast<const void*>(da_f32.get()) : static_cast<const void*>(da.get());
    p.b = db.get();
    p.c = c.bf16_out ? static_cast<void*>(dc_bf16.get()) : static_cast<void*>(dc_f32.get());
    p.a_dtype = c.a_f32 ? DType::kF32 : DType::kBF16;
    p.b_dtype = DType::kBF16;
    p.c_dtype = c.bf16_out ? DType::kBF16 : DType::kF32;
    p.trans_b = c.trans_b;
    p.m = c.m, p.n = c.n, p.k = c.k, p.batch = c.batch;
    p.lda = c.lda, p.ldb = c.ldb, p.ldc = c.ldc;
    p.stride_a = c.stride_a, p.stride_b = c.stride_b, p.stride_c = c.stride_c;
    p.alpha = c.alpha, p.beta = c.beta;
    const bool a_rounded =
        !c.a_f32 || c.tensor_core ||
        (c.through_dispatch && std::string(cuda::GemmKernelName(p)) == "small_m_tc");
    a = a_rounded ? ToDouble(a_bf16) : std::vector<double>(a_float.begin(), a_float.end());
    if (c.through_dispatch) {
      ASSERT_TRUE(cuda::GemmSupports(p));
    } else {
      ASSERT_TRUE(c.tensor_core ? cuda::SmallMTcGemmFits(p) : cuda::SmallMGemmFits(p));
    }
    const absl::Status status = c.through_dispatch ? cuda::Gemm(handle_, p, nullptr)
                                : c.tensor_core    ? cuda::GemmSmallMTc(p, nullptr)
                                                   : cuda::GemmSmallM(p, nullptr);
    ASSERT_TRUE(status.ok()) << status;
    std::vector<double> got(c_count);
    std::vector<bf16> got_bf16;
    std::vector<float> got_f32;
    if (c.bf16_out) {
      got_bf16 = dc_bf16.Download();
      got = ToDouble(got_bf16);
    } else {
      got_f32 = dc_f32.Download();
      for (int64_t i = 0; i < c_count; ++i) got[i] = got_f32[i];
    }
    // The reference, and which elements of C are written.
    std::vector<char> written(c_count, 0);
    double diff = 0, norm = 0, worst = 0;
    int64_t non_finite = 0;
    for (int h = 0; h < c.batch; ++h) {
      for (int i = 0; i < c.m; ++i) {
        for (int j = 0; j < c.n; ++j) {
          double sum = 0;
          for (int x = 0; x < c.k; ++x) {
            const double av = a[h * c.stride_a + i * c.lda + x];
            const int64_t bi = c.trans_b ? h * c.stride_b + int64_t(j) * c.ldb + x
                                         : h * c.stride_b + int64_t(x) * c.ldb + j;
            sum += av * double(bf16_to_float(b[bi]));
          }
          const int64_t ci = h * c.stride_c + int64_t(i) * c.ldc + j;
          const double old = c.bf16_out ? double(bf16_to_float(c0_bf16[ci])) : c0_float[ci];
          const double want = c.alpha * sum + (c.beta != 0.f ? c.beta * old : 0.0);
          written[ci] = 1;
          if (!std::isfinite(got[ci])) ++non_finite;
          diff += (got[ci] - want) * (got[ci] - want);
          norm += want * want;
          worst = std::max(worst, std::abs(got[ci] - want));
        }
      }
    }
    EXPECT_EQ(non_finite, 0) << "unwritten (poisoned) or non-finite outputs";
    const double relative = std::sqrt(diff / std::max(norm, 1e-300));
    EXPECT_LT(relative, c.bf16_out ? 5e-3 : 1e-5) << "worst abs error " << worst;
    // Everything else untouched (NaN stays NaN: compare bits).
    int64_t touched = 0;
    for (int64_t i = 0; i < c_count; ++i) {
      if (written[i]) continue;
      touched += c.bf16_out ? std::memcmp(&got_bf16[i], &c0_bf16[i], sizeof(bf16)) != 0
                            : std::memcmp(&got_f32[i], &c0_float[i], sizeof(float)) != 0;
    }
    EXPECT_EQ(touched, 0) << "elements of C outside the product were written";
  }
};

// A case with the given shape, each operand's pitch padded by `pad` (multiple of 8 for B).
Case Plain(int m, int n, int k, int batch, bool trans_b, bool bf16_out, int pad, const char* name) {
  Case c{m, n, k, batch, trans_b, bf16_out, 0, 0, 0, 0, 0, 0};
  c.lda = k + pad + 1;  // A has no alignment needs
  c.ldb = (trans_b ? k : n) + pad;
  c.ldc = n + pad + 3;
  c.stride_a = int64_t(m) * c.lda + 5;
  c.stride_b = int64_t(trans_b ? n : k) * c.ldb + pad;
  c.stride_c = int64_t(m) * c.ldc + 1;
  c.name = name;
  return c;
}

TEST_F(GemmSmallMTest, BothOrientationsBothOutputs) {
  std::mt19937_64 rng(TestSeed());
  for (bool trans_b : {false, true}) {
    for (bool bf16_out : {false, true}) {
      // The CUDA-core kernel's cases, each on the tensor-core kernel too.
      auto Run = [&](std::mt19937_64& g, Case c) {
        this->Run(g, c);
        c.tensor_core = true;
        c.name += " (tensor cores)";
        this->Run(g, c);
      };
      Run(rng, Plain(1, 128, 512, 7, trans_b, bf16_out, 0, "m1"));
      Run(rng, Plain(3, 72, 40, 5, trans_b, bf16_out, 8, "odd m, n and k off the tiles"));
      Run(rng, Plain(cuda::kSmallMGemmMaxM, 136, 256, 3, trans_b, bf16_out, 16, "crossover m"));
      Run(rng, Plain(9, 8, 8, 1, trans_b, bf16_out, 0, "one head, tiny"));
      Run(rng, Plain(2, 40, 520, 9, trans_b, bf16_out, 8, "m2, k past 512"));
      Run(rng, Plain(5, 520, 24, 2, trans_b, bf16_out, 0, "m5, k below a warp's load"));
      Case f32 = Plain(6, 136, 72, 3, trans_b, bf16_out, 8, "A F32");
      f32.a_f32 = true;
      Run(rng, f32);
    }
  }
}

// The tensor-core kernel beyond the CUDA-core one's rows: every m tile count (1-4), m off the
// tiles, n off its 64- and 128-column blocks, k off its 16-steps, one and many heads, enough
// heads that it takes 128-column blocks, and the shared-memory limit.
TEST_F(GemmSmallMTest, TensorCoreRowsAndTiles) {
  std::mt19937_64 rng(TestSeed());
  for (bool trans_b : {false, true}) {
    for (bool bf16_out : {false, true}) {
      for (int m : {16, 17, 31, 33, 48, 63, 64}) {
        Case c = Plain(m, 200, 136, 3, trans_b, bf16_out, 8, "rows");
        c.tensor_core = true;
        Run(rng, c);
      }
      Case wide = Plain(5, 520, 40, 300, trans_b, bf16_out, 0, "128-column blocks");
      wide.tensor_core = true;
      Run(rng, wide);
      Case one = Plain(64, 8, 8, 1, trans_b, bf16_out, 0, "one head, one tile of 8 columns");
      one.tensor_core = true;
      Run(rng, one);
      Case f32 = Plain(40, 72, 520, 2, trans_b, bf16_out, 8, "A F32, k past 512");
      f32.a_f32 = true;
      f32.tensor_core = true;
      Run(rng, f32);
    }
  }
}

// The decode projections exactly as runtime/mla_projections.cc issues them (DeepSeek-V3.2:
// Dn 128, R 512, Dr 64, Dv 128), at 128 and at an odd number of heads.
TEST_F(GemmSmallMTest, DecodeProjectionShapes) {
  std::mt19937_64 rng(TestSeed());
  constexpr int dn = 128, r = 512, dr = 64, dv = 128, width = r + dr;
  for (int heads : {128, 13}) {
    for (int tokens : {1, 2, 4, 16, 64}) {
      // Each case through cuda::Gemm up to the dispatch's crossover, on the CUDA-core kernel
      // directly where it takes the rows, and on the tensor-core kernel directly.
      auto run_all = [&](Case c) {
        const std::string name = c.name;
        if (tokens <= cuda::kSmallMGemmDispatchMaxM) {
          c.through_dispatch = true;
          Run(rng, c);
          c.through_dispatch = false;
        }
        if (tokens <= cuda::kSmallMGemmMaxM) {
          c.name = name + ", CUDA cores";
          Run(rng, c);
        }
        c.tensor_core = true;
        c.name = name + ", tensor cores";
        Run(rng, c);
      };
      // Absorb: q_nope [T, H, Dn] x w_uk[h] [Dn, R] -> q' [T, H, R + Dr] (bf16).
      Case absorb{tokens,
                  r,
                  dn,
                  heads,
                  false,
                  true,
                  int64_t{heads} * dn,
                  r,
                  int64_t{heads} * width,
                  dn,
                  int64_t{dn} * r,
                  width};
      absorb.name = "absorb";
      run_all(absorb);
      // Output: o_lat [T, H, R] x w_uv[h] [R, Dv] -> out [T, H, Dv] (fp32).
      Case out{tokens,
               dv,
               r,
               heads,
               false,
               false,
               int64_t{heads} * r,
               dv,
               int64_t{heads} * dv,
               r,
               int64_t{r} * dv,
               dv};
      out.name = "project out";
      run_all(out);
      out.a_f32 = true;  // o_lat straight from the attention's fp32 output
      out.name = "project out, o_lat F32";
      run_all(out);
      // Up-projection of a few rows: kv_c [n, R] (shared by the heads) x w_uk[h]^T -> k.
      Case up{
          tokens,          dn,     r, heads, true, true, width, r, int64_t{heads} * (dn + dr), 0,
          int64_t{dn} * r, dn + dr};
      up.name = "up-projection, shared A";
      run_all(up);
    }
  }
}

TEST_F(GemmSmallMTest, AlphaAndBetaReadC) {
  std::mt19937_64 rng(TestSeed());
  for (bool trans_b : {false, true}) {
    for (bool bf16_out : {false, true}) {
      Case c = Plain(4, 64, 64, 3, trans_b, bf16_out, 8, "alpha beta");
      c.alpha = 0.5f;
      c.beta = -1.25f;
      Run(rng, c);
    }
  }
}

// The side copy: done by the same launch, 16 bytes at a time when everything is aligned, bytes
// otherwise; its rows only.
TEST_F(GemmSmallMTest, SideCopy) {
  std::mt19937_64 rng(TestSeed());
  for (int variant = 0; variant < 4; ++variant) {
    const int misalign = variant % 2;
    const bool tensor_core = variant >= 2;
    SCOPED_TRACE("misalign " + std::to_string(misalign) + " tensor cores " +
                 std::to_string(tensor_core));
    const int rows = 37, row_bytes = 128 + misalign, src_pitch = 144, dst_pitch = 1152;
    std::vector<uint8_t> src(size_t(rows) * src_pitch + 16), dst(size_t(rows) * dst_pitch + 16);
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& v : src) v = static_cast<uint8_t>(byte(rng));
    for (auto& v : dst) v = static_cast<uint8_t>(byte(rng));
    DeviceArray<uint8_t> dsrc(src), ddst(dst);
    const std::vector<bf16> a = ToBf16(RandomFloats(rng, 64)),
                            b = ToBf16(RandomFloats(rng, 64 * 8));
    DeviceArray<bf16> da(a), db(b);
    DeviceArray<float> dc(8);
    dc.Poison();
    GemmParams p;
    p.a = da.get(), p.b = db.get(), p.c = dc.get();
    p.a_dtype = p.b_dtype = DType::kBF16;
    p.c_dtype = DType::kF32;
    p.m = 1, p.n = 8, p.k = 64, p.batch = 1;
    p.lda = 64, p.ldb = 8, p.ldc = 8;
    p.side.dst = ddst.get() + misalign;
    p.side.src = dsrc.get() + misalign;
    p.side.dst_pitch = dst_pitch;
    p.side.src_pitch = src_pitch;
    p.side.row_bytes = row_bytes;
    p.side.rows = rows;
    ASSERT_TRUE(tensor_core ? cuda::SmallMTcGemmFits(p) : cuda::SmallMGemmFits(p));
    const absl::Status status =
        tensor_core ? cuda::GemmSmallMTc(p, nullptr) : cuda::GemmSmallM(p, nullptr);
    ASSERT_TRUE(status.ok()) << status;
    std::vector<uint8_t> want = dst;
    for (int row = 0; row < rows; ++row) {
      std::memcpy(&want[size_t(row) * dst_pitch + misalign],
                  &src[size_t(row) * src_pitch + misalign], row_bytes);
    }
    EXPECT_EQ(ddst.Download(), want);
    for (int j = 0; j < 8; ++j) {
      double sum = 0;
      for (int x = 0; x < 64; ++x) sum += double(bf16_to_float(a[x])) * bf16_to_float(b[x * 8 + j]);
      EXPECT_NEAR(dc.Download()[j], sum, 1e-4 * (1 + std::abs(sum)));
    }
  }
}

// GemmParams::side_slots: the compacting top-k -> slots step run with the GEMM, inside the
// small-M kernel's launch (slots blocks beside the GEMM's) where it takes it, else first as a
// launch of its own; either way the slots, the counts, the GEMM and the side copy are all
// right. Slots are checked against an enumeration written here (world 2, rank 1, interleave 1,
// block size 1: position 2j + 1 is rank 1's local slot j), the GEMM against float64.
TEST_F(GemmSmallMTest, SlotsBesideTheGemm) {
  std::mt19937_64 rng(TestSeed());
  struct SlotsCase {
    int tokens, m, n, k, batch;
    bool trans_b, tensor_core, dispatch;
    bool takes;     // SmallMGemmTakesSlots expected (the CUDA-core kernel would fuse them)
    bool overlaps;  // GemmOverlapsSlots expected (cuda::Gemm's dispatch fuses them)
    const char* name;
  };
  const SlotsCase cases[] = {
      {1, 1, 512, 128, 16, false, false, false, true, true, "absorb-like, one token"},
      {1, 1, 512, 128, 16, false, false, true, true, true, "through cuda::Gemm"},
      {5, 1, 64, 64, 3, false, false, false, true, true, "more tokens than column tiles"},
      {3, 1, 64, 64, 3, true, false, false, false, false, "B stored [N, K]: slots first"},
      {2, 4, 64, 64, 2, false, false, true, true, false, "cuBLAS through cuda::Gemm: slots first"},
      {2, 2, 64, 64, 2, false, true, false, true, false, "tensor-core kernel: slots first"},
  };
  for (const SlotsCase& c : cases) {
    SCOPED_TRACE(c.name);
    const int width = 2048;
    std::vector<int32_t> topk, want_counts, want_valid;
    for (int t = 0; t < c.tokens; ++t) {
      const int wanted = std::uniform_int_distribution<int>(0, width)(rng);
      std::vector<int32_t> row(width, -1);
      for (int j = 0; j < wanted; ++j) row[j] = 2 * j + 1;             // rank 1's
      for (int j = wanted; j < width; j += 2) row[j] = 2 * j;          // rank 0's: dropped
      std::shuffle(row.begin(), row.end(), rng);
      std::vector<int32_t> valid;
      for (int32_t g : row) {
        if (g >= 0 && g % 2 == 1) valid.push_back(g / 2);
      }
      want_counts.push_back(static_cast<int32_t>(valid.size()));
      valid.resize(width, -1);
      want_valid.insert(want_valid.end(), valid.begin(), valid.end());
      topk.insert(topk.end(), row.begin(), row.end());
    }
    std::vector<int32_t> tables(2 * width);
    for (int b = 0; b < 2 * width; ++b) tables[b] = b;
    const std::vector<int32_t> request(c.tokens, 0), position(c.tokens, 2 * width);
    // Poisoned with a value no output takes (-1, 0xFF bytes, is one of them).
    constexpr int32_t kPoison = 0x5a5a5a5a;
    DeviceArray<int32_t> d_topk(topk), d_req(request), d_pos(position), d_tables(tables),
        d_valid(std::vector<int32_t>(topk.size(), kPoison)),
        d_counts(std::vector<int32_t>(c.tokens, kPoison));
    TopkToSlotsParams slots;
    slots.topk = d_topk.get(), slots.token_request = d_req.get();
    slots.token_position = d_pos.get(), slots.block_tables = d_tables.get();
    slots.valid_slots = d_valid.get(), slots.valid_counts = d_counts.get();
    slots.num_tokens = c.tokens, slots.topk_width = width, slots.num_requests = 1;
    slots.max_blocks = 2 * width, slots.world_size = 2, slots.rank = 1;

    // C[h] = A[h] op(B[h]), A [m, k] BF16, C [m, n] F32, and a side copy of 37 rows.
    const std::vector<bf16> a = ToBf16(RandomFloats(rng, int64_t(c.batch) * c.m * c.k));
    const std::vector<bf16> b = ToBf16(RandomFloats(rng, int64_t(c.batch) * c.k * c.n));
    const int rows = 37, row_bytes = 128;
    std::vector<uint8_t> src(size_t(rows) * row_bytes);
    for (auto& v : src) v = static_cast<uint8_t>(rng());
    DeviceArray<bf16> da(a), db(b);
    DeviceArray<float> dc(size_t(c.batch) * c.m * c.n);
    std::vector<uint8_t> poison(src.size());
    for (size_t i = 0; i < src.size(); ++i) poison[i] = src[i] ^ 0x55;  // every byte differs
    DeviceArray<uint8_t> dsrc(src), ddst(poison);
    dc.Poison();
    GemmParams p;
    p.a = da.get(), p.b = db.get(), p.c = dc.get();
    p.a_dtype = p.b_dtype = DType::kBF16;
    p.c_dtype = DType::kF32;
    p.trans_b = c.trans_b;
    p.m = c.m, p.n = c.n, p.k = c.k, p.batch = c.batch;
    p.lda = c.k, p.ldb = c.trans_b ? c.k : c.n, p.ldc = c.n;
    p.stride_a = int64_t(c.m) * c.k, p.stride_b = int64_t(c.k) * c.n, p.stride_c = int64_t(c.m) * c.n;
    p.side.dst = ddst.get(), p.side.src = dsrc.get();
    p.side.dst_pitch = p.side.src_pitch = p.side.row_bytes = row_bytes;
    p.side.rows = rows;
    p.side_slots = &slots;
    EXPECT_EQ(cuda::SmallMGemmTakesSlots(p), c.takes);
    EXPECT_EQ(cuda::GemmOverlapsSlots(p), c.overlaps);
    const absl::Status status = c.dispatch      ? cuda::Gemm(handle_, p, nullptr)
                                : c.tensor_core ? cuda::GemmSmallMTc(p, nullptr)
                                                : cuda::GemmSmallM(p, nullptr);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(d_counts.Download(), want_counts);
    EXPECT_EQ(d_valid.Download(), want_valid);
    EXPECT_EQ(ddst.Download(), src);
    const std::vector<float> got = dc.Download();
    int64_t bad = 0;
    for (int h = 0; h < c.batch; ++h) {
      for (int i = 0; i < c.m; ++i) {
        for (int j = 0; j < c.n; ++j) {
          double sum = 0;
          for (int x = 0; x < c.k; ++x) {
            const float bv = bf16_to_float(
                b[size_t(h) * c.k * c.n + (c.trans_b ? size_t(j) * c.k + x : size_t(x) * c.n + j)]);
            sum += double(bf16_to_float(a[(size_t(h) * c.m + i) * c.k + x])) * bv;
          }
          const float v = got[(size_t(h) * c.m + i) * c.n + j];
          // fp32 accumulation (cuBLAS: maybe split K) over k <= 128 products of size ~1.
          if (!(std::abs(v - sum) <= 1e-3 * (1 + std::abs(sum)))) ++bad;
        }
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

// Shapes outside the kernel: GemmSmallM refuses them clearly; cuda::Gemm takes them to cuBLAS.
// The launch-rule predicates are host code: checked here without a GPU (the pointers are only
// compared and tested for alignment), for both small-M kernels at once.
TEST(SmallMGemmFitsTest, BothKernelsRefuseWhatBreaksTheirSharedRules) {
  alignas(16) static bf16 a[64 * 64], b[64 * 64 + 8];
  alignas(16) static float c[64 * 64];
  GemmParams p;
  p.a = a, p.b = b, p.c = c;
  p.a_dtype = p.b_dtype = DType::kBF16;
  p.c_dtype = DType::kF32;
  p.m = 1, p.n = 64, p.k = 64, p.lda = 64, p.ldb = 64, p.ldc = 64;
  ASSERT_TRUE(cuda::SmallMGemmFits(p));
  ASSERT_TRUE(cuda::SmallMTcGemmFits(p));
  auto refused = [&](const char* why, auto change) {
    GemmParams q = p;
    change(q);
    EXPECT_FALSE(cuda::SmallMGemmFits(q)) << why;
    EXPECT_FALSE(cuda::SmallMTcGemmFits(q)) << why;
  };
  refused("fp32 weights", [](GemmParams& q) { q.b_dtype = DType::kF32; });
  refused("int32 A", [](GemmParams& q) { q.a_dtype = DType::kI32; });
  refused("trans_a", [](GemmParams& q) { q.trans_a = true; });
  refused("m 0", [](GemmParams& q) { q.m = 0; });
  refused("m past both kernels", [](GemmParams& q) { q.m = cuda::kSmallMTcGemmMaxM + 1; });
  refused("n 0", [](GemmParams& q) { q.n = 0; });
  refused("batch past a grid column", [](GemmParams& q) { q.batch = 65536; });
  refused("no C", [](GemmParams& q) { q.c = nullptr; });
  refused("lda < k", [](GemmParams& q) { q.lda = 63; });
  refused("ldb < n", [](GemmParams& q) { q.ldb = 56; });
  refused("negative stride", [](GemmParams& q) { q.stride_a = -1; });
  refused("a batch writing one C", [](GemmParams& q) { q.batch = 2, q.stride_c = 0; });
  refused("B not 16-byte aligned", [&](GemmParams& q) { q.b = b + 1; });
  refused("n not a multiple of 8", [](GemmParams& q) { q.n = 60, q.ldb = 64; });
  refused("a side copy without a source", [&](GemmParams& q) {
    q.side.rows = 1, q.side.row_bytes = 16, q.side.dst = c, q.side.src = nullptr;
    q.side.dst_pitch = q.side.src_pitch = 16;
  });
  refused("a side copy with a short pitch", [&](GemmParams& q) {
    q.side.rows = 2, q.side.row_bytes = 32, q.side.dst = c, q.side.src = a;
    q.side.dst_pitch = 16, q.side.src_pitch = 32;
  });
  // Where the two differ: rows past the CUDA-core kernel's tile, and a merged A.
  GemmParams q = p;
  q.m = cuda::kSmallMGemmMaxM + 1;
  EXPECT_FALSE(cuda::SmallMGemmFits(q));
  EXPECT_TRUE(cuda::SmallMTcGemmFits(q));
  q = p;
  q.a_dtype = DType::kF32;
  q.merge_a.splits = 2;
  EXPECT_TRUE(cuda::SmallMGemmFits(q));
  EXPECT_FALSE(cuda::SmallMTcGemmFits(q));
  // A well-formed side copy is taken by both.
  q = p;
  q.side.rows = 2, q.side.row_bytes = 32, q.side.dst = c, q.side.src = a;
  q.side.dst_pitch = q.side.src_pitch = 32;
  EXPECT_TRUE(cuda::SmallMGemmFits(q));
  EXPECT_TRUE(cuda::SmallMTcGemmFits(q));
}

TEST_F(GemmSmallMTest, RefusesWhatItCannotRun) {
  DeviceArray<bf16> a(64 * 64), b(64 * 64 + 8);
  DeviceArray<float> c(64 * 64);
  GemmParams p;
  p.a = a.get(), p.b = b.get(), p.c = c.get();
  p.a_dtype = p.b_dtype = DType::kBF16;
  p.c_dtype = DType::kF32;
  p.m = 1, p.n = 64, p.k = 64, p.lda = 64, p.ldb = 64, p.ldc = 64;
  ASSERT_TRUE(cuda::SmallMGemmFits(p));
  auto refused = [&](GemmParams q, const char* why) {
    EXPECT_FALSE(cuda::SmallMGemmFits(q)) << why;
    EXPECT_EQ(cuda::GemmSmallM(q, nullptr).code(), absl::StatusCode::kInvalidArgument) << why;
  };
  GemmParams q = p;
  q.m = cuda::kSmallMGemmMaxM + 1;
  refused(q, "m beyond the crossover");
  q = p;
  q.trans_a = true;
  refused(q, "trans_a");
  q = p;
  q.a_dtype = q.b_dtype = DType::kF32;
  refused(q, "fp32 inputs");
  q = p;
  q.a_dtype = DType::kBF16;
  q.b_dtype = DType::kF32;
  refused(q, "F32 weights");
  // A F32 with B BF16 beyond the dispatch's crossover: not supported, and Gemm says so.
  q = p;
  q.a_dtype = DType::kF32;
  q.m = cuda::kSmallMGemmDispatchMaxM + 1;
  EXPECT_FALSE(cuda::GemmSupports(q));
  const absl::Status mixed = cuda::Gemm(handle_, q, nullptr);
  EXPECT_EQ(mixed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(mixed.message()).find("small-M"), std::string::npos) << mixed;
  q = p;
  q.b = b.get() + 1;
  refused(q, "B not 16-byte aligned");
  q = p;
  q.n = 60;
  refused(q, "n not a multiple of 8");
  q = p;
  q.k = 0;
  refused(q, "k == 0 (C = beta C: cuBLAS)");
  // The tensor-core kernel: rows past 64, a tile past its shared memory, and the same rules.
  ASSERT_TRUE(cuda::SmallMTcGemmFits(p));
  auto refused_tc = [&](GemmParams r, const char* why) {
    EXPECT_FALSE(cuda::SmallMTcGemmFits(r)) << why;
    EXPECT_EQ(cuda::GemmSmallMTc(r, nullptr).code(), absl::StatusCode::kInvalidArgument) << why;
  };
  q = p;
  q.m = cuda::kSmallMTcGemmMaxM + 1;
  refused_tc(q, "m past 64");
  q = p;
  q.k = 4096;
  q.lda = 4096;
  refused_tc(q, "K x 64 weights past the shared-memory tile");
  q = p;
  q.b = b.get() + 1;
  refused_tc(q, "B not 16-byte aligned");
  q = p;
  q.trans_a = true;
  refused_tc(q, "trans_a");
}

// GemmParams::merge_a: A merged on the fly from split-KV partials (the sparse route's output
// projection at one rank), against a float64 merge + GEMM written here: every split count class
// (2, 7, 16, 33, 64; groups of 16), one row, rows whose splits are partly empty (lse -inf, NaN or +inf,
// their values NaN: never read into the sum), a row with no finite LSE at all (A row 0, lse
// -inf), huge LSEs; C and the merged LSE poisoned first; the refusals.
TEST_F(GemmSmallMTest, MergesSplitPartialsIntoA) {
  std::mt19937_64 rng(TestSeed());
  const int n = 128, k = 512, batch = 5;
  for (const int splits : {2, 7, 16, 33, 64}) {
    for (const int m : {1}) {  // the merged-A kernel is compiled for one row
      SCOPED_TRACE(::testing::Message() << "splits " << splits << " m " << m);
      const int64_t per_split = int64_t(m) * batch * k;  // [m, batch, k] per split
      std::vector<float> parts = RandomFloats(rng, per_split * splits);
      std::vector<float> lse(size_t(splits) * m * batch);
      std::uniform_real_distribution<float> lse_dist(-3.f, 3.f);
      for (size_t i = 0; i < lse.size(); ++i) {
        const int s = static_cast<int>(i / (size_t(m) * batch));
        const int64_t row = static_cast<int64_t>(i % (size_t(m) * batch));  // i * batch + b
        float value = lse_dist(rng);
        if (s == 1) value += 80.f;                             // huge logits: exp would overflow
        if ((row + s) % 5 == 3) value = -INFINITY;             // an empty split
        if (s == splits - 1 && row % 3 == 1) value = std::nanf("");
        if (s == 0 && row % 4 == 2) value = INFINITY;          // counts as -inf too
        if (row == m * batch - 1) value = -INFINITY;           // a row with no keys at all
        lse[i] = value;
        const bool empty = !(std::isfinite(value));
        if (empty) {  // its values may be anything: poison them
          for (int x = 0; x < k; ++x) parts[s * per_split + row * k + x] = std::nanf("");
        }
      }
      const std::vector<bf16> b = ToBf16(RandomFloats(rng, int64_t(batch) * k * n, -0.1f, 0.1f));
      DeviceArray<float> d_parts(parts), d_lse(lse);
      DeviceArray<bf16> d_b(b);
      DeviceArray<float> d_c(std::vector<float>(size_t(m) * batch * n, std::nanf("")));
      DeviceArray<float> d_out_lse(std::vector<float>(size_t(m) * batch, std::nanf("")));
      GemmParams p;
      p.a = d_parts.get(), p.b = d_b.get(), p.c = d_c.get();
      p.a_dtype = DType::kF32, p.b_dtype = DType::kBF16, p.c_dtype = DType::kF32;
      p.m = m, p.n = n, p.k = k, p.batch = batch;
      p.lda = int64_t(batch) * k, p.stride_a = k;  // [m, batch, k]
      p.ldb = n, p.stride_b = int64_t(k) * n;
      p.ldc = int64_t(batch) * n, p.stride_c = n;
      p.merge_a = {splits, per_split, d_lse.get(), d_out_lse.get(), batch};
      ASSERT_TRUE(cuda::SmallMGemmFits(p));
      EXPECT_FALSE(cuda::SmallMTcGemmFits(p));
      EXPECT_EQ(cuda::GemmSupports(p), m <= cuda::kSmallMGemmDispatchMaxM &&
                                           std::string(cuda::GemmKernelName(p)) == "small_m");
      const absl::Status status = cuda::GemmSmallM(p, nullptr);
      ASSERT_TRUE(status.ok()) << status;
      const std::vector<float> got = d_c.Download(), got_lse = d_out_lse.Download();
      double diff = 0, norm = 0;
      for (int i = 0; i < m; ++i) {
        for (int h = 0; h < batch; ++h) {
          const int64_t row = int64_t(i) * batch + h;
          double top = -INFINITY;
          std::vector<double> l(splits);
          for (int s = 0; s < splits; ++s) {
            const float v = lse[size_t(s) * m * batch + row];
            l[s] = std::isfinite(v) ? double(v) : -INFINITY;
            top = std::max(top, l[s]);
          }
          std::vector<double> a(k, 0.0);
          double want_lse = -INFINITY;
          if (top != -INFINITY) {
            double sum = 0;
            for (int s = 0; s < splits; ++s) sum += l[s] == -INFINITY ? 0.0 : std::exp(l[s] - top);
            want_lse = top + std::log(sum);
            for (int s = 0; s < splits; ++s) {
              if (l[s] == -INFINITY) continue;
              const double w = std::exp(l[s] - top) / sum;
              for (int x = 0; x < k; ++x) a[x] += w * parts[s * per_split + row * k + x];
            }
          }
          const float lse_got = got_lse[row];
          if (want_lse == -INFINITY) {
            EXPECT_TRUE(std::isinf(lse_got) && lse_got < 0) << "row " << i << " head " << h;
          } else {
            EXPECT_NEAR(lse_got, want_lse, 1e-5 * std::max(1.0, std::abs(want_lse)))
                << "row " << i << " head " << h;
          }
          for (int j = 0; j < n; ++j) {
            double want = 0;
            for (int x = 0; x < k; ++x) {
              want += a[x] * double(bf16_to_float(b[int64_t(h) * k * n + int64_t(x) * n + j]));
            }
            const float value = got[row * n + j];
            ASSERT_TRUE(std::isfinite(value)) << "C row " << i << " head " << h << " col " << j;
            diff += (value - want) * (value - want);
            norm += want * want;
          }
        }
      }
      EXPECT_LT(std::sqrt(diff / std::max(norm, 1e-30)), 1e-5);
    }
  }
  // Refusals: the [N, K] kernel, a BF16 A, more splits than compiled; cuBLAS refuses it.
  DeviceArray<float> a(std::vector<float>(512, 0.f)), c(std::vector<float>(512, 0.f));
  DeviceArray<bf16> b(std::vector<bf16>(512 * 128));
  GemmParams p;
  p.a = a.get(), p.b = b.get(), p.c = c.get();
  p.a_dtype = DType::kF32, p.b_dtype = DType::kBF16, p.c_dtype = DType::kF32;
  p.m = 1, p.n = 128, p.k = 512, p.batch = 1, p.lda = 512, p.ldb = 128, p.ldc = 128;
  p.merge_a = {2, 512, a.get(), c.get(), 1};
  ASSERT_TRUE(cuda::SmallMGemmFits(p));
  GemmParams q = p;
  q.trans_b = true, q.ldb = 512;
  EXPECT_FALSE(cuda::SmallMGemmFits(q)) << "B stored [N, K]";
  q = p;
  q.a_dtype = DType::kBF16;
  EXPECT_FALSE(cuda::SmallMGemmFits(q)) << "BF16 A";
  q = p;
  q.m = 2, q.lda = 1024, q.ldc = 256;
  EXPECT_FALSE(cuda::SmallMGemmFits(q)) << "2 rows";
  q = p;
  q.merge_a.splits = 65;
  EXPECT_FALSE(cuda::SmallMGemmFits(q)) << "65 splits";
  q = p;
  q.merge_a.part_lse = nullptr;
  EXPECT_EQ(cuda::GemmSmallM(q, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::GemmCublas(handle_, p, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dcp::testing
