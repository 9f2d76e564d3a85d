// CUDA and cuBLAS return codes -> Status at the call site, with the call's text, the rank
// and file:line (the shape of every error of this module, runtime/status.h):
//
//   DCP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
//   DCP_CUBLAS_CHECK(cublasGemmStridedBatchedEx(...));
//   DCP_CUDA_LAUNCH_CHECK("sparse_mqa");   // after a <<<>>> launch: cudaGetLastError
//
// Each macro returns the error Status from the enclosing function. The *ToStatus functions are
// for call sites that must do something before returning (abort a communicator, say).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "runtime/status.h"

namespace dcp {

// OK for cudaSuccess; else Internal "<call> failed: <name>: <description>".
absl::Status CudaCodeToStatus(cudaError_t code, const char* call, const char* file, int line);
absl::Status CublasCodeToStatus(cublasStatus_t code, const char* call, const char* file,
                                int line);

}  // namespace dcp

#define DCP_CUDA_CHECK(call) \
  DCP_RETURN_IF_ERROR(::dcp::CudaCodeToStatus((call), #call, __FILE__, __LINE__))
#define DCP_CUBLAS_CHECK(call) \
  DCP_RETURN_IF_ERROR(::dcp::CublasCodeToStatus((call), #call, __FILE__, __LINE__))
// After a kernel launch: a bad configuration (too much shared memory, a grid too large) shows
// up here, not at the launch statement.
#define DCP_CUDA_LAUNCH_CHECK(kernel_name) \
  DCP_RETURN_IF_ERROR(::dcp::CudaCodeToStatus(cudaGetLastError(), "launch of " kernel_name, \
                                              __FILE__, __LINE__))

// Transitional: NcclCodeToStatus and DCP_NCCL_CHECK moved to collectives/cuda/nccl_status.h (the
// base CUDA headers know no NCCL); this include keeps older includers building until they
// include it directly.
#include "collectives/cuda/nccl_status.h"  // IWYU pragma: export
