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
void MicroKernel(int k, const float* a_panel, const float* b_panel, float* tile) {
  Vec16 acc[kPanelRows] = {};
  for (int p = 0; p < k; ++p) {
    Vec16 b;
    std::memcpy(&b, b_panel + int64_t{p} * kPanelCols, sizeof(b));
    const float* a = a_panel + int64_t{p} * kPanelRows;
    for (int r = 0; r < kPanelRows; ++r) acc[r] += a[r] * b;
  }
  std::memcpy(tile, acc, sizeof(acc));
}

}  // namespace dcp::cpu::internal
