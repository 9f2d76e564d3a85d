// The checked entry for top-k indices (DESIGN.md section 3): every index of token t is -1 or a
// request-local position in [0, token_position[t]], and none repeats within the row.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace dcp {

// topk: [num_tokens, topk] host; token_position: [num_tokens] host. The error names the token,
// the column and the offending value.
absl::Status ValidateTopkPositions(const int32_t* topk, const int32_t* token_position,
                                   int num_tokens, int topk_width);

}  // namespace dcp
