// Top-k -> slots device code (topk_to_slots.cu's kernels; the compacting row is also run by the
// small-M GEMM's slots blocks, GemmParams::side_slots). Thread mapping. Plain form: one thread
// per (token, k) entry, grid-stride; consecutive threads
// take consecutive entries of a token's row, so the topk reads and slot writes are coalesced.
// Compacting form (valid_slots given): one CTA of 256 threads per token walks its row in
// chunks of 2048 entries, 8 a thread (below); a ballot per warp and sub-chunk and a prefix over
// the sub-chunks and warps place each valid slot at the count of valid entries before it, so
// the compacted row keeps the top-k order.
// Both may be launched as programmatic dependents (sm_90, TopkToSlots): nothing global is read
// before griddepcontrol.wait; with `trigger_dependents` the next kernel (the absorb GEMM, which
// streams its weights before its own wait) may launch as soon as this grid starts.
#pragma once

#include <cstdint>

#include "attention/attention_params.h"
#include "core/cuda/programmatic_launch.h"

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
  bool trigger_dependents;
};

inline TopkSlotArgs MakeTopkSlotArgs(const TopkToSlotsParams& p, bool trigger_dependents) {
  return TopkSlotArgs{p.topk,       p.token_request, p.token_position, p.block_tables,
                      p.slots,      p.valid_slots,   p.valid_counts,   p.num_tokens,
                      p.topk_width, p.num_requests,  p.max_blocks,     p.world_size,
                      p.interleave, p.rank,          p.block_size,     trigger_dependents};
}

__device__ __forceinline__ void TopkSlotsGridDependency(const TopkSlotArgs& a) {
  if (a.trigger_dependents) TriggerDependents();
  GridDependencyWait();
}

// The slot of top-k position `position` of a token of request `request` whose own position is
// `own` (INT64_MAX when unknown), or -1. Positions are int32, so the layout's arithmetic is
// done in 32 bits: a 64-bit division by a value known only at run time is a long emulated
// sequence, and with three per entry it was most of a 2048-entry row's time (H200, ncu).
__device__ __forceinline__ int32_t TopkPositionSlot(const TopkSlotArgs& a, int request, int64_t own,
                                                    int32_t position) {
  // A position past the token's own (invalid input) is dropped too: never a stale row.
  if (position < 0 || position > own || request < 0 || request >= a.num_requests) return -1;
  const uint32_t p = static_cast<uint32_t>(position);
  const uint32_t interleave = static_cast<uint32_t>(a.interleave);
  const uint32_t world = static_cast<uint32_t>(a.world_size);
  const uint32_t group = p / interleave;  // the interleave group; its owner is group % world
  const uint32_t round = group / world;
  if (group - round * world != static_cast<uint32_t>(a.rank)) return -1;
  // This rank's local index: round * interleave + p % interleave (< p + 1, so 32 bits).
  const uint32_t local = round * interleave + (p - group * interleave);
  const uint32_t block_size = static_cast<uint32_t>(a.block_size);
  const uint32_t block = local / block_size;
  if (block >= static_cast<uint32_t>(a.max_blocks)) return -1;
  const int64_t physical = a.block_tables[int64_t(request) * a.max_blocks + block];
  const int64_t local_slot = physical * a.block_size + (local - block * block_size);
  return (physical >= 0 && local_slot <= INT32_MAX) ? static_cast<int32_t>(local_slot) : -1;
}

__device__ __forceinline__ int64_t TokenOwnPosition(const TopkSlotArgs& a, int64_t token) {
  return a.token_position == nullptr ? INT64_MAX : a.token_position[token];
}


// The compacting form takes a token's row in chunks of kCompactThreads x kCompactPerThread
// entries (2048: DeepSeek-V3.2's whole top-k in one): thread t holds entries base + e * 256 + t,
// e < kCompactPerThread, so every load of a chunk (the positions, then the block-table entries)
// is in flight at once and coalesced, and one barrier per chunk orders the compacted writes.
// (The first version walked 256-entry chunks one after the other, a dependent round trip to
// memory for each: about 8 of them for a 2048-entry row, most of a decode token's time here.)
constexpr int kCompactThreads = 256;
constexpr int kCompactPerThread = 8;
constexpr int kCompactChunk = kCompactThreads * kCompactPerThread;

// One token's row, compacted by a block of kCompactThreads threads (every thread calls it; it
// ends after a barrier, so a block may call it for several tokens in turn). The caller has
// waited for the previous grid (griddepcontrol.wait) before.
__device__ __forceinline__ void TopkToSlotsCompactRow(const TopkSlotArgs& a, int64_t token) {
  constexpr int kWarps = kCompactThreads / 32;
  __shared__ int warp_counts[kCompactPerThread][kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned lanes_below = (1u << lane) - 1;
  const int64_t row = token * a.width;
  const int request = a.token_request[token];
  const int64_t own = TokenOwnPosition(a, token);
  int count = 0;  // valid entries before this chunk (the same in every thread)
  for (int base = 0; base < a.width; base += kCompactChunk) {
    int32_t position[kCompactPerThread];
#pragma unroll
    for (int e = 0; e < kCompactPerThread; ++e) {
      const int k = base + e * kCompactThreads + threadIdx.x;
      position[e] = k < a.width ? a.topk[row + k] : -1;
    }
    int32_t slot[kCompactPerThread];
    unsigned valid[kCompactPerThread];
#pragma unroll
    for (int e = 0; e < kCompactPerThread; ++e) {
      slot[e] = TopkPositionSlot(a, request, own, position[e]);
      const int k = base + e * kCompactThreads + threadIdx.x;
      if (k < a.width && a.slots != nullptr) a.slots[row + k] = slot[e];
      valid[e] = __ballot_sync(0xffffffffu, slot[e] >= 0);
      if (lane == 0) warp_counts[e][warp] = __popc(valid[e]);
    }
    __syncthreads();
    // Entry (e, t) goes after every valid entry of the sub-chunks before e and of the warps and
    // lanes before t in sub-chunk e.
    int before = count;
#pragma unroll
    for (int e = 0; e < kCompactPerThread; ++e) {
      int offset = before, sub_total = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        offset += w < warp ? warp_counts[e][w] : 0;
        sub_total += warp_counts[e][w];
      }
      if (slot[e] >= 0) a.valid_slots[row + offset + __popc(valid[e] & lanes_below)] = slot[e];
      before += sub_total;
    }
    count = before;
    __syncthreads();  // warp_counts is rewritten by the next chunk
  }
  for (int k = count + threadIdx.x; k < a.width; k += kCompactThreads) a.valid_slots[row + k] = -1;
  if (threadIdx.x == 0) a.valid_counts[token] = count;
}

}  // namespace dcp::cuda
