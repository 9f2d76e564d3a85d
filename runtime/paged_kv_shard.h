// The KV cache one CPU rank holds: a pool of blocks of B rows of width R+Dr in host memory,
// addressed through BlockTables (shared by the group, see block_tables.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/dtype.h"
#include "runtime/block_tables.h"
#include "runtime/kv_layout.h"

namespace dcp {

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
  int num_free_blocks() const { return tables_.num_free_blocks(); }

  // Registers a request and sizes its table for `capacity_tokens` global tokens.
  absl::Status AddRequest(int64_t request_id, int64_t capacity_tokens);
  // Makes room for a request of `seq_len` global tokens (no-op when it already has room).
  absl::Status Grow(int64_t request_id, int64_t seq_len);
  absl::Status FreeRequest(int64_t request_id);
  bool HasRequest(int64_t request_id) const { return tables_.HasRequest(request_id); }

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

  KvShardConfig config_;
  BlockTables tables_;
  std::vector<std::byte> storage_;
};

}  // namespace dcp
