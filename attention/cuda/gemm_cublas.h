// Row-major strided batched GEMM (GemmParams) through cuBLAS: cublasGemmStridedBatchedEx with
// fp32 compute (CUBLAS_COMPUTE_32F: no TF32, no reduced-precision reductions). Supported
// dtypes: A and B both BF16 or both F32; C F32 or BF16. Other mixes are InvalidArgument.
// Row-major C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T, i.e. cuBLAS
// gets (B, A) swapped with (n, m); no data moves. Pointers are device memory. A F32 with B BF16
// is taken by the small-M kernel only (GemmSupports).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "attention/attention_params.h"

namespace dcp::cuda {

class GemmTuner;

// `handle` must be bound to `stream` by the caller (cublasSetStream) or is bound here.
// Shapes a small-M kernel takes (gemm_small_m.h: BF16 weights, m <= kSmallMGemmDispatchMaxM
// rows per batch entry: the 1-token decode projections) run there, in one launch with the side
// copy and no cuBLAS call; everything else goes to cuBLAS, the side copy then a copy of its
// own. The environment picks the small-M kernel, read once per process: DCP_SMALL_M_GEMM=simt
// (the default: CUDA cores, m <= kSmallMGemmDispatchMaxM), tc (tensor cores, m <=
// kSmallMTcGemmMaxM) or off (DCP_NO_SMALL_M_GEMM=1 too): switches for measuring. With a
// `tuner` (gemm_tuner.h), a shape class it has tuned runs the cuBLASLt algorithm it chose.
// GemmParams::side_slots: see GemmOverlapsSlots.
absl::Status Gemm(cublasHandle_t handle, const GemmParams& params, cudaStream_t stream,
                  GemmTuner* tuner = nullptr);

// cuBLAS's data type of a GEMM operand's dtype (BF16 or F32).
cudaDataType_t CublasType(DType dtype);

// Always cuBLAS (the peer the small-M kernel is measured against).
absl::Status GemmCublas(cublasHandle_t handle, const GemmParams& params, cudaStream_t stream);

// Whether Gemm may take a small-M kernel (false with DCP_SMALL_M_GEMM=off or
// DCP_NO_SMALL_M_GEMM set).
bool SmallMGemmEnabled();

// The kernel Gemm takes for these params: "small_m", "small_m_tc", "cublaslt" (the tuner's
// choice) or "cublas" (tests, logs).
const char* GemmKernelName(const GemmParams& params, const GemmTuner* tuner = nullptr);

// Whether Gemm takes these dtypes: A and B of one dtype always; A F32 with B BF16 (o_lat
// straight from the attention's fp32 output, no conversion launch) only where the small-M
// kernel runs (GemmKernelName is not "cublas").
bool GemmSupports(const GemmParams& params);

// Whether Gemm runs params.side_slots inside the GEMM's own launch (the small-M kernel,
// SmallMGemmTakesSlots), overlapping the two; every entry point here takes side_slots, the
// others running the step first as a launch of its own. DCP_NO_SLOTS_IN_GEMM=1 in the
// environment makes it false (read once per process: an A/B switch).
bool GemmOverlapsSlots(const GemmParams& params);

}  // namespace dcp::cuda
