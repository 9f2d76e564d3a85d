// TopkToSlots on CPU: request-local positions -> this rank's cache slots (DESIGN.md section 4).
// The ownership math is written out here on purpose rather than taken from core/kv_layout.h:
// a kernel twin of the CUDA code, which cannot include host helpers; the tests check both
// against brute-force enumeration.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "attention/cpu/attention_cpu.h"
#include "attention/cpu/cpu_kernel_utils.h"
#include "core/status.h"

namespace dcp::cpu {
namespace {

absl::Status CheckTopkToSlotsParams(const TopkToSlotsParams& p) {
  DCP_CHECK_ARG(p.num_tokens >= 0, "TopkToSlots: num_tokens (%d) < 0", p.num_tokens);
  DCP_CHECK_ARG(p.topk_width >= 0, "TopkToSlots: topk_width (%d) < 0", p.topk_width);
  DCP_CHECK_ARG(p.num_requests >= 0, "TopkToSlots: num_requests (%d) < 0", p.num_requests);
  DCP_CHECK_ARG(p.max_blocks >= 0, "TopkToSlots: max_blocks (%d) < 0", p.max_blocks);
  DCP_CHECK_ARG(p.world_size >= 1, "TopkToSlots: world_size (%d) must be positive", p.world_size);
  DCP_CHECK_ARG(p.rank >= 0 && p.rank < p.world_size, "TopkToSlots: rank %d outside [0, %d)",
                p.rank, p.world_size);
  DCP_CHECK_ARG(p.interleave >= 1, "TopkToSlots: interleave (%d) must be positive", p.interleave);
  DCP_CHECK_ARG(p.block_size >= 1, "TopkToSlots: block_size (%d) must be positive", p.block_size);
  if (int64_t{p.num_tokens} * p.topk_width == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.topk != nullptr, "TopkToSlots: topk is null");
  DCP_CHECK_ARG((p.valid_slots == nullptr) == (p.valid_counts == nullptr),
                "TopkToSlots: valid_slots and valid_counts go together (both or neither)");
  DCP_CHECK_ARG(p.slots != nullptr || p.valid_slots != nullptr, "TopkToSlots: slots is null");
  DCP_CHECK_ARG(p.token_request != nullptr, "TopkToSlots: token_request is null");
  DCP_CHECK_ARG(p.max_blocks == 0 || p.block_tables != nullptr,
                "TopkToSlots: block_tables is null");
  for (int t = 0; t < p.num_tokens; ++t) {
    DCP_CHECK_ARG(p.token_request[t] >= 0 && p.token_request[t] < p.num_requests,
                  "TopkToSlots: token %d: request %d outside [0, num_requests = %d)", t,
                  p.token_request[t], p.num_requests);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TopkToSlots(const TopkToSlotsParams& params) {
  DCP_RETURN_IF_ERROR(CheckTopkToSlotsParams(params));
  const TopkToSlotsParams& p = params;
  if (p.valid_counts != nullptr) std::fill_n(p.valid_counts, p.num_tokens, 0);
  if (int64_t{p.num_tokens} * p.topk_width == 0) return absl::OkStatus();
  const int64_t width = int64_t{p.world_size} * p.interleave;  // tokens of one round
  internal::ParallelFor(
      p.num_tokens, 8.0 * p.num_tokens * p.topk_width, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          const int32_t* positions = p.topk + t * p.topk_width;
          // Without a slots output (only the compacted one), a row of its own.
          std::vector<int32_t> own_row;
          int32_t* slots = nullptr;
          if (p.slots != nullptr) {
            slots = p.slots + t * p.topk_width;
          } else {
            own_row.resize(p.topk_width);
            slots = own_row.data();
          }
          const int32_t* block_table = p.block_tables + int64_t{p.token_request[t]} * p.max_blocks;
          // A position past the token's own (invalid input) is dropped too: never a stale row.
          const int64_t last = p.token_position != nullptr ? p.token_position[t]
                                                           : std::numeric_limits<int64_t>::max();
          for (int c = 0; c < p.topk_width; ++c) {
            const int64_t g = positions[c];
            slots[c] = -1;
            if (g < 0 || g > last) continue;
            if ((g / p.interleave) % p.world_size != p.rank) continue;  // another rank's token
            const int64_t local = (g / width) * p.interleave + g % p.interleave;
            const int64_t block = local / p.block_size;
            if (block >= p.max_blocks) continue;          // beyond the block table
            const int64_t physical = block_table[block];  // max_blocks > block >= 0 here
            if (physical < 0) continue;                   // unallocated block
            const int64_t slot = physical * p.block_size + local % p.block_size;
            if (slot <= std::numeric_limits<int32_t>::max()) slots[c] = static_cast<int32_t>(slot);
          }
          if (p.valid_slots != nullptr) {
            int32_t* valid = p.valid_slots + t * p.topk_width;
            int count = 0;
            for (int c = 0; c < p.topk_width; ++c) {
              if (slots[c] >= 0) valid[count++] = slots[c];
            }
            std::fill(valid + count, valid + p.topk_width, -1);
            p.valid_counts[t] = count;
          }
        }
      });
  return absl::OkStatus();
}

}  // namespace dcp::cpu
