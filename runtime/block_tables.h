// Block tables of the requests a rank holds: a deterministic pool of block ids and one table
// per request. Tables are shared by the whole group: every rank performs the same sequence of
// AddRequest/Grow/FreeRequest calls and the allocator hands out the same ids, so a "virtual
// block" of B*W tokens has the same id on every rank and each rank keeps its B rows of it
// (DESIGN.md section 4). Storage is elsewhere (PagedKvShard on the host, the worker's device
// cache); this class only maps tokens to slots.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/kv_layout.h"

namespace dcp {

// Lowest free id first, so that equal call sequences give equal tables on every rank. Blocks
// are reference-counted: a prefix shared by several requests (BlockTables::Fork) returns to the
// pool when its last holder frees it.
class BlockAllocator {
 public:
  explicit BlockAllocator(int num_blocks);
  int num_blocks() const { return static_cast<int>(refs_.size()); }
  int num_free() const { return num_free_; }
  // Fails with ResourceExhausted (and allocates nothing) when fewer than `count` are free.
  absl::Status Allocate(int count, std::vector<int32_t>* out);
  // One more holder of each block (allocated ones only).
  void Share(absl::Span<const int32_t> blocks);
  // One holder fewer; a block nobody holds is free again.
  void Free(absl::Span<const int32_t> blocks);
  bool shared(int32_t id) const { return refs_[id] > 1; }

 private:
  std::vector<int> refs_;
  int num_free_;
  int search_from_ = 0;
};

class BlockTables {
 public:
  // block_size: B rows per block on each rank; layout and rank: how tokens map to this rank.
  BlockTables(int num_blocks, int block_size, KvLayout layout, int rank);

  int block_size() const { return block_size_; }
  const KvLayout& layout() const { return layout_; }
  // Global tokens whose rows one block holds on every rank: block k holds each rank's rows of
  // positions [k B W, (k + 1) B W) (the interleave divides B).
  int64_t tokens_per_block() const { return int64_t{block_size_} * layout_.world_size; }
  int rank() const { return rank_; }
  int num_free_blocks() const { return allocator_.num_free(); }
  int num_blocks() const { return allocator_.num_blocks(); }

  absl::Status AddRequest(int64_t request_id, int64_t capacity_tokens);
  // Makes room for `seq_len` global tokens (no-op when there is room). Blocks follow rank 0's
  // local length, the largest of any rank, so that tables agree across ranks.
  absl::Status Grow(int64_t request_id, int64_t seq_len);
  // Returns the blocks past those `seq_len` global tokens need to the pool: the same blocks on
  // every rank.
  absl::Status Shrink(int64_t request_id, int64_t seq_len);
  // Registers `request_id` holding the first `num_tokens` tokens of `from_id` (prefix caching):
  // it shares from_id's blocks of them, which must be whole on every rank (num_tokens a
  // multiple of block_size x world size), and writes its own tokens into blocks of its own.
  absl::Status Fork(int64_t request_id, int64_t from_id, int64_t num_tokens);
  // Whether keeping the first `seq_len` tokens would leave the request's last block partly
  // kept and shared with another request (a later write there would change the other's rows).
  absl::StatusOr<bool> PartlyKeptBlockIsShared(int64_t request_id, int64_t seq_len) const;
  absl::Status FreeRequest(int64_t request_id);
  bool HasRequest(int64_t request_id) const { return tables_.contains(request_id); }

  absl::StatusOr<absl::Span<const int32_t>> table(int64_t request_id) const;
  // Local rows the request's table can hold on this rank.
  absl::StatusOr<int64_t> capacity_rows(int64_t request_id) const;
  // Slot of global token g, or -1 when another rank owns it; error beyond the table.
  absl::StatusOr<int64_t> slot(int64_t request_id, int64_t g) const;

 private:
  // Blocks a request of `seq_len` global tokens holds: rank 0's local length (the largest of
  // any rank) in blocks, so that tables agree across ranks.
  int64_t BlocksFor(int64_t seq_len) const {
    return (layout_.local_length(seq_len, 0) + block_size_ - 1) / block_size_;
  }

  int block_size_;
  KvLayout layout_;
  int rank_;
  BlockAllocator allocator_;
  absl::flat_hash_map<int64_t, std::vector<int32_t>> tables_;
};

}  // namespace dcp
