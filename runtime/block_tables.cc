#include "runtime/block_tables.h"

#include "core/status.h"

namespace dcp {

BlockAllocator::BlockAllocator(int num_blocks)
    : refs_(static_cast<size_t>(num_blocks), 0), num_free_(num_blocks) {}

absl::Status BlockAllocator::Allocate(int count, std::vector<int32_t>* out) {
  if (count > num_free_) {
    return DCP_ERROR(ResourceExhausted,
                     "out of KV blocks: %d needed, %d of %d free (raise scheduler.num_kv_blocks)",
                     count, num_free_, num_blocks());
  }
  for (int i = 0, id = search_from_; i < count; ++id) {
    if (refs_[id] == 0) {
      refs_[id] = 1;
      out->push_back(id);
      ++i;
      search_from_ = id + 1;
    }
  }
  num_free_ -= count;
  return absl::OkStatus();
}

void BlockAllocator::Share(absl::Span<const int32_t> blocks) {
  for (int32_t id : blocks) {
    if (refs_[id] > 0) ++refs_[id];
  }
}

void BlockAllocator::Free(absl::Span<const int32_t> blocks) {
  for (int32_t id : blocks) {
    if (refs_[id] > 0 && --refs_[id] == 0) {
      ++num_free_;
      if (id < search_from_) search_from_ = id;
    }
  }
}

BlockTables::BlockTables(int num_blocks, int block_size, KvLayout layout, int rank)
    : block_size_(block_size), layout_(layout), rank_(rank), allocator_(num_blocks) {}

absl::Status BlockTables::AddRequest(int64_t request_id, int64_t capacity_tokens) {
  DCP_CHECK_ARG(!tables_.contains(request_id), "request %d is already registered", request_id);
  DCP_CHECK_ARG(capacity_tokens >= 0, "request %d capacity must be >= 0, got %d", request_id,
                capacity_tokens);
  tables_[request_id];
  absl::Status status = Grow(request_id, capacity_tokens);
  if (!status.ok()) tables_.erase(request_id);
  return status;
}

absl::Status BlockTables::Grow(int64_t request_id, int64_t seq_len) {
  auto it = tables_.find(request_id);
  DCP_CHECK_ARG(it != tables_.end(), "request %d is not registered", request_id);
  const int64_t needed = BlocksFor(seq_len);
  const int64_t have = static_cast<int64_t>(it->second.size());
  if (needed <= have) return absl::OkStatus();
  return allocator_.Allocate(static_cast<int>(needed - have), &it->second);
}

absl::Status BlockTables::Shrink(int64_t request_id, int64_t seq_len) {
  auto it = tables_.find(request_id);
  DCP_CHECK_ARG(it != tables_.end(), "request %d is not registered", request_id);
  const int64_t needed = BlocksFor(seq_len);
  std::vector<int32_t>& blocks = it->second;
  if (needed >= static_cast<int64_t>(blocks.size())) return absl::OkStatus();
  allocator_.Free(absl::MakeConstSpan(blocks).subspan(needed));
  blocks.resize(needed);
  return absl::OkStatus();
}

absl::Status BlockTables::Fork(int64_t request_id, int64_t from_id, int64_t num_tokens) {
  DCP_CHECK_ARG(!tables_.contains(request_id), "request %d is already registered", request_id);
  auto from = tables_.find(from_id);
  DCP_CHECK_ARG(from != tables_.end(), "request %d is not registered", from_id);
  const int64_t unit = tokens_per_block();
  DCP_CHECK_ARG(num_tokens >= 0 && num_tokens % unit == 0,
                "request %d can share only whole blocks of request %d: num_tokens %d must be a "
                "multiple of block_size x world size = %d",
                request_id, from_id, num_tokens, unit);
  const int64_t blocks = BlocksFor(num_tokens);
  DCP_CHECK_ARG(blocks <= static_cast<int64_t>(from->second.size()),
                "request %d holds blocks for fewer than %d tokens", from_id, num_tokens);
  std::vector<int32_t> shared(from->second.begin(), from->second.begin() + blocks);
  allocator_.Share(shared);
  tables_[request_id] = std::move(shared);
  return absl::OkStatus();
}

absl::StatusOr<bool> BlockTables::PartlyKeptBlockIsShared(int64_t request_id,
                                                         int64_t seq_len) const {
  DCP_ASSIGN_OR_RETURN(auto blocks, table(request_id));
  // The block of position seq_len (tokens_per_block) is partly kept unless seq_len starts one.
  // Every rank answers alike.
  const int64_t unit = tokens_per_block();
  const int64_t block = seq_len / unit;
  if (seq_len % unit == 0 || block >= static_cast<int64_t>(blocks.size())) return false;
  return allocator_.shared(blocks[block]);
}

absl::Status BlockTables::FreeRequest(int64_t request_id) {
  auto it = tables_.find(request_id);
  DCP_CHECK_ARG(it != tables_.end(), "request %d is not registered", request_id);
  allocator_.Free(it->second);
  tables_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<const int32_t>> BlockTables::table(int64_t request_id) const {
  auto it = tables_.find(request_id);
  DCP_CHECK_ARG(it != tables_.end(), "request %d is not registered", request_id);
  return absl::Span<const int32_t>(it->second);
}

absl::StatusOr<int64_t> BlockTables::capacity_rows(int64_t request_id) const {
  DCP_ASSIGN_OR_RETURN(auto blocks, table(request_id));
  return static_cast<int64_t>(blocks.size()) * block_size_;
}

absl::StatusOr<int64_t> BlockTables::slot(int64_t request_id, int64_t g) const {
  DCP_ASSIGN_OR_RETURN(auto blocks, table(request_id));
  DCP_CHECK_ARG(g >= 0, "token %d of request %d is negative", g, request_id);
  if (layout_.owner(g) != rank_) return int64_t{-1};
  const int64_t j = layout_.local_index(g);
  DCP_CHECK_ARG(j < static_cast<int64_t>(blocks.size()) * block_size_,
                "token %d of request %d is beyond its allocated blocks", g, request_id);
  return slot_of_local_row(blocks.data(), block_size_, j);
}

}  // namespace dcp
