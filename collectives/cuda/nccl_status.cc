#include "collectives/cuda/nccl_status.h"

#include "absl/strings/str_format.h"

namespace dcp {

absl::Status NcclCodeToStatus(ncclResult_t code, const char* call, const char* file, int line) {
  if (code == ncclSuccess) return absl::OkStatus();
  const char* last = ncclGetLastError(nullptr);
  return MakeStatus(
      absl::StatusCode::kInternal,
      absl::StrFormat("%s failed: %s (code %d)%s%s", call, ncclGetErrorString(code),
                      static_cast<int>(code), last && *last ? ": " : "", last ? last : ""),
      file, line);
}

}  // namespace dcp
