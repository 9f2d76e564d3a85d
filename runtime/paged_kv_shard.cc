#include "runtime/paged_kv_shard.h"

#include <cstring>

#include "runtime/status.h"

namespace dcp {

BlockAllocator::BlockAllocator(int num_blocks)
    : used_(static_cast<size_t>(num_blocks), false), num_free_(num_blocks) {}

absl::Status BlockAllocator::Allocate(int count, std::vector<int32_t>* out) {
  if (count > num_free_) {
    return DCP_ERROR(ResourceExhausted,
                     "out of KV blocks: %d needed, %d of %d free (raise scheduler.num_kv_blocks)",
                     count, num_free_, num_blocks());
  }
  for (int i = 0, id = search_from_; i < count; ++id) {
    if (!used_[id]) {
      used_[id] = true;
      out->push_back(id);
      ++i;
      search_from_ = id + 1;
    }
  }
  num_free_ -= count;
  return absl::OkStatus();
}

void BlockAllocator::Free(absl::Span<const int32_t> blocks) {
  for (int32_t id : blocks) {
    if (used_[id]) {
      used_[id] = false;
      ++num_free_;
      if (id < search_from_) search_from_ = id;
    }
  }
}

PagedKvShard::PagedKvShard(const KvShardConfig& config)
    : config_(config),
      allocator_(config.num_blocks),
      storage_(size_t(config.num_blocks) * config.block_size * config.row_width *
               dtype_size(config.dtype)) {}

absl::StatusOr<PagedKvShard> PagedKvShard::Create(const KvShardConfig& config) {
  DCP_CHECK_ARG(config.block_size > 0, "KV shard block_size must be positive, got %d",
                config.block_size);
  DCP_CHECK_ARG(config.num_blocks > 0, "KV shard num_blocks must be positive, got %d",
                config.num_blocks);
  DCP_CHECK_ARG(config.row_width > 0, "KV shard row_width must be positive, got %d",
                config.row_width);
  DCP_CHECK_ARG(config.dtype == DType::kF32 || config.dtype == DType::kBF16,
                "KV shard dtype must be F32 or BF16, got %s", dtype_name(config.dtype));
  DCP_CHECK_ARG(config.layout.world_size > 0 && config.layout.interleave > 0 &&
                    config.block_size % config.layout.interleave == 0,
                "KV shard layout invalid: W=%d I=%d B=%d", config.layout.world_size,
                config.layout.interleave, config.block_size);
  DCP_CHECK_ARG(config.rank >= 0 && config.rank < config.layout.world_size,
                "KV shard rank %d outside [0, %d)", config.rank, config.layout.world_size);
  return PagedKvShard(config);
}

absl::Status PagedKvShard::AddRequest(int64_t request_id, int64_t capacity_tokens) {
  DCP_CHECK_ARG(!tables_.contains(request_id), "request %d is already registered", request_id);
  DCP_CHECK_ARG(capacity_tokens >= 0, "request %d capacity must be >= 0, got %d", request_id,
                capacity_tokens);
  tables_[request_id];
  absl::Status status = Grow(request_id, capacity_tokens);
  if (!status.ok()) tables_.erase(request_id);
  return status;
}

absl::Status PagedKvShard::Grow(int64_t request_id, int64_t seq_len) {
  auto it = tables_.find(request_id);
  DCP_CHECK_ARG(it != tables_.end(), "request %d is not registered", request_id);
  // Blocks follow the largest local length of any rank so that tables agree across ranks.
  const int64_t rows = config_.layout.local_length(seq_len, 0);
  const int64_t needed = (rows + config_.block_size - 1) / config_.block_size;
  const int64_t have = static_cast<int64_t>(it->second.size());
  if (needed <= have) return absl::OkStatus();
  return allocator_.Allocate(static_cast<int>(needed - have), &it->second);
}

absl::Status PagedKvShard::FreeRequest(int64_t request_id) {
  auto it = tables_.find(request_id);
  DCP_CHECK_ARG(it != tables_.end(), "request %d is not registered", request_id);
  allocator_.Free(it->second);
  tables_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<const int32_t>> PagedKvShard::block_table(int64_t request_id) const {
  auto it = tables_.find(request_id);
  DCP_CHECK_ARG(it != tables_.end(), "request %d is not registered", request_id);
  return absl::Span<const int32_t>(it->second);
}

absl::StatusOr<int64_t> PagedKvShard::slot(int64_t request_id, int64_t g) const {
  auto it = tables_.find(request_id);
  DCP_CHECK_ARG(it != tables_.end(), "request %d is not registered", request_id);
  DCP_CHECK_ARG(g >= 0, "token %d of request %d is negative", g, request_id);
  if (config_.layout.owner(g) != config_.rank) return int64_t{-1};
  const int64_t j = config_.layout.local_index(g);
  DCP_CHECK_ARG(j < capacity_rows(it->second),
                "token %d of request %d is beyond its %d allocated local rows", g, request_id,
                capacity_rows(it->second));
  return slot_of_local_row(it->second.data(), config_.block_size, j);
}

absl::Status PagedKvShard::WriteTokens(int64_t request_id, int64_t first, int64_t count,
                                       const void* rows) {
  auto it = tables_.find(request_id);
  DCP_CHECK_ARG(it != tables_.end(), "request %d is not registered", request_id);
  DCP_CHECK_ARG(first >= 0 && count >= 0, "bad token range [%d, %d) for request %d", first,
                first + count, request_id);
  const KvLayout& layout = config_.layout;
  if (count > 0 && layout.local_length(first + count, config_.rank) > capacity_rows(it->second)) {
    return DCP_ERROR(InvalidArgument, "tokens [%d, %d) of request %d exceed its allocated blocks",
                     first, first + count, request_id);
  }
  const auto* source = static_cast<const std::byte*>(rows);
  const size_t width = row_bytes();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t g = first + i;
    if (layout.owner(g) != config_.rank) continue;
    const int64_t slot =
        slot_of_local_row(it->second.data(), config_.block_size, layout.local_index(g));
    std::memcpy(storage_.data() + slot * width, source + i * width, width);
  }
  return absl::OkStatus();
}

absl::Status PagedKvShard::ReadLocalRows(int64_t request_id, int64_t local_begin, int64_t count,
                                         void* out) const {
  auto it = tables_.find(request_id);
  DCP_CHECK_ARG(it != tables_.end(), "request %d is not registered", request_id);
  DCP_CHECK_ARG(local_begin >= 0 && count >= 0 &&
                    local_begin + count <= capacity_rows(it->second),
                "local rows [%d, %d) of request %d outside its %d allocated rows", local_begin,
                local_begin + count, request_id, capacity_rows(it->second));
  auto* target = static_cast<std::byte*>(out);
  const size_t width = row_bytes();
  for (int64_t j = 0; j < count; ++j) {
    const int64_t slot =
        slot_of_local_row(it->second.data(), config_.block_size, local_begin + j);
    std::memcpy(target + j * width, storage_.data() + slot * width, width);
  }
  return absl::OkStatus();
}

}  // namespace dcp
