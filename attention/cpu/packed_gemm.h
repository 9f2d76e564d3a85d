// The one compute core of the CPU kernels: an fp32 register-tiled matrix product over operands
// packed into panels (GotoBLAS layout). Gemm, DenseMha and SparseMqa all pack their operands
// (converting bf16 to fp32 on the way) and multiply through MultiplyPacked.
//
// Layouts: A (m x k) is cut into panels of kPanelRows rows, each stored column by column
// ([k][kPanelRows]); B (k x n) into panels of kPanelCols columns, each stored row by row
// ([k][kPanelCols]). Rows/columns past m/n are zero padding.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/dtype.h"

namespace dcp::cpu::internal {

inline constexpr int kPanelRows = 6;   // rows of A per register tile
inline constexpr int kPanelCols = 16;  // columns of B per register tile (one AVX-512 vector)

constexpr int64_t RoundUp(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}
constexpr int64_t PackedASize(int64_t m, int64_t k) { return RoundUp(m, kPanelRows) * k; }
constexpr int64_t PackedBSize(int64_t k, int64_t n) { return RoundUp(n, kPanelCols) * k; }

// tile[kPanelRows][kPanelCols] = A (kPanelRows x k) @ B (k x kPanelCols), fp32 accumulation.
// A element (r, p) is a[r * a_row_stride + p * a_k_stride]; B row p is the kPanelCols floats at
// b + p * b_k_stride. Packed panels: (1, kPanelRows) and kPanelCols; plain row-major f32 rows
// can be used in place (a_k_stride 1, b_k_stride = their leading dimension), as the attention
// tile does, as long as all kPanelRows rows and kPanelCols columns are readable.
void MicroKernel(int k, const float* a, int64_t a_row_stride, int64_t a_k_stride, const float* b,
                 int64_t b_k_stride, float* tile);

// Packs op(A) (m x k) given element(i, p) -> float.
template <typename Element>
void PackA(int m, int k, Element&& element, float* dst) {
  for (int i0 = 0; i0 < m; i0 += kPanelRows) {
    float* panel = dst + int64_t{i0 / kPanelRows} * k * kPanelRows;
    const int rows = std::min(kPanelRows, m - i0);
    for (int p = 0; p < k; ++p) {
      for (int r = 0; r < kPanelRows; ++r) {
        panel[int64_t{p} * kPanelRows + r] = r < rows ? element(i0 + r, p) : 0.0f;
      }
    }
  }
}

// Packs op(B) (k x n) given element(p, j) -> float; reads along j (rows of B).
template <typename Element>
void PackB(int k, int n, Element&& element, float* dst) {
  for (int j0 = 0; j0 < n; j0 += kPanelCols) {
    float* panel = dst + int64_t{j0 / kPanelCols} * k * kPanelCols;
    const int cols = std::min(kPanelCols, n - j0);
    for (int p = 0; p < k; ++p) {
      for (int c = 0; c < kPanelCols; ++c) {
        panel[int64_t{p} * kPanelCols + c] = c < cols ? element(p, j0 + c) : 0.0f;
      }
    }
  }
}

// Packs B (k x n) whose columns are contiguous rows in memory: column j of B is row(j)[0..k).
// This is K^T of attention (keys as columns), read along each key row.
template <typename RowPointer>
void PackBFromColumns(int k, int n, RowPointer&& row, float* dst) {
  for (int j = 0; j < n; ++j) {
    float* column = dst + int64_t{j / kPanelCols} * k * kPanelCols + j % kPanelCols;
    const auto* source = row(j);
    for (int p = 0; p < k; ++p) column[int64_t{p} * kPanelCols] = to_float(source[p]);
  }
  if (const int tail = static_cast<int>(n % kPanelCols); tail != 0) {
    float* panel = dst + int64_t{n / kPanelCols} * k * kPanelCols;
    for (int p = 0; p < k; ++p) {
      std::fill(panel + int64_t{p} * kPanelCols + tail, panel + int64_t{p + 1} * kPanelCols, 0.0f);
    }
  }
}

// For every register tile of packed A (m x k) times packed B (k x n): store(i0, j0, rows, cols,
// tile) with tile [kPanelRows][kPanelCols] row-major, rows/cols the valid part. B panels are the
// outer loop so that one stays in L1 while the A panels stream past.
template <typename Store>
void MultiplyPacked(int m, int n, int k, const float* a_packed, const float* b_packed,
                    Store&& store) {
  alignas(64) float tile[kPanelRows * kPanelCols];
  for (int j0 = 0; j0 < n; j0 += kPanelCols) {
    const float* b_panel = b_packed + int64_t{j0 / kPanelCols} * k * kPanelCols;
    const int cols = std::min(kPanelCols, n - j0);
    for (int i0 = 0; i0 < m; i0 += kPanelRows) {
      const float* a_panel = a_packed + int64_t{i0 / kPanelRows} * k * kPanelRows;
      MicroKernel(k, a_panel, 1, kPanelRows, b_panel, kPanelCols, tile);
      store(i0, j0, std::min(kPanelRows, m - i0), cols, static_cast<const float*>(tile));
    }
  }
}

}  // namespace dcp::cpu::internal
