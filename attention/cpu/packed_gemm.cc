#include "attention/cpu/packed_gemm.h"

#include <cstring>

#include "attention/cpu/cpu_kernel_utils.h"

namespace dcp::cpu::internal {
namespace {
// kPanelCols floats: one zmm on AVX-512, two ymm on AVX2, four xmm on the baseline clone.
typedef float Vec16 __attribute__((vector_size(kPanelCols * sizeof(float))));
static_assert(kPanelCols == 16);
}  // namespace

// kPanelRows accumulators of kPanelCols lanes stay in registers for the whole k loop; each step
// loads one B row and broadcasts kPanelRows A values (6x16 fits AVX2's 16 registers).
DCP_CPU_MULTIVERSION
void MicroKernel(int k, const float* a, int64_t a_row_stride, int64_t a_k_stride, const float* b,
                 int64_t b_k_stride, float* tile) {
  Vec16 acc[kPanelRows] = {};
  for (int p = 0; p < k; ++p) {
    Vec16 b_row;
    std::memcpy(&b_row, b + p * b_k_stride, sizeof(b_row));
    const float* a_column = a + p * a_k_stride;
    for (int r = 0; r < kPanelRows; ++r) acc[r] += a_column[r * a_row_stride] * b_row;
  }
  std::memcpy(tile, acc, sizeof(acc));
}

}  // namespace dcp::cpu::internal
