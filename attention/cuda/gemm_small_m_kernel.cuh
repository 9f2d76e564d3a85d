// Small-M GEMM kernels batched over heads (gemm_small_m.h). Each streams its head's weights B
// once, 16 bytes (8 bf16) per load, and applies all rows of A (staged as fp32 in shared memory)
// to each weight vector as it arrives: fp32 FMAs on CUDA cores, fp32 accumulation (an F32 A is
// taken as is). MT is the compiled row tile (1, 2, 4, 8 or 16 >= m); rows m..MT-1 of the tile
// are zeros, never stored.
//
// GemmSmallMKnKernel, B stored [K, N] (N contiguous): block = (8 c columns, head), 256
//   threads, c = col_threads (8, 16 or 32, picked on the host so that a thread gets about
//   KnPreload weight vectors). Thread (warp w, lane l) owns columns n0 = tile * 8c + (l % c) * 8
//   .. n0 + 7 and rows k = g, g + G, ... of B, with G = 256 / c row groups and g = w * 32 / c +
//   l / c: one warp load covers 32 / c rows x 16 c contiguous bytes. Its first KnPreload
//   vectors are loaded into registers before A is ready. The row groups' partial sums are added
//   by shuffles (the groups of a warp), then over the 8 warps through shared memory (A's space,
//   reused).
// GemmSmallMNkKernel, B stored [N, K] (K contiguous): block = (32-row tile of N, head), 256
//   threads. Warp w owns rows n = tile * 32 + 4 w + r (r < 4); lane l reads k = 8 l + 256 i of
//   each, chunk i + 1 loaded while chunk i is used (chunk 0 before A is ready); every (row, m)
//   dot product is summed over the warp by shuffles.
// Slots blocks (GemmParams::side_slots, [K, N] kernel): the grid's first slot_rows rows compact
//   one token's top-k row each (TopkToSlotsCompactRow, after griddepcontrol.wait) and exit; the
//   GEMM's blocks are the rows after them, so the step runs beside the weight stream.
// Launched as a programmatic dependent (sm_90): before griddepcontrol.wait only B is touched,
// loaded into registers or prefetched into L2 (weights are never written by the stream); A, C
// and the side copy only after it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "attention/attention_params.h"
#include "attention/cuda/lse_merge.cuh"
#include "attention/cuda/topk_to_slots_kernel.cuh"
#include "core/cuda/programmatic_launch.h"

