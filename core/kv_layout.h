// How a request's KV cache is spread over the DCP group (DESIGN.md section 4).
//
// Tokens are dealt to ranks round-robin in runs of I (the interleave): request-local token g
// belongs to rank (g / I) % W and sits at local index j = (g / (W*I)) * I + g % I there.
// Every function here is pure integer math, shared by the planner, the worker and the kernels'
// launchers; the tests check it against brute-force enumeration, never against itself.
#pragma once

#include <algorithm>
#include <cstdint>

namespace dcp {

struct KvLayout {
  int world_size = 1;  // W
  int interleave = 1;  // I

  // Rank that stores request-local token g.
  int owner(int64_t g) const { return static_cast<int>((g / interleave) % world_size); }

  // Index of token g among its owner's local rows of the request.
  int64_t local_index(int64_t g) const {
    return (g / (int64_t{world_size} * interleave)) * interleave + g % interleave;
  }

  // Inverse of local_index on rank r: the global position of local row j.
  int64_t global_index(int64_t j, int rank) const {
    return (j / interleave) * (int64_t{world_size} * interleave) + int64_t{rank} * interleave +
           j % interleave;
  }

  // Number of the first `length` tokens that rank r stores.
  int64_t local_length(int64_t length, int rank) const {
    const int64_t base = (length / interleave / world_size) * interleave;
    const int64_t remainder = length - base * world_size;
    return base + std::clamp<int64_t>(remainder - int64_t{rank} * interleave, 0, interleave);
  }
};

// slot = block_table[j / B] * B + j % B for local row j; `block_table` holds physical block ids.
inline int64_t slot_of_local_row(const int32_t* block_table, int block_size, int64_t j) {
  return int64_t{block_table[j / block_size]} * block_size + j % block_size;
}

}  // namespace dcp
