// cuBLAS return codes -> Status at the call site (the shape of core/cuda/cuda_status.h):
//
//   DCP_CUBLAS_CHECK(cublasGemmStridedBatchedEx(...));
#pragma once

#include <cublas_v2.h>

#include "absl/status/status.h"
#include "core/status.h"

namespace dcp {

// OK for CUBLAS_STATUS_SUCCESS; else Internal "<call> failed: <name>: <text>".
absl::Status CublasCodeToStatus(cublasStatus_t code, const char* call, const char* file,
                                int line);

}  // namespace dcp

#define DCP_CUBLAS_CHECK(call) \
  DCP_RETURN_IF_ERROR(::dcp::CublasCodeToStatus((call), #call, __FILE__, __LINE__))
