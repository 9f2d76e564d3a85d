// The KV cache one CPU rank holds: a pool of blocks of B rows of width R+Dr, and one block
// table per request. Block tables are shared by the whole group: every rank performs the same
// sequence of AddRequest/Grow/FreeRequest calls and its deterministic allocator hands out the
// same block ids, so a "virtual block" of B*W tokens has the same id on every rank and each
// rank keeps its B rows of it (DESIGN.md section 4).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/dtype.h"
#include "runtime/kv_layout.h"

namespace dcp {

// Deterministic pool of block ids: the lowest free id first, so that equal call sequences
// give equal tables on every rank.
class BlockAllocator {
 public:
  explicit BlockAllocator(int num_blocks);
  int num_blocks() const { return static_cast<int>(used_.size()); }
  int num_free() const { return num_free_; }
  // Fails with ResourceExhausted (and allocates nothing) when fewer than `count` are free.
  absl::Status Allocate(int count, std::vector<int32_t>* out);
  void Free(absl::Span<const int32_t> blocks);

 private:
  std::vector<bool> used_;
  int num_free_;
  int search_from_ = 0;
};

struct KvShardConfig {
  int block_size = 64;  // B: rows per block on this rank
  int num_blocks = 0;   // blocks in this rank's pool
  int row_width = 0;    // R + Dr
  DType dtype = DType::kF32;  // F32 or BF16
  KvLayout layout;
  int rank = 0;
};

class PagedKvShard {
 public:
  static absl::StatusOr<PagedKvShard> Create(const KvShardConfig& config);

  const KvShardConfig& config() const { return config_; }
  int num_free_blocks() const { return allocator_.num_free(); }

  // Registers a request and sizes its table for `capacity_tokens` global tokens.
  absl::Status AddRequest(int64_t request_id, int64_t capacity_tokens);
  // Makes room for a request of `seq_len` global tokens (no-op when it already has room).
  absl::Status Grow(int64_t request_id, int64_t seq_len);
  absl::Status FreeRequest(int64_t request_id);
  bool HasRequest(int64_t request_id) const { return tables_.contains(request_id); }

  // Physical block ids of the request, in local-row order.
  absl::StatusOr<absl::Span<const int32_t>> block_table(int64_t request_id) const;
  // Slot of request-local global token g on this rank, or -1 when another rank owns it.
  absl::StatusOr<int64_t> slot(int64_t request_id, int64_t g) const;

  // Writes the rows this rank owns among global tokens [first, first + count) of the request.
  // rows: [count, row_width] of the shard's dtype; rows of tokens owned elsewhere are skipped.
  absl::Status WriteTokens(int64_t request_id, int64_t first, int64_t count, const void* rows);
  // Copies local rows [local_begin, local_begin + count) into out: [count, row_width].
  absl::Status ReadLocalRows(int64_t request_id, int64_t local_begin, int64_t count,
                             void* out) const;

  // Raw pool: [num_blocks * block_size, row_width] of dtype; slot s is row s.
  const std::byte* data() const { return storage_.data(); }
  std::byte* data() { return storage_.data(); }

 private:
  explicit PagedKvShard(const KvShardConfig& config);
  size_t row_bytes() const { return size_t(config_.row_width) * dtype_size(config_.dtype); }
  int64_t capacity_rows(const std::vector<int32_t>& table) const {
    return int64_t(table.size()) * config_.block_size;
  }

  KvShardConfig config_;
  BlockAllocator allocator_;
  std::vector<std::byte> storage_;
  absl::flat_hash_map<int64_t, std::vector<int32_t>> tables_;
};

}  // namespace dcp
