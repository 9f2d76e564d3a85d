// Score, output-row and P V helpers of the sm_90a sparse MQA kernel's consumers
// (sparse_mqa_sm90_kernel.cuh).
#pragma once

#include <cmath>
#include <cstdint>

#include "attention/cuda/mma_sm80.cuh"
#include "attention/cuda/wgmma_sm90.cuh"

namespace dcp::cuda {

// Masks S of one 64-key block (a wgmma m64n64 fragment: this thread's rows g and g + 8,
// columns 8 j + 2 c + e) and scales it into log2 units; block_max gets the quad-reduced row
// maxima. A key is valid when its position is below key_end and its slot in [0, num_slots).
__device__ __forceinline__ void Sm90MaskScores(float (&s)[32], const int32_t* block_index,
                                               int block, int key_end, int num_slots,
                                               float scale_log2, int c, float (&block_max)[2]) {
  block_max[0] = block_max[1] = -INFINITY;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = 8 * j + 2 * c + e;
      const int key = block * 64 + col;
      const int32_t slot = block_index[col];
      const bool valid = key < key_end && slot >= 0 && slot < num_slots;
      s[4 * j + e] = valid ? s[4 * j + e] * scale_log2 : -INFINITY;
      s[4 * j + 2 + e] = valid ? s[4 * j + 2 + e] * scale_log2 : -INFINITY;
      block_max[0] = fmaxf(block_max[0], s[4 * j + e]);
      block_max[1] = fmaxf(block_max[1], s[4 * j + 2 + e]);
    }
  }
  block_max[0] = QuadMax(block_max[0]);
  block_max[1] = QuadMax(block_max[1]);
}

// 2^x as one ex2.approx.ftz (a result below 2^-126 is 0).
__device__ __forceinline__ float Exp2Ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// P = 2^(S - m_use) of fragment column group j (keys 8 j + 2 c, + 1) for this thread's two
// rows, packed as bf16 pairs (top: row g, bottom: row g + 8); sums gets each row's pair sum.
// kFtz: 2^x through Exp2Ftz (the roles scorer), else exp2f (the pairs schedule, as measured).
template <bool kFtz>
__device__ __forceinline__ void Sm90ExpScores(const float (&s)[32], int j,
                                              const float (&m_use)[2], float (&sums)[2],
                                              uint32_t& top, uint32_t& bottom) {
  auto exp2 = [](float x) { return kFtz ? Exp2Ftz(x) : exp2f(x); };
  const float p00 = exp2(s[4 * j] - m_use[0]), p01 = exp2(s[4 * j + 1] - m_use[0]);
  const float p10 = exp2(s[4 * j + 2] - m_use[1]), p11 = exp2(s[4 * j + 3] - m_use[1]);
  sums[0] = p00 + p01;
  sums[1] = p10 + p11;
  top = PackBf16(p00, p01);
  bottom = PackBf16(p10, p11);
}

// Stores those pairs into a K-major swizzled P tile [64 rows][64 keys] at p_tile.
__device__ __forceinline__ void Sm90StoreScores(uint32_t p_tile, const int (&rows)[2], int j,
                                                int c, uint32_t top, uint32_t bottom) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(p_tile + sm90::TileChunk(rows[0], j) + 4 * c),
               "r"(top));
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(p_tile + sm90::TileChunk(rows[1], j) + 4 * c),
               "r"(bottom));
}

// The epilogue's per-row normaliser of O (1 / the row's sum of P; 0 for a row without keys)
// and the row's natural-log LSE from its running max in log2 units and that sum.
__device__ __forceinline__ float Sm90RowInverse(float total) {
  return total > 0.f ? 1.f / total : 0.f;
}
__device__ __forceinline__ float Sm90RowLse(float max_log2, float total) {
  return total > 0.f ? (max_log2 + log2f(total)) * 0.6931471805599453f : -INFINITY;
}

// This thread's two rows of O (an m64n256 fragment) times their factors; nothing when both
// are 1 (the running max did not move).
__device__ __forceinline__ void Sm90RescaleRows(float (&o)[128], const float (&factor)[2]) {
  if (factor[0] != 1.f || factor[1] != 1.f) {
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[4 * j] *= factor[0];
      o[4 * j + 1] *= factor[0];
      o[4 * j + 2] *= factor[1];
      o[4 * j + 3] *= factor[1];
    }
  }
}

// O += P V[:, half] with P in registers (the A fragments of 4 k-steps of 16 keys) and V the
// 4 value tiles at v_tiles (wgmma RS, m64n256k16, MN-major V); issued, not committed.
__device__ __forceinline__ void Sm90IssueOwnPv(float (&o)[128], const uint32_t (&a)[4][4],
                                               uint32_t v_tiles) {
  using namespace sm90;
  const uint64_t v_desc = Opaque(MakeDesc(v_tiles, 64 * 64 * 2, 1024));
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) WgmmaM64N256K16RS(o, a[ks], v_desc + ks * (2048 >> 4));
}

// O += P V[:, half] with P the other warpgroup's K-major swizzled tile at p_tile (wgmma SS);
// issued, not committed.
__device__ __forceinline__ void Sm90IssueCrossPv(float (&o)[128], uint32_t p_tile,
                                                 uint32_t v_tiles) {
  using namespace sm90;
  const uint64_t v_desc = Opaque(MakeDesc(v_tiles, 64 * 64 * 2, 1024));
  const uint64_t p_desc = Opaque(MakeDesc(p_tile, 16, 1024));
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    WgmmaM64N256K16SS(o, p_desc + ks * (32 >> 4), v_desc + ks * (2048 >> 4));
  }
}

}  // namespace dcp::cuda
