#include "core/cuda/cuda_status.h"

#include "absl/strings/str_format.h"

namespace dcp {

absl::Status CudaCodeToStatus(cudaError_t code, const char* call, const char* file, int line) {
  if (code == cudaSuccess) return absl::OkStatus();
  return MakeStatus(absl::StatusCode::kInternal,
                    absl::StrFormat("%s failed: %s: %s", call, cudaGetErrorName(code),
                                    cudaGetErrorString(code)),
                    file, line);
}

}  // namespace dcp
