#include "attention/cuda/cublas_status.h"

#include "absl/strings/str_format.h"

namespace dcp {

absl::Status CublasCodeToStatus(cublasStatus_t code, const char* call, const char* file,
                                int line) {
  if (code == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return MakeStatus(absl::StatusCode::kInternal,
                    absl::StrFormat("%s failed: %s: %s", call, cublasGetStatusName(code),
                                    cublasGetStatusString(code)),
                    file, line);
}

}  // namespace dcp
