// The tensor-core small-M GEMM kernel (gemm_small_m.h, GemmSmallMTc): C[h] = alpha A[h] op(B[h])
// + beta C[h] for m <= 64 rows per head, bf16 mma.sync m16n8k16 with fp32 accumulators.
//
// Block = (NT columns of C, head), 128 threads (4 warps, NT / 4 columns each: 2 or 4 n8 tiles).
// The block's whole slice of B (all of K x NT columns) is brought into shared memory with 16-byte
// cp.async in one go, in commit groups of 64 rows of K - the loads are issued before
// griddepcontrol.wait (weights are never written by the stream), so the weight stream overlaps
// the previous kernel's tail and every byte is in flight at once - then A (the block's m rows,
// converted to bf16, zero-padded to a multiple of 16 rows and of 16 in K: the padding before
// the wait, the values after it with 8 loads in flight per thread) is staged, and each warp
// runs ceil(m / 16) x NT / 32 row-by-column tiles of mma over K, each group of K as soon as it
// has landed. The GEMM is bound by the weight stream: the tensor cores
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
constexpr int kKChunk = 64;            // rows of K per cp.async commit group
constexpr int kAUnroll = 8;            // A loads in flight per thread
constexpr int kMaxKGroups = 16;        // commit groups the waits are compiled for (k <= 1024)

