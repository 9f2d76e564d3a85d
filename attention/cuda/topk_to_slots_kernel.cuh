// Thread mapping: one thread per (token, k) entry, grid-stride; consecutive threads take
// consecutive entries of a token's row, so the topk reads and slot writes are coalesced.
#pragma once

#include <cstdint>

namespace dcp::cuda {

__global__ void TopkToSlotsKernel(const int32_t* __restrict__ topk,
                                  const int32_t* __restrict__ token_request,
                                  const int32_t* __restrict__ token_position,
                                  const int32_t* __restrict__ block_tables,
                                  int32_t* __restrict__ slots, int num_tokens, int width,
                                  int num_requests, int max_blocks, int world_size, int interleave,
                                  int rank, int block_size) {
  const int64_t total = int64_t(num_tokens) * width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t token = i / width;
    const int64_t position = topk[i];
    int32_t slot = -1;
    const int request = token_request[token];
    // A position past the token's own (invalid input) is dropped too: never a stale row.
    const bool in_range = position >= 0 && (token_position == nullptr ||
                                             position <= token_position[token]);
    if (in_range && request >= 0 && request < num_requests &&
        (position / interleave) % world_size == rank) {
      const int64_t local = (position / (int64_t(world_size) * interleave)) * interleave +
                            position % interleave;
      const int64_t block = local / block_size;
      if (block < max_blocks) {
        const int64_t physical = block_tables[int64_t(request) * max_blocks + block];
        const int64_t local_slot = physical * block_size + local % block_size;
        if (physical >= 0 && local_slot <= INT32_MAX) slot = static_cast<int32_t>(local_slot);
      }
    }
    slots[i] = slot;
  }
}

}  // namespace dcp::cuda
