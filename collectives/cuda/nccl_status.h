// NCCL return codes -> Status at the call site (the shape of core/cuda/cuda_status.h):
//
//   DCP_NCCL_CHECK(ncclAllGather(...));
#pragma once

#include <nccl.h>

#include "absl/status/status.h"
#include "core/status.h"

namespace dcp {

// OK for ncclSuccess; ncclInProgress is also an error here (callers that use non-blocking
// communicators poll for it themselves). The message carries ncclGetLastError's text.
absl::Status NcclCodeToStatus(ncclResult_t code, const char* call, const char* file, int line);

}  // namespace dcp

#define DCP_NCCL_CHECK(call) \
  DCP_RETURN_IF_ERROR(::dcp::NcclCodeToStatus((call), #call, __FILE__, __LINE__))
