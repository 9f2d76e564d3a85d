#include "runtime/paged_kv_shard.h"

#include <cstring>

#include "runtime/status.h"

namespace dcp {

PagedKvShard::PagedKvShard(const KvShardConfig& config)
    : config_(config),
      tables_(config.num_blocks, config.block_size, config.layout, config.rank),
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
  return tables_.AddRequest(request_id, capacity_tokens);
}

absl::Status PagedKvShard::Grow(int64_t request_id, int64_t seq_len) {
  return tables_.Grow(request_id, seq_len);
}

absl::Status PagedKvShard::FreeRequest(int64_t request_id) {
  return tables_.FreeRequest(request_id);
}

absl::StatusOr<absl::Span<const int32_t>> PagedKvShard::block_table(int64_t request_id) const {
  return tables_.table(request_id);
}

absl::StatusOr<int64_t> PagedKvShard::slot(int64_t request_id, int64_t g) const {
  return tables_.slot(request_id, g);
}

absl::Status PagedKvShard::WriteTokens(int64_t request_id, int64_t first, int64_t count,
                                       const void* rows) {
  DCP_ASSIGN_OR_RETURN(const int64_t capacity, tables_.capacity_rows(request_id));
  DCP_CHECK_ARG(first >= 0 && count >= 0, "bad token range [%d, %d) for request %d", first,
                first + count, request_id);
  const KvLayout& layout = config_.layout;
  if (count > 0 && layout.local_length(first + count, config_.rank) > capacity) {
    return DCP_ERROR(InvalidArgument, "tokens [%d, %d) of request %d exceed its allocated blocks",
                     first, first + count, request_id);
  }
  const auto* source = static_cast<const std::byte*>(rows);
  const size_t width = row_bytes();
  for (int64_t i = 0; i < count; ++i) {
    DCP_ASSIGN_OR_RETURN(const int64_t slot, tables_.slot(request_id, first + i));
    if (slot < 0) continue;
    std::memcpy(storage_.data() + slot * width, source + i * width, width);
  }
  return absl::OkStatus();
}

absl::Status PagedKvShard::ReadLocalRows(int64_t request_id, int64_t local_begin, int64_t count,
                                         void* out) const {
  DCP_ASSIGN_OR_RETURN(const int64_t capacity, tables_.capacity_rows(request_id));
  DCP_ASSIGN_OR_RETURN(auto blocks, tables_.table(request_id));
  DCP_CHECK_ARG(local_begin >= 0 && count >= 0 && local_begin + count <= capacity,
                "local rows [%d, %d) of request %d outside its %d allocated rows", local_begin,
                local_begin + count, request_id, capacity);
  auto* target = static_cast<std::byte*>(out);
  const size_t width = row_bytes();
  for (int64_t j = 0; j < count; ++j) {
    const int64_t slot = slot_of_local_row(blocks.data(), config_.block_size, local_begin + j);
    std::memcpy(target + j * width, storage_.data() + slot * width, width);
  }
  return absl::OkStatus();
}

}  // namespace dcp