namespace dcp::cuda {

constexpr int kSmallMThreads = 256;
constexpr int kSmallMMaxMergeSplits = 64;  // GemmParams::merge_a.splits taken
constexpr int kNkRows = 32;                // columns of C (rows of B) per block (B stored [N, K])
constexpr int kNkRowsPerWarp = 4;

struct GemmSmallMArgs {
  const void* a;           // [batch][m, k]: A[h][i][x] at a[h * stride_a + i * lda + x]
  bool a_f32;              // A's dtype: F32, else BF16
  const __nv_bfloat16* b;  // kn: [batch][k, n] at b[h * stride_b + x * ldb + j];
                           // nk: [batch][n, k] at b[h * stride_b + j * ldb + x]
  void* c;                 // [batch][m, n]: C[h][i][j] at c[h * stride_c + i * ldc + j]
  bool c_bf16;             // C's dtype: BF16, else F32
  int m, n, k;
  int col_threads;  // [K, N] kernel: threads per row of B (8, 16 or 32: 8 columns each)
  bool a_vector;    // tensor-core kernel: A read 16 bytes at a time (a, lda, stride_a and k
                    // allow it: 4 F32 or 8 BF16 elements, 16-byte aligned)
  int64_t lda, ldb, ldc;
  int64_t stride_a, stride_b, stride_c;
  float alpha, beta;  // beta == 0: C is not read
  // The side copy (GemmParams::SideCopy): side_rows rows of side_row_bytes, 16 bytes at a time
  // when side_vector (every address, pitch and the row 16-byte aligned), else bytes.
  std::byte* side_dst;
  const std::byte* side_src;
  int64_t side_dst_pitch, side_src_pitch, side_row_bytes, side_rows;
  bool side_vector;
  // A merged from split partials (GemmParams::SplitMerge; [K, N] kernel): merge_splits > 1.
  int merge_splits;
  int64_t merge_split_stride;
  const float* merge_part_lse;  // [splits, m, batch]
  float* merge_lse;             // [m, batch], row stride merge_lse_ld; written by block x 0
  int64_t merge_lse_ld;
  // Top-k -> slots beside the GEMM (GemmParams::side_slots, compacting form; [K, N] kernel):
  // the grid's first slot_rows rows of blocks are the step's, block (x, y) compacting token
  // y * gridDim.x + x (TopkToSlotsCompactRow); the GEMM's heads are rows slot_rows.. .
  TopkSlotArgs slots;
  int slot_rows;
};
static_assert(kSmallMThreads == kCompactThreads, "a slots block is a GEMM block");

// The kernels' arguments from a GemmParams: operands, dtypes, sizes, strides, scalars and the
// side copy (both launchers, gemm_small_m.cu and gemm_small_m_tc.cu; the merge of split
// partials, the column threads and the A vector flag are set by the launcher that uses them).
inline GemmSmallMArgs MakeSmallMArgs(const GemmParams& p) {
  auto aligned16 = [](const void* pointer) {
    return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
  };
  GemmSmallMArgs args{};
  args.a = p.a;
  args.a_f32 = p.a_dtype == DType::kF32;
  args.b = static_cast<const __nv_bfloat16*>(p.b);
  args.c = p.c;
  args.c_bf16 = p.c_dtype == DType::kBF16;
  args.m = p.m, args.n = p.n, args.k = p.k;
  args.lda = p.lda, args.ldb = p.ldb, args.ldc = p.ldc;
  args.stride_a = p.stride_a, args.stride_b = p.stride_b, args.stride_c = p.stride_c;
  args.alpha = p.alpha, args.beta = p.beta;
  const GemmParams::SideCopy& side = p.side;
  if (side.rows > 0 && side.row_bytes > 0) {
    args.side_dst = static_cast<std::byte*>(side.dst);
    args.side_src = static_cast<const std::byte*>(side.src);
    args.side_dst_pitch = side.dst_pitch;
    args.side_src_pitch = side.src_pitch;
    args.side_row_bytes = side.row_bytes;
    args.side_rows = side.rows;
    args.side_vector = aligned16(side.dst) && aligned16(side.src) && side.dst_pitch % 16 == 0 &&
                       side.src_pitch % 16 == 0 && side.row_bytes % 16 == 0;
  }
  return args;
}

__device__ __forceinline__ void PrefetchL2(const void* address) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(address));
}

__device__ __forceinline__ uint4 LoadWeights(const __nv_bfloat16* address) {
  return __ldg(reinterpret_cast<const uint4*>(address));
}

