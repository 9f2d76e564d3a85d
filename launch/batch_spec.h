// The batch-spec grammar of vLLM's attention benchmarks (FORMATS.md): comma-separated terms
// `[count]q<qlen>[s<seqlen>]`, a number followed by `k` is multiplied by 1024, and seq_len
// defaults to qlen. `q2k` is one prefill of 2048 tokens, `8q1s1k` eight decodes over 1024
// tokens, `16q64s128` sixteen extends of 64 new tokens over 64 cached ones. vLLM's `_`
// separator is accepted as well as `,`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace dcp::launch {

// One request of a batch: query_len new tokens at positions [seq_len - query_len, seq_len).
struct RequestShape {
  int32_t seq_len = 0;
  int32_t query_len = 0;
  bool operator==(const RequestShape&) const = default;
};

// Requests in spec order. Errors name the spec and the offending term.
absl::StatusOr<std::vector<RequestShape>> ParseBatchSpec(std::string_view spec);

// A short description: "3 requests (1 decode, 2 prefill), 4100 tokens, max seq_len 2048".
std::string DescribeBatch(const std::vector<RequestShape>& requests, int decode_threshold);

}  // namespace dcp::launch
