#include "runtime/cuda/cuda_status.h"

#include "absl/strings/str_format.h"

namespace dcp {

absl::Status CudaCodeToStatus(cudaError_t code, const char* call, const char* file, int line) {
  if (code == cudaSuccess) return absl::OkStatus();
  return MakeStatus(absl::StatusCode::kInternal,
                    absl::StrFormat("%s failed: %s: %s", call, cudaGetErrorName(code),
                                    cudaGetErrorString(code)),
                    file, line);
}

absl::Status CublasCodeToStatus(cublasStatus_t code, const char* call, const char* file,
                                int line) {
  if (code == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return MakeStatus(absl::StatusCode::kInternal,
                    absl::StrFormat("%s failed: %s: %s", call, cublasGetStatusName(code),
                                    cublasGetStatusString(code)),
                    file, line);
}

}  // namespace dcp
