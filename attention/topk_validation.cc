// The checked entry for top-k positions (DESIGN.md section 3). Repeats are found with a
// per-position mark array that is cleared through the row itself, so a row costs O(topk)
// however long the request.
#include "attention/topk_validation.h"

#include <limits>
#include <vector>

#include "core/status.h"

namespace dcp {

absl::Status TopkErrorStatus(const TopkError& e) {
  switch (e.kind) {
    case TopkErrorKind::kNone:
      return absl::OkStatus();
    case TopkErrorKind::kNegativePosition:
      return DCP_ERROR(InvalidArgument, "top-k check: token %d has negative position %d", e.token,
                       e.position);
    case TopkErrorKind::kPositionPastLimit:
      return DCP_ERROR(InvalidArgument, "top-k check: token %d has position %d >= max_positions %d",
                       e.token, e.position, e.max_positions);
    case TopkErrorKind::kBelowMinusOne:
      return DCP_ERROR(InvalidArgument, "top-k index %d of token %d (column %d) is below -1",
                       e.value, e.token, e.column);
    case TopkErrorKind::kFutureKey:
      return DCP_ERROR(InvalidArgument,
                       "top-k index %d of token %d (column %d) is past the token's position %d "
                       "(a future key)",
                       e.value, e.token, e.column, e.position);
    case TopkErrorKind::kRepeated:
      return DCP_ERROR(InvalidArgument,
                       "top-k index %d of token %d is repeated (columns %d and %d)", e.value,
                       e.token, e.earlier_column, e.column);
  }
  return DCP_ERROR(Internal, "top-k check: unknown error kind %d", static_cast<int>(e.kind));
}

absl::Status ValidateTopkPositions(const TopkValidateParams& p) {
  DCP_CHECK_ARG(p.num_tokens >= 0, "ValidateTopkPositions: num_tokens (%d) < 0", p.num_tokens);
  DCP_CHECK_ARG(p.topk_width >= 0, "ValidateTopkPositions: topk_width (%d) < 0", p.topk_width);
  if (p.num_tokens == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.token_position != nullptr, "ValidateTopkPositions: token_position is null");
  DCP_CHECK_ARG(p.topk_width == 0 || p.topk != nullptr, "ValidateTopkPositions: topk is null");
  DCP_CHECK_ARG(p.topk_token_stride >= p.topk_width,
                "ValidateTopkPositions: topk_token_stride %d < topk_width %d", p.topk_token_stride,
                p.topk_width);
  std::vector<int32_t> column_of;  // column_of[j] = 1 + the column holding position j, 0 = none
  for (int t = 0; t < p.num_tokens; ++t) {
    TopkError error;
    error.token = p.first_token + t;
    error.position = p.token_position[t];
    error.max_positions = p.max_positions;
    if (error.position < 0) {
      error.kind = TopkErrorKind::kNegativePosition;
      return TopkErrorStatus(error);
    }
    if (error.position >= p.max_positions) {
      error.kind = TopkErrorKind::kPositionPastLimit;
      return TopkErrorStatus(error);
    }
    if (column_of.size() <= static_cast<size_t>(error.position)) {
      column_of.resize(size_t(error.position) + 1, 0);
    }
    const int32_t* row = p.topk + t * p.topk_token_stride;
    int c = 0;
    for (; c < p.topk_width && error.kind == TopkErrorKind::kNone; ++c) {
      const int32_t index = row[c];
      if (index == -1) continue;
      error.column = c;
      error.value = index;
      if (index < -1) {
        error.kind = TopkErrorKind::kBelowMinusOne;
      } else if (index > error.position) {
        error.kind = TopkErrorKind::kFutureKey;
      } else if (column_of[index] != 0) {
        error.kind = TopkErrorKind::kRepeated;
        error.earlier_column = column_of[index] - 1;
      } else {
        column_of[index] = c + 1;
      }
    }
    for (int i = 0; i < c; ++i) {  // clear only what this row marked
      if (row[i] >= 0 && row[i] <= error.position) column_of[row[i]] = 0;
    }
    DCP_RETURN_IF_ERROR(TopkErrorStatus(error));
  }
  return absl::OkStatus();
}

absl::Status ValidateTopkPositions(const int32_t* topk, const int32_t* token_position,
                                   int num_tokens, int topk_width) {
  TopkValidateParams p;
  p.topk = topk;
  p.token_position = token_position;
  p.num_tokens = num_tokens;
  p.topk_width = topk_width;
  p.topk_token_stride = topk_width;
  p.max_positions = std::numeric_limits<int32_t>::max();
  return ValidateTopkPositions(p);
}

}  // namespace dcp
