// Small-M GEMMs batched over heads: C[h] = alpha * A[h] op(B[h]) + beta * C[h] with few rows per
// head (the decode projections: M = tokens, one GEMM per head). Two kernels:
// - GemmSmallMTc (gemm_small_m_tc_kernel.cuh), m <= 64: each block brings its whole slice of
//   the weights into shared memory with cp.async (issued before the previous kernel is waited
//   for) and runs bf16 mma.sync over it; A is rounded to bf16 (as cuBLAS's path converts it).
//   Opt-in (DCP_SMALL_M_GEMM=tc: cuda::Gemm sends m <= 64 here): on the H200 it is 1-4.6 us
//   slower than cuBLAS in GPU time at every m (docs/engine_decode_latency.md), and what it
//   saves is cuBLAS's host path, which pays only in eager layers with few heads.
// - GemmSmallM (CUDA cores, below), m <= 16, A read as F32 when it is F32. The weights are streamed once
// and the rows of A applied to each weight vector as it arrives (CUDA-core FMAs, fp32
// accumulation). Row-major, strided per head exactly as GemmParams. What it buys over cuBLAS
// is not GPU time (H200, M = 1, 128 heads x 128 x 512: 7.3 us against cuBLAS's 6.5, 55%
// and 62% of copy bandwidth; docs/engine_decode_latency.md) but the call: a plain launch
// instead of cuBLAS's host path, A in F32 with BF16 weights, and a side copy in the same
// launch, which take two launches and ~30 us of host time off a decode layer.
// Supported: B BF16, A BF16 or F32 (o_lat straight from an fp32 output), trans_a false,
// 1 <= m <= kSmallMGemmMaxM, k >= 1, C F32 or BF16; B as stored [K, N] (trans_b false: N
// contiguous, n % 8 == 0) or [N, K] (trans_b true: K contiguous, k % 8 == 0); B 16-byte aligned
// with ldb and stride_b multiples of 8. A and C have no alignment needs. GemmParams::side (a byte
// copy) is done by the same launch, and GemmParams::side_slots (the compacting top-k -> slots
// step) by blocks of the same launch beside the GEMM's where SmallMGemmTakesSlots (the decode
// absorb: the step and the GEMM overlap without a second stream), else first. cuda::Gemm (gemm_cublas.h) dispatches here when SmallMGemmFits
// and m <= kSmallMGemmDispatchMaxM; call GemmSmallM directly for other m (tests, benchmarks).
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "attention/attention_params.h"

namespace dcp::cuda {

// Rows per head the small-M kernel takes (row tiles 1..16 compiled).
constexpr int kSmallMGemmMaxM = 16;
// Rows per head up to which cuda::Gemm sends a GEMM to the CUDA-core small-M kernel, from the
// H200 measurements (docs/engine_decode_latency.md): at 1 row the decode layer is faster on
// the host, eager and graph-replayed; at 2 rows the two projections' extra GPU time (~3 us)
// exceeds what the two saved launches give back in a replayed graph, so 2 and more rows go
// to cuBLAS. DCP_SMALL_M_GEMM=tc sends m <= kSmallMTcGemmMaxM to the tensor-core kernel
// instead; DCP_NO_SMALL_M_GEMM=1 (or DCP_SMALL_M_GEMM=off) sends everything to cuBLAS.
constexpr int kSmallMGemmDispatchMaxM = 1;
// Rows per head the tensor-core kernel takes (4 tiles of 16).
constexpr int kSmallMTcGemmMaxM = 64;

// Whether the tensor-core small-M kernel takes these params (same rules as SmallMGemmFits,
// m <= kSmallMTcGemmMaxM, and its shared-memory tile: K x 64 weights and 64 x K of A fit).
bool SmallMTcGemmFits(const GemmParams& params);

// Launches the tensor-core small-M kernel on `stream` (a programmatic dependent launch on
// sm_90, as GemmSmallM); InvalidArgument when !SmallMTcGemmFits.
absl::Status GemmSmallMTc(const GemmParams& params, cudaStream_t stream);

// The rules both small-M kernels share: dtypes (bf16 B; bf16 or fp32 A; fp32 or bf16 C), 1 <= m
// <= max_m, leading dimensions and strides, 16-byte aligned weight rows, a well-formed side copy.
bool SmallMGemmCommonFits(const GemmParams& params, int max_m);

// Whether the small-M kernel takes these params (dtypes, shape, alignment, shared memory).
bool SmallMGemmFits(const GemmParams& params);

// Whether GemmSmallM runs params.side_slots inside its own launch, in blocks beside the GEMM's
// (the compacting form with tokens and columns, B stored [K, N], no merged A); otherwise a
// GEMM entry point runs the step first, as a launch of its own.
bool SmallMGemmTakesSlots(const GemmParams& params);

// Launches the small-M kernel on `stream`; InvalidArgument when !SmallMGemmFits. On sm_90 it is
// a programmatic dependent launch: the weights are prefetched into L2 before the previous grid
// in the stream has finished, A and C are touched only after it.
absl::Status GemmSmallM(const GemmParams& params, cudaStream_t stream);

}  // namespace dcp::cuda
