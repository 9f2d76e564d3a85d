// Gemm on CPU: pack op(B) of a batch entry once, then for row blocks of op(A): pack, multiply
// through the register-tiled core, and write alpha * AB + beta * C in C's dtype.
// Threads take whole batch entries when there are enough of them, else row blocks.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention/cpu/attention_cpu.h"
#include "attention/cpu/cpu_kernel_utils.h"
#include "attention/cpu/packed_gemm.h"
#include "core/status.h"

namespace dcp::cpu {
namespace {

using internal::PackA;
using internal::PackB;

// Rows of op(A) packed at a time: with k = 512 the block is 192 KiB, an L2-resident stream.
constexpr int kRowBlock = 96;

absl::Status CheckGemmParams(const GemmParams& p) {
  DCP_CHECK_ARG(p.m >= 0 && p.n >= 0 && p.k >= 0 && p.batch >= 0,
                "Gemm: negative size (m=%d, n=%d, k=%d, batch=%d)", p.m, p.n, p.k, p.batch);
  DCP_CHECK_ARG(internal::IsFloatDType(p.a_dtype), "Gemm: a_dtype %s is not F32 or BF16",
                dtype_name(p.a_dtype));
  DCP_CHECK_ARG(internal::IsFloatDType(p.b_dtype), "Gemm: b_dtype %s is not F32 or BF16",
                dtype_name(p.b_dtype));
  DCP_CHECK_ARG(internal::IsFloatDType(p.c_dtype), "Gemm: c_dtype %s is not F32 or BF16",
                dtype_name(p.c_dtype));
  if (int64_t{p.m} * p.n * p.batch == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.c != nullptr, "Gemm: c is null");
  const int64_t c_cols = p.n;
  DCP_CHECK_ARG(p.ldc >= c_cols, "Gemm: ldc (%d) < n (%d)", p.ldc, p.n);
  DCP_CHECK_ARG(p.stride_a >= 0 && p.stride_b >= 0 && p.stride_c >= 0,
                "Gemm: negative batch stride (stride_a=%d, stride_b=%d, stride_c=%d)", p.stride_a,
                p.stride_b, p.stride_c);
  DCP_CHECK_ARG(p.batch == 1 || p.stride_c > 0, "Gemm: stride_c is 0 with batch %d", p.batch);
  if (p.k == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.a != nullptr, "Gemm: a is null");
  DCP_CHECK_ARG(p.b != nullptr, "Gemm: b is null");
  const int64_t a_cols = p.trans_a ? p.m : p.k;
  const int64_t b_cols = p.trans_b ? p.k : p.n;
  DCP_CHECK_ARG(p.lda >= a_cols, "Gemm: lda (%d) < %d, the columns of stored A%s", p.lda, a_cols,
                p.trans_a ? " (trans_a)" : "");
  DCP_CHECK_ARG(p.ldb >= b_cols, "Gemm: ldb (%d) < %d, the columns of stored B%s", p.ldb, b_cols,
                p.trans_b ? " (trans_b)" : "");
  return absl::OkStatus();
}

template <typename C>
void StoreScaled(const GemmParams& p, C* c, int i0, int j0, int rows, int cols, const float* tile) {
  for (int r = 0; r < rows; ++r) {
    C* row = c + int64_t{i0 + r} * p.ldc + j0;
    const float* values = tile + r * internal::kPanelCols;
    if (p.beta == 0.0f) {  // BLAS semantics: C is not read, so NaN garbage in it cannot leak
      for (int col = 0; col < cols; ++col) row[col] = from_float<C>(p.alpha * values[col]);
    } else {
      for (int col = 0; col < cols; ++col) {
        row[col] = from_float<C>(p.alpha * values[col] + p.beta * to_float(row[col]));
      }
    }
  }
}

template <typename C>
void ScaleOnly(const GemmParams& p, C* c) {  // k == 0: C = beta * C
  for (int i = 0; i < p.m; ++i) {
    C* row = c + int64_t{i} * p.ldc;
    for (int j = 0; j < p.n; ++j) {
      row[j] = from_float<C>(p.beta == 0.0f ? 0.0f : p.beta * to_float(row[j]));
    }
  }
}

template <typename A>
void PackRowsOfA(const GemmParams& p, const A* a, int i0, int rows, float* dst) {
  if (p.trans_a) {
    PackA(
        rows, p.k, [&](int i, int q) { return to_float(a[int64_t{q} * p.lda + i0 + i]); }, dst);
  } else {
    PackA(
        rows, p.k, [&](int i, int q) { return to_float(a[int64_t{i0 + i} * p.lda + q]); }, dst);
  }
}

template <typename B>
void PackAllOfB(const GemmParams& p, const B* b, float* dst) {
  if (p.trans_b) {
    internal::PackBFromColumns(
        p.k, p.n, [&](int j) { return b + int64_t{j} * p.ldb; }, dst);
  } else {
    PackB(
        p.k, p.n, [&](int q, int j) { return to_float(b[int64_t{q} * p.ldb + j]); }, dst);
  }
}

template <typename A, typename B, typename C>
void RunGemm(const GemmParams& p) {
  const A* a_base = static_cast<const A*>(p.a);
  const B* b_base = static_cast<const B*>(p.b);
  C* c_base = static_cast<C*>(p.c);
  const int num_row_blocks = (p.m + kRowBlock - 1) / kRowBlock;
  const double flops = 2.0 * p.m * p.n * p.k * p.batch;
  const int64_t packed_b_size = internal::PackedBSize(p.k, p.n);
  const int64_t packed_a_size = internal::PackedASize(std::min(p.m, kRowBlock), p.k);

  // One row block of one batch entry against its packed B.
  auto row_block = [&](int batch, int block, const float* b_packed, float* a_packed) {
    const int i0 = block * kRowBlock;
    const int rows = std::min(kRowBlock, p.m - i0);
    PackRowsOfA(p, a_base + batch * p.stride_a, i0, rows, a_packed);
    C* c = c_base + batch * p.stride_c;
    internal::MultiplyPacked(rows, p.n, p.k, a_packed, b_packed,
                             [&](int ti, int tj, int tr, int tc, const float* tile) {
                               StoreScaled(p, c, i0 + ti, tj, tr, tc, tile);
                             });
  };

  const bool shared_b = p.batch == 1 || p.stride_b == 0;
  if (!shared_b && p.batch >= internal::NumThreads()) {
    // Whole batch entries per thread: each packs its own B once per entry.
    internal::ParallelFor(p.batch, flops, [&](int64_t begin, int64_t end) {
      std::vector<float> b_packed(packed_b_size), a_packed(packed_a_size);
      for (int64_t batch = begin; batch < end; ++batch) {
        PackAllOfB(p, b_base + batch * p.stride_b, b_packed.data());
        for (int block = 0; block < num_row_blocks; ++block) {
          row_block(static_cast<int>(batch), block, b_packed.data(), a_packed.data());
        }
      }
    });
    return;
  }
  // Few entries or one shared B: pack B here, split (entry, row block) pairs over threads.
  std::vector<float> b_packed(packed_b_size);
  for (int batch = 0; batch < p.batch; ++batch) {
    if (batch == 0 || !shared_b) PackAllOfB(p, b_base + batch * p.stride_b, b_packed.data());
    const int entries = shared_b ? p.batch : 1;
    internal::ParallelFor(int64_t{entries} * num_row_blocks, flops / (shared_b ? 1 : p.batch),
                          [&](int64_t begin, int64_t end) {
                            std::vector<float> a_packed(packed_a_size);
                            for (int64_t item = begin; item < end; ++item) {
                              const int entry =
                                  shared_b ? static_cast<int>(item / num_row_blocks) : batch;
                              row_block(entry, static_cast<int>(item % num_row_blocks),
                                        b_packed.data(), a_packed.data());
                            }
                          });
    if (shared_b) break;
  }
}

template <typename A, typename B>
void DispatchC(const GemmParams& p) {
  if (p.c_dtype == DType::kF32) {
    RunGemm<A, B, float>(p);
  } else {
    RunGemm<A, B, bf16>(p);
  }
}

template <typename A>
void DispatchB(const GemmParams& p) {
  if (p.b_dtype == DType::kF32) {
    DispatchC<A, float>(p);
  } else {
    DispatchC<A, bf16>(p);
  }
}

}  // namespace

absl::Status Gemm(const GemmParams& params) {
  DCP_RETURN_IF_ERROR(CheckGemmParams(params));
  DCP_CHECK_ARG(params.merge_a.splits <= 1,
                "Gemm (CPU): an A merged from split partials (merge_a) is a CUDA small-M feature");
  const GemmParams::SideCopy& side = params.side;
  if (side.rows > 0 && side.row_bytes > 0) {
    DCP_CHECK_ARG(side.dst != nullptr && side.src != nullptr,
                  "Gemm: side copy with a null pointer");
    DCP_CHECK_ARG(side.dst_pitch >= side.row_bytes && side.src_pitch >= side.row_bytes,
                  "Gemm: side copy pitches (%d, %d) below its row of %d bytes", side.dst_pitch,
                  side.src_pitch, side.row_bytes);
    for (int64_t row = 0; row < side.rows; ++row) {
      std::memcpy(static_cast<std::byte*>(side.dst) + row * side.dst_pitch,
                  static_cast<const std::byte*>(side.src) + row * side.src_pitch,
                  size_t(side.row_bytes));
    }
  }
  if (int64_t{params.m} * params.n * params.batch == 0) return absl::OkStatus();
  if (params.k == 0) {
    for (int batch = 0; batch < params.batch; ++batch) {
      if (params.c_dtype == DType::kF32) {
        ScaleOnly(params, static_cast<float*>(params.c) + batch * params.stride_c);
      } else {
        ScaleOnly(params, static_cast<bf16*>(params.c) + batch * params.stride_c);
      }
    }
    return absl::OkStatus();
  }
  if (params.a_dtype == DType::kF32) {
    DispatchB<float>(params);
  } else {
    DispatchB<bf16>(params);
  }
  return absl::OkStatus();
}

}  // namespace dcp::cpu
