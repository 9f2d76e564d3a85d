// Top-k request-local positions -> this rank's cache slots on the GPU (TopkToSlotsParams):
// KV layout of DESIGN.md section 4. A position that is -1 (or negative), owned by another rank,
// past the request's block table, or in an unassigned block (id < 0) becomes -1. Positions
// must already be validated (ValidateTopkPositions); with token_position given, a position past
// the token's own also becomes -1. A token_request outside [0, num_requests) gives a row of -1
// (the CPU twin rejects it: it is checked on the host there). With valid_slots/valid_counts
// the row is also compacted (one CTA per token, top-k order kept). Pointers are device memory.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "attention/attention_params.h"

namespace dcp::cuda {

absl::Status TopkToSlots(const TopkToSlotsParams& params, cudaStream_t stream);

// TopkToSlots' argument checks alone (sizes, rank, pointers): OK or InvalidArgument. Callers
// that run the step inside another launch (GemmParams::side_slots) check with it first.
absl::Status CheckTopkToSlots(const TopkToSlotsParams& params);

}  // namespace dcp::cuda
