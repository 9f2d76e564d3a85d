#include "collectives/mpi_status.h"

#include <mpi.h>

#include "absl/strings/str_format.h"

namespace dcp {

absl::Status MpiCodeToStatus(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    absl::SNPrintF(text, sizeof(text), "unknown MPI error");
  }
  return MakeStatus(absl::StatusCode::kInternal,
                    absl::StrFormat("%s failed: %s (code %d)", call, text, code), file, line);
}

}  // namespace dcp
