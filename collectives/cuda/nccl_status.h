// NCCL return codes -> Status at the call site, with the call's text, the rank and file:line
// (the shape of every error of this module, core/status.h):
//
//   DCP_NCCL_CHECK(ncclAllGather(...));
//
// NCCL lives in collectives/: the base CUDA headers (core/cuda/cuda_status.h) know no NCCL.
#pragma once

#include <nccl.h>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "core/status.h"

namespace dcp {

// OK for ncclSuccess; else Internal "<call> failed: <NCCL's string> (code N): <last error>".
// ncclInProgress is an error here too: callers of non-blocking communicators poll for it
// themselves (nccl_communicator.cc).
absl::Status NcclCodeToStatus(ncclResult_t code, const char* call, const char* file, int line);

// NCCL's type for a dtype of ours (every DType has one).
inline ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
  }
  return ncclFloat32;
}

}  // namespace dcp

#define DCP_NCCL_CHECK(call) \
  DCP_RETURN_IF_ERROR(::dcp::NcclCodeToStatus((call), #call, __FILE__, __LINE__))
