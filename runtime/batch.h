// What a batch is, as every rank sees it: requests with their lengths, and the route names.
#pragma once

#include <cstdint>

namespace dcp {

// One request of a batch: query_len new tokens at positions [seq_len - query_len, seq_len).
struct BatchRequest {
  int64_t request_id = 0;
  int32_t seq_len = 0;
  int32_t query_len = 0;
};

enum class Route : int32_t { kSparseMqa = 0, kDenseMha = 1 };

inline const char* route_name(Route route) {
  return route == Route::kDenseMha ? "dense_mha" : "sparse_mqa";
}

}  // namespace dcp
