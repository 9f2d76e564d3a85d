// The top-k check on the GPU (TopkValidateParams; DESIGN.md section 3): the same verdict and
// message as ValidateTopkPositions (attention/topk_validation.h) without copying the top-k to
// the host. Pointers are device memory; `record` is device scratch of sizeof(TopkValidateRecord)
// owned by the caller (one per stream: calls must not share it concurrently). Synchronizes the
// stream: it returns once the verdict is on the host (one small copy).
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "attention/attention_params.h"
#include "attention/topk_validation.h"

namespace dcp::cuda {

// The first error found on the device: first_error = (row << 32) | column, all ones when none.
struct TopkValidateRecord {
  unsigned long long first_error;
  TopkError error;
};

absl::Status ValidateTopk(const TopkValidateParams& params, TopkValidateRecord* record,
                          cudaStream_t stream);

}  // namespace dcp::cuda