// 8 bf16 -> 8 floats (a bf16 is the high half of its float).
__device__ __forceinline__ void Unpack(const uint4& v, float (&w)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[2 * i] = __uint_as_float(words[i] << 16);
    w[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ float LoadA(const GemmSmallMArgs& p, int64_t index) {
  return p.a_f32 ? static_cast<const float*>(p.a)[index]
                 : __bfloat162float(static_cast<const __nv_bfloat16*>(p.a)[index]);
}

__device__ __forceinline__ void StoreC(const GemmSmallMArgs& p, int64_t index, float sum) {
  float value = p.alpha * sum;
  if (p.c_bf16) {
    __nv_bfloat16* c = static_cast<__nv_bfloat16*>(p.c) + index;
    if (p.beta != 0.f) value += p.beta * __bfloat162float(*c);
    *c = __float2bfloat16_rn(value);
  } else {
    float* c = static_cast<float*>(p.c) + index;
    if (p.beta != 0.f) value += p.beta * *c;
    *c = value;
  }
}

// The side copy, spread over every thread of the GEMM's blocks (rows slot_rows.. of the grid).
__device__ __forceinline__ void SideCopy(const GemmSmallMArgs& p) {
  if (p.side_rows == 0) return;
  const int64_t thread =
      (int64_t(blockIdx.y - p.slot_rows) * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = int64_t(gridDim.x) * (gridDim.y - p.slot_rows) * blockDim.x;
  const int64_t unit = p.side_vector ? 16 : 1;
  const int64_t per_row = p.side_row_bytes / unit;
  for (int64_t i = thread; i < p.side_rows * per_row; i += threads) {
    const int64_t row = i / per_row, offset = (i - row * per_row) * unit;
    std::byte* dst = p.side_dst + row * p.side_dst_pitch + offset;
    const std::byte* src = p.side_src + row * p.side_src_pitch + offset;
    if (p.side_vector) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      *dst = *src;
    }
  }
}

// acc[m][j] += a_row[m] * w[j] for the 8 weights of one row of B (kn kernel).
template <int MT>
__device__ __forceinline__ void FmaRow(float (&acc)[MT][8], const uint4& v, const float* a_row) {
  float w[8];
  Unpack(v, w);
  float a[MT];
  if constexpr (MT % 4 == 0) {
#pragma unroll
    for (int i = 0; i < MT / 4; ++i) {
      const float4 q = reinterpret_cast<const float4*>(a_row)[i];
      a[4 * i] = q.x, a[4 * i + 1] = q.y, a[4 * i + 2] = q.z, a[4 * i + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < MT; ++i) a[i] = a_row[i];
  }
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[m][j] = fmaf(a[m], w[j], acc[m][j]);
  }
}

// A^T [k][MT] in shared memory, each row (i, head) the LSE merge of its split partials
// (GemmParams::SplitMerge, MergeSplits' rule). A thread takes two elements of A at a time and,
// per group of kMergeGroup splits, loads the group's LSEs (L1 serves the repeats) and both
// elements' values together: one memory round trip per group, the values of an empty split
// loaded but never multiplied (they may be NaN). An online LSE merge carries across groups.
// Block x 0's thread of element 0 writes the row's merged LSE. (The first version computed
// the weights in a pass of their own and then loaded 8 splits at a time: five dependent round
// trips at 16 splits, ~4.4 us on the H200.)
constexpr int kMergeGroup = kLseMergeGroup;

template <int MT>
__device__ __forceinline__ void StageMergedA(const GemmSmallMArgs& p, int head, int64_t a_base,
                                             float* shared) {
  const float* a = static_cast<const float*>(p.a);
  const int64_t heads = gridDim.y - p.slot_rows;
  const int splits = p.merge_splits, total = MT * p.k;
  for (int i0 = threadIdx.x; i0 < total; i0 += 2 * kSmallMThreads) {
    int m[2], x[2];
    bool in[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int i = i0 + e * kSmallMThreads;
      m[e] = i < total ? i / p.k : MT;
      x[e] = i < total ? i - m[e] * p.k : 0;
      in[e] = m[e] < p.m;  // rows m..MT-1 of the tile are zeros
    }
    float top[2] = {-INFINITY, -INFINITY}, sum[2] = {0.f, 0.f}, acc[2] = {0.f, 0.f};
    for (int s0 = 0; s0 < splits; s0 += kMergeGroup) {
      float l[2][kMergeGroup], v[2][kMergeGroup];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
#pragma unroll
        for (int u = 0; u < kMergeGroup; ++u) {
          const int s = s0 + u;
          const bool load = in[e] && s < splits;
          l[e][u] = load ? SanitizeLse(p.merge_part_lse[(int64_t(s) * p.m + m[e]) * heads + head])
                         : -INFINITY;
          v[e][u] = load ? a[a_base + m[e] * p.lda + x[e] + s * p.merge_split_stride] : 0.f;
        }
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float group_top = -INFINITY;
#pragma unroll
        for (int u = 0; u < kMergeGroup; ++u) group_top = fmaxf(group_top, l[e][u]);
        if (group_top == -INFINITY) continue;  // no key in this group
        const float new_top = fmaxf(top[e], group_top);
        const float rescale = top[e] == -INFINITY ? 0.f : expf(top[e] - new_top);
        top[e] = new_top;
        sum[e] *= rescale;
        acc[e] *= rescale;
#pragma unroll
        for (int u = 0; u < kMergeGroup; ++u) {
          // A weight of 0 selects its split out: never multiplied (its values may be NaN).
          const float w = l[e][u] == -INFINITY ? 0.f : expf(l[e][u] - top[e]);
          sum[e] += w;
          if (w > 0.f) acc[e] = fmaf(w, v[e][u], acc[e]);
        }
      }
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int i = i0 + e * kSmallMThreads;
      if (i >= total) continue;
      shared[x[e] * MT + m[e]] = sum[e] > 0.f ? acc[e] / sum[e] : 0.f;
      if (in[e] && x[e] == 0 && blockIdx.x == 0) {
        p.merge_lse[m[e] * p.merge_lse_ld + head] =
            sum[e] > 0.f ? top[e] + logf(sum[e]) : -INFINITY;
      }
    }
  }
}

// Weight vectors a thread of the [K, N] kernel loads before A is ready (kept in registers).
template <int MT>
constexpr int KnPreload() {
  return MT <= 2 ? 16 : (MT <= 4 ? 8 : 4);
}

// Shared memory (floats): A^T [k][MT], then the warps' partials [8][MT][8 * col_threads].
// kMergeA: A merged from split partials (StageMergedA; compiled for MT 1 only): a separate
// instantiation, so the merge's registers do not lower the plain kernel's occupancy.
template <int MT, bool kMergeA = false>
__global__ void __launch_bounds__(kSmallMThreads, kMergeA ? 2 : 1)
    GemmSmallMKnKernel(const GemmSmallMArgs p) {
  // The merged-A variant preloads half as many weight vectors: its staging holds 2 x 16 split
  // values and LSEs, and two blocks an SM (<= 128 registers) keep the decode shapes one wave.
  constexpr int kPreload = kMergeA ? KnPreload<MT>() / 2 : KnPreload<MT>();
  if (static_cast<int>(blockIdx.y) < p.slot_rows) {  // a top-k -> slots block
    const int64_t token = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
    GridDependencyWait();
    if (token < p.slots.num_tokens) TopkToSlotsCompactRow(p.slots, token);
    return;
  }
  extern __shared__ float4 shared_kn[];
  float* shared = reinterpret_cast<float*>(shared_kn);
  const int head = blockIdx.y - p.slot_rows, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int col_threads = p.col_threads, columns = col_threads * 8;
  const int groups = kSmallMThreads / col_threads;  // row groups: split of K inside the block
  const int group = warp * (32 / col_threads) + lane / col_threads;
  const int n0 = blockIdx.x * columns + (lane % col_threads) * 8;
  const bool active = n0 < p.n;  // n % 8 == 0: a vector is wholly inside or outside
  const __nv_bfloat16* b = p.b + head * p.stride_b + n0;
  // The first kPreload weight vectors go to registers before the previous grid is waited for
  // (weights are never written by the stream), the rest towards L2: the weight stream does not
  // wait for A.
  uint4 first[kPreload];
#pragma unroll
  for (int u = 0; u < kPreload; ++u) {
    const int x = group + u * groups;
    first[u] = active && x < p.k ? LoadWeights(b + x * p.ldb) : make_uint4(0, 0, 0, 0);
  }
  if (active) {
    for (int x = group + kPreload * groups; x < p.k; x += groups) PrefetchL2(b + x * p.ldb);
  }
  GridDependencyWait();
  const int64_t a_base = head * p.stride_a;
  if constexpr (kMergeA) {
    StageMergedA<MT>(p, head, a_base, shared);
  } else {
    for (int i = tid; i < MT * p.k; i += kSmallMThreads) {
      const int m = i / p.k, x = i - m * p.k;
      shared[x * MT + m] = m < p.m ? LoadA(p, a_base + m * p.lda + x) : 0.f;
    }
  }
  __syncthreads();

  float acc[MT][8];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[m][j] = 0.f;
  }
#pragma unroll
  for (int u = 0; u < kPreload; ++u) {
    const int x = group + u * groups;
    if (x < p.k) FmaRow<MT>(acc, first[u], shared + x * MT);  // zeros when inactive
  }
  if (active) {
    int x = group + kPreload * groups;
    // Four loads in flight per thread, then their FMAs.
    for (; x + 3 * groups < p.k; x += 4 * groups) {
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = LoadWeights(b + (x + u * groups) * p.ldb);
#pragma unroll
      for (int u = 0; u < 4; ++u) FmaRow<MT>(acc, v[u], shared + (x + u * groups) * MT);
    }
    for (; x < p.k; x += groups) FmaRow<MT>(acc, LoadWeights(b + x * p.ldb), shared + x * MT);
  }
  TriggerDependents();
  // The row groups of the warp (lanes l, l ^ col_threads, ...).
  for (int offset = col_threads; offset < 32; offset *= 2) {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[m][j] += __shfl_xor_sync(0xffffffffu, acc[m][j], offset);
    }
  }
  __syncthreads();  // A's space becomes the partials
  if (lane < col_threads) {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float4* dst = reinterpret_cast<float4*>(shared + (warp * MT + m) * columns + lane * 8);
      dst[0] = make_float4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]);
      dst[1] = make_float4(acc[m][4], acc[m][5], acc[m][6], acc[m][7]);
    }
  }
  __syncthreads();
  for (int i = tid; i < MT * columns; i += kSmallMThreads) {
    const int m = i / columns, column = i - m * columns;
    const int n = blockIdx.x * columns + column;
    if (m >= p.m || n >= p.n) continue;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kSmallMThreads / 32; ++w) sum += shared[(w * MT + m) * columns + column];
    StoreC(p, head * p.stride_c + m * p.ldc + n, sum);
  }
  SideCopy(p);
}

