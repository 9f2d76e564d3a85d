// The checked entry for top-k indices (DESIGN.md section 3): every index of token t is -1 or a
// request-local position in [0, token_position[t]], and none repeats within the row.
// ValidateTopkPositions is the host check (CpuDevice::ValidateTopk, and the reference of the
// CUDA check in attention/cuda/topk_validate.h); both report their first error through
// TopkErrorStatus, so a bad row reads the same on either device.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "attention/attention_params.h"

namespace dcp {

// What is wrong with the first bad row, in the order a row is checked: its token's position,
// then its columns left to right.
enum class TopkErrorKind : int32_t {
  kNone = 0,
  kNegativePosition,   // token_position[t] < 0
  kPositionPastLimit,  // token_position[t] >= max_positions
  kBelowMinusOne,      // topk[t][column] < -1
  kFutureKey,          // topk[t][column] > token_position[t]
  kRepeated,           // topk[t][column] == topk[t][earlier_column], earlier_column < column
};

// POD (the CUDA check fills it on the device). token is the caller's index (first_token + t).
struct TopkError {
  TopkErrorKind kind = TopkErrorKind::kNone;
  int32_t token = 0, column = 0, value = 0, position = 0, earlier_column = 0;
  int32_t max_positions = 0;
};

// OK for kNone, else InvalidArgument naming the token, the column and the value ("top-k ...").
absl::Status TopkErrorStatus(const TopkError& error);

// Host pointers. Errors name the token (first_token + t), the column and the offending value.
absl::Status ValidateTopkPositions(const TopkValidateParams& params);

// The same for a contiguous [num_tokens, topk_width] host array with no position limit.
absl::Status ValidateTopkPositions(const int32_t* topk, const int32_t* token_position,
                                   int num_tokens, int topk_width);

}  // namespace dcp
