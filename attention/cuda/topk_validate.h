// The top-k check on the GPU (TopkValidateParams; DESIGN.md section 3): the same verdict and
// message as ValidateTopkPositions (attention/topk_validation.h) without copying the top-k to
// the host. Pointers are device memory; `record` is device scratch of sizeof(TopkValidateRecord)
// owned by the caller (one per stream: calls must not share it concurrently). ValidateTopk
// synchronizes the stream: it returns once the verdict is on the host (one small copy).
// LaunchValidateTopk only enqueues the check and the copy of its record into `host_record`
// (pinned host memory, or the copy is not asynchronous); once the stream has passed it,
// TopkVerdict(params, record, *host_record, stream) is the same verdict. The record copied back
// holds only the first error's row and column: TopkVerdict describes an error (value, kind,
// earlier column) with one more small kernel and a synchronous copy, on the error path only,
// so the params' pointers must still be valid then.
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
absl::Status LaunchValidateTopk(const TopkValidateParams& params, TopkValidateRecord* record,
                                TopkValidateRecord* host_record, cudaStream_t stream);
absl::Status TopkVerdict(const TopkValidateParams& params, TopkValidateRecord* record,
                         TopkValidateRecord& host_record, cudaStream_t stream);

}  // namespace dcp::cuda
