// The tensor-core small-M GEMM kernel (gemm_small_m.h, GemmSmallMTc): C[h] = alpha A[h] op(B[h])
// + beta C[h] for m <= 64 rows per head, bf16 mma.sync m16n8k16 with fp32 accumulators.
//
// Block = (NT columns of C, head), 128 threads (4 warps, NT / 4 columns each: 2 or 4 n8 tiles).
// The block's whole slice of B (all of K x NT columns) is brought into shared memory with 16-byte
// cp.async in one go - the loads are issued before griddepcontrol.wait (weights are never
// written by the stream), so the weight stream overlaps the previous kernel's tail and every
// byte is in flight at once - then A (the block's m rows, converted to bf16, zero-padded to a
// multiple of 16 rows and of 16 in K) is staged, and each warp runs ceil(m / 16) x NT / 32
// row-by-column tiles of mma over K. The GEMM is bound by the weight stream: the tensor cores
// keep the arithmetic off the critical path at any m <= 64 (the CUDA-core kernel's FMAs grow
// with m).
//
// Shared memory (bf16), rows padded by 8 elements (16 bytes) so that the 8 rows one ldmatrix
// phase reads start 4 banks apart:
//   B stored [K, N] (kn):  Bs[kp][NT + 8]  rows k, ldmatrix.trans gives the "col" fragment
//   B stored [N, K] (nk):  Bs[NT][kp + 8]  rows n, plain ldmatrix gives it
//   A:                     As[16 m_tiles][kp + 8]
// kp = k rounded up to 16; rows and columns past m, k or n are zeros (cp.async zero fill).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/cuda/gemm_small_m_kernel.cuh"
#include "attention/cuda/mma_sm80.cuh"

