// Thread mapping. Plain form: one thread per (token, k) entry, grid-stride; consecutive threads
// take consecutive entries of a token's row, so the topk reads and slot writes are coalesced.
// Compacting form (valid_slots given): one CTA of 256 threads per token walks its row in
// chunks of 256 entries; a ballot per warp and a prefix over the 8 warps place each valid slot
// at the count of valid entries before it, so the compacted row keeps the top-k order.
#pragma once

#include <cstdint>

namespace dcp::cuda {

struct TopkSlotArgs {
  const int32_t* __restrict__ topk;
  const int32_t* __restrict__ token_request;
  const int32_t* __restrict__ token_position;
  const int32_t* __restrict__ block_tables;
  int32_t* __restrict__ slots;
  int32_t* __restrict__ valid_slots;
  int32_t* __restrict__ valid_counts;
  int num_tokens, width, num_requests, max_blocks, world_size, interleave, rank, block_size;
};

// The slot of top-k entry i (token `token`), or -1.
__device__ __forceinline__ int32_t TopkEntrySlot(const TopkSlotArgs& a, int64_t token, int64_t i) {
  const int64_t position = a.topk[i];
  const int request = a.token_request[token];
  // A position past the token's own (invalid input) is dropped too: never a stale row.
  const bool in_range =
      position >= 0 && (a.token_position == nullptr || position <= a.token_position[token]);
  if (!in_range || request < 0 || request >= a.num_requests ||
      (position / a.interleave) % a.world_size != a.rank) {
    return -1;
  }
  const int64_t local = (position / (int64_t(a.world_size) * a.interleave)) * a.interleave +
                        position % a.interleave;
  const int64_t block = local / a.block_size;
  if (block >= a.max_blocks) return -1;
  const int64_t physical = a.block_tables[int64_t(request) * a.max_blocks + block];
  const int64_t local_slot = physical * a.block_size + local % a.block_size;
  return (physical >= 0 && local_slot <= INT32_MAX) ? static_cast<int32_t>(local_slot) : -1;
}

__global__ void TopkToSlotsKernel(const TopkSlotArgs a) {
  const int64_t total = int64_t(a.num_tokens) * a.width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    a.slots[i] = TopkEntrySlot(a, i / a.width, i);
  }
}

constexpr int kCompactThreads = 256;

__global__ void __launch_bounds__(kCompactThreads) TopkToSlotsCompactKernel(const TopkSlotArgs a) {
  __shared__ int warp_counts[kCompactThreads / 32];
  const int64_t token = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = token * a.width;
  int count = 0;  // valid entries before this chunk (the same in every thread)
  for (int base = 0; base < a.width; base += kCompactThreads) {
    const int k = base + threadIdx.x;
    const int32_t slot = k < a.width ? TopkEntrySlot(a, token, row + k) : -1;
    if (k < a.width && a.slots != nullptr) a.slots[row + k] = slot;
    const unsigned valid = __ballot_sync(0xffffffffu, slot >= 0);
    if (lane == 0) warp_counts[warp] = __popc(valid);
    __syncthreads();
    int before = count;
    int chunk_total = 0;
#pragma unroll
    for (int w = 0; w < kCompactThreads / 32; ++w) {
      before += w < warp ? warp_counts[w] : 0;
      chunk_total += warp_counts[w];
    }
    if (slot >= 0) a.valid_slots[row + before + __popc(valid & ((1u << lane) - 1))] = slot;
    count += chunk_total;
    __syncthreads();  // warp_counts is rewritten by the next chunk
  }
  for (int k = count + threadIdx.x; k < a.width; k += kCompactThreads) a.valid_slots[row + k] = -1;
  if (threadIdx.x == 0) a.valid_counts[token] = count;
}

}  // namespace dcp::cuda
