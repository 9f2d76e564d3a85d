// CUDA runtime return codes -> Status at the call site, with the call's text, the rank and
// file:line (the shape of every error of this module, core/status.h):
//
//   DCP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
//   DCP_CUDA_LAUNCH_CHECK("sparse_mqa");   // after a <<<>>> launch: cudaGetLastError
//
// Each macro returns the error Status from the enclosing function; CudaCodeToStatus is for call
// sites that must do something before returning. cuBLAS and NCCL codes are mapped next to their
// users: attention/cuda/cublas_status.h, collectives/cuda/nccl_status.h.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "core/status.h"

namespace dcp {

// OK for cudaSuccess; else Internal "<call> failed: <name>: <description>".
absl::Status CudaCodeToStatus(cudaError_t code, const char* call, const char* file, int line);

}  // namespace dcp

#define DCP_CUDA_CHECK(call) \
  DCP_RETURN_IF_ERROR(::dcp::CudaCodeToStatus((call), #call, __FILE__, __LINE__))
// After a kernel launch: a bad configuration (too much shared memory, a grid too large) shows
// up here, not at the launch statement.
#define DCP_CUDA_LAUNCH_CHECK(kernel_name) \
  DCP_RETURN_IF_ERROR(::dcp::CudaCodeToStatus(cudaGetLastError(), "launch of " kernel_name, \
                                              __FILE__, __LINE__))