namespace dcp::cuda {

constexpr int kSmallMTcThreads = 128;
constexpr int kSmallMTcMaxMTiles = 4;  // m <= 64

// Padded row pitches in elements.
__host__ __device__ constexpr int64_t TcKPadded(int k) { return (k + 15) / 16 * 16; }
__host__ __device__ constexpr int64_t TcBPitch(bool nk, int k, int nt) {
  return nk ? TcKPadded(k) + 8 : nt + 8;
}
__host__ __device__ constexpr int64_t TcBRows(bool nk, int k, int nt) {
  return nk ? nt : TcKPadded(k);
}
__host__ __device__ constexpr int64_t TcSharedBytes(bool nk, int m, int k, int nt) {
  const int64_t m_rows = (m + 15) / 16 * 16;
  return (TcBRows(nk, k, nt) * TcBPitch(nk, k, nt) + m_rows * (TcKPadded(k) + 8)) * 2;
}

// N8 n8 tiles (8 N8 columns) per warp, NT = 32 N8 columns per block; NK: B stored [N, K].
template <int N8, bool NK>
__global__ void __launch_bounds__(kSmallMTcThreads)
    GemmSmallMTcKernel(const GemmSmallMArgs p) {
  constexpr int kNt = 4 * 8 * N8;  // columns per block
  static_assert(N8 % 2 == 0, "x4 ldmatrix loads the fragments of two n8 tiles at once");
  extern __shared__ uint4 shared_tc[];
  __nv_bfloat16* bs = reinterpret_cast<__nv_bfloat16*>(shared_tc);
  const int head = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kp = static_cast<int>(TcKPadded(p.k));
  const int64_t b_pitch = TcBPitch(NK, p.k, kNt), b_rows = TcBRows(NK, p.k, kNt);
  __nv_bfloat16* as = bs + b_rows * b_pitch;
  const int64_t a_pitch = kp + 8;
  const int m_tiles = (p.m + 15) / 16;
  const int n_base = blockIdx.x * kNt;

  // 1. The block's B slice, all of it in flight: rows of 16-byte chunks.
  {
    const __nv_bfloat16* b = p.b + head * p.stride_b;
    const int chunks_per_row = NK ? kp / 8 : kNt / 8;
    const int chunks = static_cast<int>(b_rows) * chunks_per_row;
    for (int i = tid; i < chunks; i += kSmallMTcThreads) {
      const int row = i / chunks_per_row, chunk = i - row * chunks_per_row;
      // kn: row = k, chunk covers columns n_base + 8 chunk ..; nk: row = n, chunk covers k.
      const int64_t k = NK ? int64_t(chunk) * 8 : row;
      const int64_t n = NK ? n_base + row : n_base + int64_t(chunk) * 8;
      const bool valid = k < p.k && n < p.n;  // k % 8 == 0 (nk) and n % 8 == 0 (kn): whole
      const __nv_bfloat16* source = valid ? (NK ? b + n * p.ldb + k : b + k * p.ldb + n) : p.b;
      CpAsync16(SmemAddress(bs + row * b_pitch + chunk * 8), source, valid);
    }
    CpAsyncCommit();
  }
  GridDependencyWait();  // A and C are the previous kernel's to write until here

  // 2. A, as bf16 rows, zero-padded to 16 m_tiles rows and kp columns.
  {
    const int64_t a_base = head * p.stride_a;
    const int rows = 16 * m_tiles;
    for (int i = tid; i < rows * kp; i += kSmallMTcThreads) {
      const int m = i / kp, x = i - m * kp;
      const float value = m < p.m && x < p.k ? LoadA(p, a_base + m * p.lda + x) : 0.f;
      as[m * a_pitch + x] = __float2bfloat16_rn(value);
    }
  }
  CpAsyncWait<0>();
  __syncthreads();
  TriggerDependents();

  // 3. The warp's tiles: m_tiles x N8 n8 tiles, over K in steps of 16.
  float acc[kSmallMTcMaxMTiles][N8][4];
#pragma unroll
  for (int t = 0; t < kSmallMTcMaxMTiles; ++t) {
#pragma unroll
    for (int j = 0; j < N8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][j][e] = 0.f;
    }
  }
  const int warp_n = warp * 8 * N8;  // the warp's first column within the block
  // ldmatrix x4 addresses: matrix q = lane / 8, row r = lane % 8.
  const int q = lane >> 3, r = lane & 7;
  for (int k0 = 0; k0 < kp; k0 += 16) {
    uint32_t b[N8][2];
#pragma unroll
    for (int j = 0; j < N8; j += 2) {
      // Matrices: (k half q % 2, n tile j + q / 2).
      const int kk = k0 + (q & 1) * 8, nn = warp_n + (j + (q >> 1)) * 8;
      if constexpr (NK) {
        LdMatrixX4(SmemAddress(bs + (nn + r) * b_pitch + kk), b[j][0], b[j][1], b[j + 1][0],
                   b[j + 1][1]);
      } else {
        LdMatrixX4Trans(SmemAddress(bs + (kk + r) * b_pitch + nn), b[j][0], b[j][1],
                        b[j + 1][0], b[j + 1][1]);
      }
    }
#pragma unroll
    for (int t = 0; t < kSmallMTcMaxMTiles; ++t) {
      if (t < m_tiles) {
        uint32_t a[4];
        LdMatrixX4(SmemAddress(as + (t * 16 + (lane & 15)) * a_pitch + k0 + (lane >> 4) * 8),
                   a[0], a[1], a[2], a[3]);
#pragma unroll
        for (int j = 0; j < N8; ++j) MmaBf16(acc[t][j], a, b[j][0], b[j][1]);
      }
    }
  }

  // 4. C: rows g and g + 8 of each m tile, columns 2c, 2c + 1 of each n8 tile.
  const int g = lane >> 2, c = lane & 3;
  const int64_t c_base = head * p.stride_c;
#pragma unroll
  for (int t = 0; t < kSmallMTcMaxMTiles; ++t) {
    if (t >= m_tiles) continue;
#pragma unroll
    for (int j = 0; j < N8; ++j) {
      const int n = n_base + warp_n + j * 8 + 2 * c;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = t * 16 + g + (e >> 1) * 8, column = n + (e & 1);
        if (m < p.m && column < p.n) StoreC(p, c_base + m * p.ldc + column, acc[t][j][e]);
      }
    }
  }
  SideCopy(p);
}

}  // namespace dcp::cuda
