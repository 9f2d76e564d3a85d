// What an engine tells dcp about one step, besides the batch: this rank's block tables (and,
// optionally, the slot mapping of the new tokens), in vLLM's layout.
#pragma once

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/kv_layout.h"
#include "runtime/batch.h"

namespace dcp {

// This rank's block tables for the step, one row per request of the batch (caller order).
// Row i lists the blocks of request i's local rows: local row j of the request (DESIGN.md
// section 4) is slot table[j / B] * B + j % B. Entries past the blocks a request needs are
// ignored. Host memory, read during Plan only.
struct StepTables {
  // [num_requests, stride] block ids; null (stride 0) on a rank that holds no row of any
  // request of the step (at W > 1 a rank may need no block at all).
  const int32_t* data = nullptr;
  int64_t stride = 0;             // >= the blocks any request of the step needs
  int64_t num_blocks = 0;         // the cache's blocks: every id used must be below
  int block_size = 0;             // B
  // Optional, [T] in the batch's (caller) token order: the engine's slot of each new token on
  // this rank, -1 where another rank owns it (vLLM's slot_mapping under DCP). dcp derives the
  // slots from the tables; when the engine passes its own, Plan checks that they agree and
  // refuses the step at the first token where they do not (a cache write that lands where the
  // reads do not look is a wrong answer, not an error, without it).
  const int64_t* slot_mapping = nullptr;
  const int32_t* row(int64_t i) const { return data + i * stride; }
};

// Every request's blocks exist for its seq_len on `rank` and lie in [0, num_blocks).
absl::Status CheckStepTables(absl::Span<const BatchRequest> batch, const StepTables& tables,
                             const KvLayout& layout, int rank);

// Slot of request-local token g of the request whose table row is `row`, or -1 when another
// rank owns g.
int64_t TokenSlot(const int32_t* row, int block_size, const KvLayout& layout, int rank,
                  int64_t g);

// TokenSlot of consecutive tokens first, first + 1, ... without a division per token (the
// plan's per-token loop: TokenSlot's five 64-bit divisions were ~70% of a 4 x 2k plan).
class TokenSlotWalker {
 public:
  TokenSlotWalker(const int32_t* row, int block_size, const KvLayout& layout, int rank,
                  int64_t first)
      : row_(row), block_size_(block_size), interleave_(layout.interleave),
        world_(layout.world_size), rank_(rank),
        offset_(static_cast<int>(first % layout.interleave)),
        owner_(layout.owner(first)) {
    const int64_t local = layout.local_length(first, rank);  // next owned token's local row
    block_ = local / block_size;
    in_block_ = static_cast<int>(local % block_size);
  }
  // The current token's slot (-1: another rank owns it); then moves to the next token.
  int64_t Next() {
    int64_t slot = -1;
    if (owner_ == rank_) {
      slot = int64_t{row_[block_]} * block_size_ + in_block_;
      if (++in_block_ == block_size_) in_block_ = 0, ++block_;
    }
    if (++offset_ == interleave_) {
      offset_ = 0;
      if (++owner_ == world_) owner_ = 0;
    }
    return slot;
  }
  // The next run of at most max_tokens tokens that Next would give one by one, as
  // {first slot, length}: consecutive slots (first, first + 1, ...) of one block, or -1 for
  // tokens another rank owns (first == -1). A run ends at a block's end and, with W > 1, at an
  // interleave run's end, so a plan writes a request's slots a run at a time (whole blocks at
  // W = 1) instead of a token at a time.
  struct Run {
    int64_t first;
    int length;
  };
  Run NextRun(int max_tokens) {
    // At W = 1 every token is this rank's: only the blocks cut a run.
    int length = world_ == 1 ? max_tokens : std::min(max_tokens, interleave_ - offset_);
    Run run{-1, length};
    if (owner_ == rank_) {
      length = std::min(length, block_size_ - in_block_);
      run = {int64_t{row_[block_]} * block_size_ + in_block_, length};
      in_block_ += length;
      if (in_block_ == block_size_) in_block_ = 0, ++block_;
    }
    // At W > 1 a run never crosses an interleave run's end, so 0 means it reached one.
    offset_ = static_cast<int>((int64_t{offset_} + length) % interleave_);
    if (offset_ == 0 && ++owner_ == world_) owner_ = 0;
    return run;
  }

 private:
  const int32_t* row_;
  int block_size_, interleave_, world_, rank_;
  int offset_, owner_;  // of the current token: position in its interleave run, its rank
  int64_t block_;       // the next owned token's local row: block_ * B + in_block_
  int in_block_;
};

}  // namespace dcp
