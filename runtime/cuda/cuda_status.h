// CUDA, cuBLAS and NCCL return codes -> Status at the call site, with the call's text, the rank
// and file:line (the shape of every error of this module, runtime/status.h):
//
//   DCP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
//   DCP_CUBLAS_CHECK(cublasGemmStridedBatchedEx(...));
//   DCP_NCCL_CHECK(ncclAllGather(...));
//   DCP_CUDA_LAUNCH_CHECK("sparse_mqa");   // after a <<<>>> launch: cudaGetLastError
//
// Each macro returns the error Status from the enclosing function. The *ToStatus functions are
// for call sites that must do something before returning (abort a communicator, say).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "runtime/status.h"

namespace dcp {

// OK for cudaSuccess; else Internal "<call> failed: <name>: <description>".
absl::Status CudaCodeToStatus(cudaError_t code, const char* call, const char* file, int line);
absl::Status CublasCodeToStatus(cublasStatus_t code, const char* call, const char* file,
                                int line);
// OK for ncclSuccess; ncclInProgress is also an error here (callers that use non-blocking
// communicators poll for it themselves).
absl::Status NcclCodeToStatus(ncclResult_t code, const char* call, const char* file, int line);

}  // namespace dcp

#define DCP_CUDA_CHECK(call) \
  DCP_RETURN_IF_ERROR(::dcp::CudaCodeToStatus((call), #call, __FILE__, __LINE__))
#define DCP_CUBLAS_CHECK(call) \
  DCP_RETURN_IF_ERROR(::dcp::CublasCodeToStatus((call), #call, __FILE__, __LINE__))
#define DCP_NCCL_CHECK(call) \
  DCP_RETURN_IF_ERROR(::dcp::NcclCodeToStatus((call), #call, __FILE__, __LINE__))
// After a kernel launch: a bad configuration (too much shared memory, a grid too large) shows
// up here, not at the launch statement.
#define DCP_CUDA_LAUNCH_CHECK(kernel_name) \
  DCP_RETURN_IF_ERROR(::dcp::CudaCodeToStatus(cudaGetLastError(), "launch of " kernel_name, \
                                              __FILE__, __LINE__))
