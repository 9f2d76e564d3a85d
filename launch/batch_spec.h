// The batch-spec grammar of vLLM's attention benchmarks (FORMATS.md), the one grammar of
// dcp_run and dcp_bench: a term is `[count]q<qlen>[kv<kvlen>]` (`s<kvlen>` is the older
// spelling of `kv`), a length followed by `k` is multiplied by 1024 (a count takes no `k`),
// kvlen defaults to qlen (a prefill). `_` joins the terms of one batch, `,` separates batches;
// no whitespace anywhere (as vLLM's parser). `q2k` is one prefill of
// 2048 tokens, `8q1kv1k` eight decodes over 1024 tokens, `16q64kv128` sixteen extends of 64
// new tokens over 64 cached ones, `2q2k_32q1kv1k` one batch of both, `q2k,8q1kv1k` two
// batches. The older form with `;` between batches and `,` between terms is refused with the
// spelling of the new one.
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

// One batch (terms joined by `_`): requests in spec order. Errors name the spec and the term.
absl::StatusOr<std::vector<RequestShape>> ParseBatchSpec(std::string_view spec);

// A list of batches (`,` between them), each checked with ParseBatchSpec: the batch specs.
absl::StatusOr<std::vector<std::string>> SplitBatchList(std::string_view list);

// A short description: "3 requests (1 decode, 2 prefill), 4100 tokens, max seq_len 2048".
std::string DescribeBatch(const std::vector<RequestShape>& requests, int decode_threshold);

}  // namespace dcp::launch
