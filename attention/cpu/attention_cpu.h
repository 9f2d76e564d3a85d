// CPU implementations of the attention kernel families (fp32 arithmetic over fp32 or bf16
// storage), the embedded default and the CUDA kernels' host twin. Each function checks its
// params (shapes, dtypes, nullability) and returns InvalidArgument naming the problem; none
// reads memory through an out-of-range index, checked or not. Work is split over the
// machine's cores where it is large.
#pragma once

#include "absl/status/status.h"
#include "attention/attention_params.h"

namespace dcp::cpu {

absl::Status Gemm(const GemmParams& params);

absl::Status DenseMha(const DenseMhaParams& params);

// validate = true additionally rejects (InvalidArgument naming token and value) any index
// outside [-1, num_slots) or repeated within a token's row, before computing anything.
absl::Status SparseMqa(const SparseMqaParams& params, bool validate = false);

absl::Status MergeStates(const MergeStatesParams& params);
absl::Status DcpCorrect(const DcpCorrectParams& params);
absl::Status DcpCombine(const DcpCombineParams& params);

// Positions -> local slots with owner filtering; positions must already be validated
// (ValidateTopkPositions); anything outside a request's block table becomes -1.
absl::Status TopkToSlots(const TopkToSlotsParams& params);

}  // namespace dcp::cpu
