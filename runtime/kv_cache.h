// The rank's paged KV cache when dcp owns it (the launcher and the tests): block tables on the
// host (the same on every rank, runtime/block_tables.h), rows on the rank's Device, and each
// request's cached length. The routes read it through view() and table().
#pragma once

#include <cstdint>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/dtype.h"
#include "core/kv_layout.h"
#include "core/tensor.h"
#include "runtime/block_tables.h"
#include "runtime/device.h"
#include "runtime/plan.h"
#include "runtime/scratch.h"

namespace dcp {

// Rows of a paged cache as the kernels address them: slot s is row s.
struct KvCacheView {
  void* data = nullptr;  // [num_slots, row_width] of dtype
  DType dtype = DType::kF32;
  int64_t num_slots = 0;
  int row_width = 0;     // R + Dr
  int block_size = 0;    // B rows per block
};

class KvCache {
 public:
  // num_blocks blocks of block_size rows, zeroed, in `device`'s storage dtype.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(Device& device, int64_t num_blocks,
                                                         int block_size, int row_width,
                                                         KvLayout layout, int rank);

  absl::Status AddRequest(int64_t request_id);
  absl::Status FreeRequest(int64_t request_id);
  // Places the request's first num_tokens tokens: local_rows [local_length(num_tokens), width]
  // in local order (already checked by the caller).
  absl::Status Load(int64_t request_id, int64_t num_tokens, const TensorView& local_rows);
  // Grows every planned request to its seq_len and writes the rows of its new tokens that this
  // rank owns: kv_new [T, width] of the storage dtype on the device, caller token order.
  absl::Status WriteNewTokens(const Plan& plan, const void* kv_new);
  // Once every rank wrote: each planned request's cached length becomes its seq_len.
  void CommitLengths(const Plan& plan);

  bool has_request(int64_t request_id) const { return cached_.contains(request_id); }
  // Tokens cached for the request; -1 when it is not registered.
  int64_t cached_tokens(int64_t request_id) const;
  absl::StatusOr<absl::Span<const int32_t>> table(int64_t request_id) const {
    return tables_.table(request_id);
  }
  KvCacheView view() const {
    return {rows_.data(), storage_, num_slots_, row_width_, tables_.block_size()};
  }
  const KvLayout& layout() const { return tables_.layout(); }
  int rank() const { return tables_.rank(); }

 private:
  KvCache(Device& device, int64_t num_blocks, int block_size, int row_width, KvLayout layout,
          int rank);
  absl::Status Scatter(const void* rows, const std::vector<int32_t>& slots);

  Device& device_;
  BlockTables tables_;
  DType storage_;
  int row_width_;
  int64_t num_slots_;
  Buffer rows_;  // [num_slots, row_width] of storage_
  absl::flat_hash_map<int64_t, int64_t> cached_;  // request id -> cached tokens
  ScratchBuffer slots_, staged_;
};

}  // namespace dcp
