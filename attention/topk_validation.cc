// The checked entry for top-k positions (DESIGN.md section 3). Repeats are found with a
// per-position mark array that is cleared through the row itself, so a row costs O(topk)
// however long the request.
#include "attention/topk_validation.h"

#include <algorithm>
#include <vector>

#include "runtime/status.h"

namespace dcp {

absl::Status ValidateTopkPositions(const int32_t* topk, const int32_t* token_position,
                                   int num_tokens, int topk_width) {
  DCP_CHECK_ARG(num_tokens >= 0, "ValidateTopkPositions: num_tokens (%d) < 0", num_tokens);
  DCP_CHECK_ARG(topk_width >= 0, "ValidateTopkPositions: topk_width (%d) < 0", topk_width);
  if (int64_t{num_tokens} * topk_width == 0) return absl::OkStatus();
  DCP_CHECK_ARG(topk != nullptr, "ValidateTopkPositions: topk is null");
  DCP_CHECK_ARG(token_position != nullptr, "ValidateTopkPositions: token_position is null");
  std::vector<int32_t> column_of;  // column_of[j] = 1 + the column holding position j, 0 = none
  for (int t = 0; t < num_tokens; ++t) {
    const int32_t position = token_position[t];
    DCP_CHECK_ARG(position >= 0, "ValidateTopkPositions: token %d has negative position %d", t,
                  position);
    if (column_of.size() <= static_cast<size_t>(position)) column_of.resize(position + 1, 0);
    const int32_t* row = topk + int64_t{t} * topk_width;
    absl::Status status = absl::OkStatus();
    int c = 0;
    for (; c < topk_width && status.ok(); ++c) {
      const int32_t index = row[c];
      if (index == -1) continue;
      if (index < -1) {
        status = DCP_ERROR(InvalidArgument, "top-k index %d of token %d (column %d) is below -1",
                           index, t, c);
      } else if (index > position) {
        status = DCP_ERROR(InvalidArgument,
                           "top-k index %d of token %d (column %d) is past the token's position "
                           "%d (a future key)",
                           index, t, c, position);
      } else if (column_of[index] != 0) {
        status =
            DCP_ERROR(InvalidArgument, "top-k index %d of token %d is repeated (columns %d and %d)",
                      index, t, column_of[index] - 1, c);
      } else {
        column_of[index] = c + 1;
      }
    }
    for (int i = 0; i < c; ++i) {  // clear only what this row marked
      if (row[i] >= 0 && row[i] <= position) column_of[row[i]] = 0;
    }
    DCP_RETURN_IF_ERROR(status);
  }
  return absl::OkStatus();
}

}  // namespace dcp