// cp.async.wait_group takes an immediate: the runtime count of groups that may stay pending.
__device__ __forceinline__ void CpAsyncWaitPending(int pending) {
  switch (pending) {
    case 0: CpAsyncWait<0>(); break;
    case 1: CpAsyncWait<1>(); break;
    case 2: CpAsyncWait<2>(); break;
    case 3: CpAsyncWait<3>(); break;
    case 4: CpAsyncWait<4>(); break;
    case 5: CpAsyncWait<5>(); break;
    case 6: CpAsyncWait<6>(); break;
    case 7: CpAsyncWait<7>(); break;
    case 8: CpAsyncWait<8>(); break;
    case 9: CpAsyncWait<9>(); break;
    case 10: CpAsyncWait<10>(); break;
    case 11: CpAsyncWait<11>(); break;
    case 12: CpAsyncWait<12>(); break;
    case 13: CpAsyncWait<13>(); break;
    case 14: CpAsyncWait<14>(); break;
    default: CpAsyncWait<15>(); break;  // more pending than this: wait a little early
  }
}

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

  // 1. The block's B slice, all of it in flight, in commit groups of kKChunk rows of K each
  //    (kn: rows of B; nk: columns), so that the mma over the first group starts while the
  //    later ones still arrive.
  const int groups = (kp + kKChunk - 1) / kKChunk;
  {
    const __nv_bfloat16* b = p.b + head * p.stride_b;
    if constexpr (NK) {
      // Bs[n][k]: for each group, kNt rows x (kKChunk / 8) chunks.
      constexpr int kChunksPerRow = kKChunk / 8;
      for (int group = 0; group < groups; ++group) {
        for (int i = tid; i < kNt * kChunksPerRow; i += kSmallMTcThreads) {
          const int row = i / kChunksPerRow;
          const int k = group * kKChunk + (i - row * kChunksPerRow) * 8;
          const int64_t n = n_base + row;
          const bool valid = k < p.k && n < p.n;  // k % 8 == 0: a chunk is wholly in or out
          if (k < kp) {
            CpAsync16(SmemAddress(bs + row * b_pitch + k), valid ? b + n * p.ldb + k : p.b,
                      valid);
          }
        }
        CpAsyncCommit();
      }
    } else {
      // Bs[k][n]: for each group, kKChunk rows x (kNt / 8) chunks.
      constexpr int kChunksPerRow = kNt / 8;
      for (int group = 0; group < groups; ++group) {
        for (int i = tid; i < kKChunk * kChunksPerRow; i += kSmallMTcThreads) {
          const int k = group * kKChunk + i / kChunksPerRow;
          const int column = (i % kChunksPerRow) * 8;
          const int64_t n = n_base + column;
          const bool valid = k < p.k && n < p.n;  // n % 8 == 0
          if (k < kp) {
            CpAsync16(SmemAddress(bs + k * b_pitch + column), valid ? b + k * p.ldb + n : p.b,
                      valid);
          }
        }
        CpAsyncCommit();
      }
    }
  }
  // 2a. A's zero padding (rows m.., columns k..) does not depend on the previous kernel.
  {
    const int pad_chunks = (16 * m_tiles - p.m) * (kp / 8);  // whole rows, 16 bytes at a time
    for (int i = tid; i < pad_chunks; i += kSmallMTcThreads) {
      const int row = p.m + i / (kp / 8), chunk = i % (kp / 8);
      *reinterpret_cast<uint4*>(as + row * a_pitch + chunk * 8) = make_uint4(0, 0, 0, 0);
    }
    const int tail = kp - p.k;  // columns k.. of the m rows
    for (int i = tid; i < p.m * tail; i += kSmallMTcThreads) {
      const int row = i / tail;
      as[row * a_pitch + p.k + (i - row * tail)] = __float2bfloat16_rn(0.f);
    }
  }
  GridDependencyWait();  // A and C are the previous kernel's to write until here

  // 2b. A's m x k values as bf16, kAUnroll independent loads in flight per thread: 16 bytes
  //     each where A allows it (a_vector), else one element each.
  {
    const int64_t a_base = head * p.stride_a;
    if (p.a_vector) {
      const int per_vector = p.a_f32 ? 4 : 8;
      const int row_vectors = p.k / per_vector;
      const int total = p.m * row_vectors;
      for (int base = 0; base < total; base += kSmallMTcThreads * kAUnroll) {
        uint4 values[kAUnroll];
#pragma unroll
        for (int u = 0; u < kAUnroll; ++u) {
          const int i = base + u * kSmallMTcThreads + tid;
          const int m = i / row_vectors, x = (i - m * row_vectors) * per_vector;
          values[u] = i < total ? *reinterpret_cast<const uint4*>(
                                      static_cast<const char*>(p.a) +
                                      (a_base + m * p.lda + x) * (p.a_f32 ? 4 : 2))
                                : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kAUnroll; ++u) {
          const int i = base + u * kSmallMTcThreads + tid;
          if (i >= total) continue;
          const int m = i / row_vectors, x = (i - m * row_vectors) * per_vector;
          __nv_bfloat16* dst = as + m * a_pitch + x;
          if (p.a_f32) {
            const uint2 packed =
                make_uint2(PackBf16(__uint_as_float(values[u].x), __uint_as_float(values[u].y)),
                           PackBf16(__uint_as_float(values[u].z), __uint_as_float(values[u].w)));
            *reinterpret_cast<uint2*>(dst) = packed;
          } else {
            *reinterpret_cast<uint4*>(dst) = values[u];
          }
        }
      }
    } else {
      const int total = p.m * p.k;
      for (int base = 0; base < total; base += kSmallMTcThreads * kAUnroll) {
        float values[kAUnroll];
#pragma unroll
        for (int u = 0; u < kAUnroll; ++u) {
          const int i = base + u * kSmallMTcThreads + tid;
          const int m = i / p.k, x = i - m * p.k;
          values[u] = i < total ? LoadA(p, a_base + m * p.lda + x) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < kAUnroll; ++u) {
          const int i = base + u * kSmallMTcThreads + tid;
          const int m = i / p.k, x = i - m * p.k;
          if (i < total) as[m * a_pitch + x] = __float2bfloat16_rn(values[u]);
        }
      }
    }
  }
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
    if (k0 % kKChunk == 0) {
      // Group k0 / kKChunk has landed (this thread's copies), then everyone's, and A.
      CpAsyncWaitPending(groups - 1 - k0 / kKChunk);
      __syncthreads();
    }
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
