// The warp-level building blocks of the attention kernels (sm_80+ instructions, used on sm_90a):
// 16-byte cp.async with zero fill, ldmatrix (plain and transposed), mma.sync m16n8k16 bf16 with
// fp32 accumulators, and the XOR swizzle of row-major bf16 tiles in shared memory.
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, c = lane % 4):
//   A 16x16 row-major, 4 x b32: a0 (row g, cols 2c..2c+1), a1 (row g+8, same cols),
//                               a2 (row g, cols 2c+8..),   a3 (row g+8, cols 2c+8..)
//   B 16x8 "col", 2 x b32:      b0 (k 2c..2c+1, col g),    b1 (k 2c+8.., col g)
//   C 16x8 fp32, 4 x f32:       c0 c1 (row g, cols 2c, 2c+1), c2 c3 (row g+8, cols 2c, 2c+1)
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace dcp::cuda {

__device__ __forceinline__ uint32_t SmemAddress(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared, asynchronously; valid == false writes 16 zero bytes and reads
// nothing (src-size 0), so a skipped row never touches memory.
__device__ __forceinline__ void CpAsync16(uint32_t smem, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(global),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void LdMatrixX4(uint32_t smem, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                           uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t smem, uint32_t& r0, uint32_t& r1,
                                                uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem));
}

// c += a @ b for one 16x8x16 tile.
__device__ __forceinline__ void MmaBf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&pair);
}

// Byte offset of the 16-byte chunk `chunk` of row `row` in a row-major tile of kChunks chunks
// per row (kChunks % 8 == 0). The chunk index is XORed with row % 8, so the 8 rows that one
// ldmatrix phase reads at the same column land in 8 different bank groups.
template <int kChunks>
__device__ __forceinline__ uint32_t SwizzledChunk(int row, int chunk) {
  static_assert(kChunks % 8 == 0, "swizzle needs a multiple of 8 chunks per row");
  return static_cast<uint32_t>((row * kChunks + (chunk ^ (row & 7))) * 16);
}

__device__ __forceinline__ float QuadMax(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}
__device__ __forceinline__ float QuadSum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}

}  // namespace dcp::cuda
