// MPI return codes -> Status at the call site, with the call's text, the rank and file:line
// (the shape of every error of this module, core/status.h):
//
//   DCP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
//
// MPI lives in collectives/ (and the launcher above it): the base headers know no MPI.
#pragma once

#include "absl/status/status.h"
#include "core/status.h"

namespace dcp {

// OK for MPI_SUCCESS; else Internal "<call> failed: <MPI's error string> (code N)". `call` is
// the source text of the call.
absl::Status MpiCodeToStatus(int code, const char* call, const char* file, int line);

}  // namespace dcp

// Wraps an MPI call: returns a Status with the call text from the enclosing function when it
// fails.
#define DCP_MPI_CHECK(call) \
  DCP_RETURN_IF_ERROR(::dcp::MpiCodeToStatus((call), #call, __FILE__, __LINE__))
