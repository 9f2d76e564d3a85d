// The O store of the sm_90a sparse MQA kernel's fp32 and bf16 epilogues through shared memory
// (sparse_mqa_sm90_kernel.cuh). The m64n256 accumulator fragment leaves each thread pairs of
// adjacent columns of two rows, so stored straight from registers a warp instruction writes 8
// rows x 32 bytes (fp32) or x 16 bytes (bf16): 8 partial lines, 512 instructions a warpgroup.
// Staged, each warp writes its own 16 rows into a private slice of the Q tile's shared memory
// (free once the item's last S retired) and stores each row as 16-byte stores, 512 contiguous
// bytes a warp instruction (4 whole lines): an eighth of the L2 write requests.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "attention/cuda/wgmma_sm90.cuh"

namespace dcp::cuda {

// A staged row: 512 bytes of values + 32, so that the float2 (bf16x2) writes of a warp's 8
// rows g spread over the banks (row g starts 8 g banks on).
inline constexpr int kSm90StagePitch = 544;
inline constexpr int kSm90StageWarpBytes = 16 * kSm90StagePitch;  // a warp's 16 rows

__device__ __forceinline__ void Sm90StShared64(uint32_t smem, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(smem), "f"(x), "f"(y) : "memory");
}
__device__ __forceinline__ void Sm90StShared32(uint32_t smem, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(smem), "r"(v) : "memory");
}

// Whether a CTA starts its rows at row blockIdx.x % 16 (default), so that CTAs storing at the
// same time write different offsets of their (equally sized, equally timed) output blocks;
// -DDCP_SPARSE_MQA_O_STORE_NO_ROTATE: every CTA from row 0.
#if defined(DCP_SPARSE_MQA_O_STORE_NO_ROTATE)
inline constexpr bool kSm90OStoreRotate = false;
#else
inline constexpr bool kSm90OStoreRotate = true;
#endif

// Stores rows warp * 16 + i (i < 16, those below `heads`) of this warpgroup's 256 columns:
// out[row * head_stride + column] = o * inverse of the row, T = float or __nv_bfloat16. `out`:
// the item's row 0 at this warpgroup's first column, 16-byte aligned, head_stride * sizeof(T) a
// multiple of 16. `stage`: this warp's kSm90StageWarpBytes of shared memory, which no other
// warp touches meanwhile. o[4 j + 2 r + e] is row warp * 16 + g + 8 r, column 8 j + 2 c + e
// (g = lane / 4, c = lane % 4): the wgmma m64n256 accumulator layout.
template <class T>
__device__ __forceinline__ void Sm90StoreRowsStaged(const float (&o)[128],
                                                    const float (&inverse)[2], uint32_t stage,
                                                    T* out, int64_t head_stride, int warp, int lane,
                                                    int heads) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 2, "fp32 or bf16 rows");
  constexpr int kRounds = sizeof(T) == 4 ? 2 : 1;  // 512 bytes of each row a round
  constexpr int kSteps = 32 / kRounds;             // fragment column groups j a round
  const int g = lane / 4, c = lane % 4;
  const int rotate = kSm90OStoreRotate ? static_cast<int>(blockIdx.x % 16) : 0;
#pragma unroll
  for (int round = 0; round < kRounds; ++round) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t row_at = stage + (g + 8 * r) * kSm90StagePitch + 2 * c * sizeof(T);
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        const int j = round * kSteps + step;
        const float x = o[4 * j + 2 * r] * inverse[r], y = o[4 * j + 2 * r + 1] * inverse[r];
        if constexpr (sizeof(T) == 4) {
          Sm90StShared64(row_at + 8 * step * 4, x, y);
        } else {
          const __nv_bfloat162 xy = __floats2bfloat162_rn(x, y);
          Sm90StShared32(row_at + 8 * step * 2, *reinterpret_cast<const uint32_t*>(&xy));
        }
      }
    }
    __syncwarp();
#pragma unroll
    for (int step = 0; step < 16; ++step) {
      const int i = (step + rotate) % 16;
      const uint4 v = sm90::LdShared128(stage + i * kSm90StagePitch + 16 * lane);
      const int row = warp * 16 + i;
      if (row < heads) {
        auto* row_bytes = reinterpret_cast<char*>(out + int64_t(row) * head_stride);
        *reinterpret_cast<uint4*>(row_bytes + round * 512 + 16 * lane) = v;
      }
    }
    __syncwarp();  // the next round writes the slice again
  }
}

}  // namespace dcp::cuda