// Shared memory (floats): A [MT][k] (k % 8 == 0, so each row is 32-byte aligned).
template <int MT>
__global__ void __launch_bounds__(kSmallMThreads) GemmSmallMNkKernel(const GemmSmallMArgs p) {
  extern __shared__ float4 shared_nk[];
  float* shared = reinterpret_cast<float*>(shared_nk);
  const int head = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int first = blockIdx.x * kNkRows + warp * kNkRowsPerWarp;
  const __nv_bfloat16* b = p.b + head * p.stride_b;
  // Software pipelined over the lane's chunks of K (x = 8 lane + 256 i): chunk i + 1 is loaded
  // before chunk i is used; chunk 0 before A is ready (weights are never written by the stream).
  auto load = [&](int x, uint4(&v)[kNkRowsPerWarp]) {
#pragma unroll
    for (int r = 0; r < kNkRowsPerWarp; ++r) {
      v[r] = first + r < p.n && x < p.k ? LoadWeights(b + (first + r) * p.ldb + x)
                                        : make_uint4(0, 0, 0, 0);
    }
  };
  uint4 current[kNkRowsPerWarp];
  load(lane * 8, current);
  GridDependencyWait();
  const int64_t a_base = head * p.stride_a;
  for (int i = tid; i < MT * p.k; i += kSmallMThreads) {
    const int m = i / p.k, x = i - m * p.k;
    shared[i] = m < p.m ? LoadA(p, a_base + m * p.lda + x) : 0.f;
  }
  __syncthreads();

  float acc[kNkRowsPerWarp][MT];
#pragma unroll
  for (int r = 0; r < kNkRowsPerWarp; ++r) {
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.f;
  }
  for (int x = lane * 8; x < p.k; x += 256) {
    uint4 next[kNkRowsPerWarp];
    load(x + 256, next);
    float w[kNkRowsPerWarp][8];
#pragma unroll
    for (int r = 0; r < kNkRowsPerWarp; ++r) Unpack(current[r], w[r]);
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const float4 lo = *reinterpret_cast<const float4*>(shared + m * p.k + x);
      const float4 hi = *reinterpret_cast<const float4*>(shared + m * p.k + x + 4);
      const float a[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int r = 0; r < kNkRowsPerWarp; ++r) {
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r][m] = fmaf(a[j], w[r][j], acc[r][m]);
      }
    }
#pragma unroll
    for (int r = 0; r < kNkRowsPerWarp; ++r) current[r] = next[r];
  }
  TriggerDependents();
#pragma unroll
  for (int r = 0; r < kNkRowsPerWarp; ++r) {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) {
        acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], offset);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kNkRowsPerWarp; ++r) {
    const int n = first + r;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      if (lane == m && m < p.m && n < p.n) StoreC(p, head * p.stride_c + m * p.ldc + n, acc[r][m]);
    }
  }
  SideCopy(p);
}

}  // namespace dcp::cuda
