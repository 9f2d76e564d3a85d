#include "runtime/kv_cache.h"

#include <cstddef>
#include <limits>
#include <vector>

#include "core/status.h"

namespace dcp {

KvCache::KvCache(Device& device, int64_t num_blocks, int block_size, int row_width,
                 KvLayout layout, int rank, KvCacheDType format)
    : device_(device),
      tables_(static_cast<int>(num_blocks), block_size, layout, rank),
      storage_(device.storage_dtype()),
      row_width_(row_width),
      format_(format),
      num_slots_(num_blocks * block_size) {}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(Device& device, int64_t num_blocks,
                                                         int block_size, int row_width,
                                                         KvLayout layout, int rank,
                                                         KvCacheDType format) {
  DCP_RETURN_IF_ERROR(CheckKvCacheDTypeSupported(format, "KV cache"));
  DCP_CHECK_ARG(format != KvCacheDType::kFp8DsMla || row_width == fp8_ds_mla::kRowWidth,
                "fp8_ds_mla KV cache rows hold %d values, the model's rows %d",
                fp8_ds_mla::kRowWidth, row_width);
  DCP_CHECK_ARG(num_blocks >= 1 && block_size >= 1, "KV cache of %d blocks of %d rows",
                num_blocks, block_size);
  DCP_CHECK_ARG(num_blocks * block_size <= std::numeric_limits<int32_t>::max(),
                "KV cache of %d slots exceeds the int32 slot range; lower "
                "scheduler.num_kv_blocks or max_num_seqs",
                num_blocks * block_size);
  auto cache = std::unique_ptr<KvCache>(
      new KvCache(device, num_blocks, block_size, row_width, layout, rank, format));
  const size_t row_bytes = format == KvCacheDType::kFp8DsMla
                               ? size_t{fp8_ds_mla::kRowBytes}
                               : size_t(row_width) * dtype_size(cache->storage_);
  const size_t bytes = size_t(cache->num_slots_) * row_bytes;
  DCP_ASSIGN_OR_RETURN(cache->rows_, device.Allocate(bytes));
  DCP_RETURN_IF_ERROR(device.Memset(cache->rows_.data(), 0, bytes));
  return cache;
}

absl::Status KvCache::AddRequest(int64_t request_id) {
  DCP_RETURN_IF_ERROR(tables_.AddRequest(request_id, 0));
  cached_[request_id] = 0;
  return absl::OkStatus();
}

absl::Status KvCache::FreeRequest(int64_t request_id) {
  DCP_RETURN_IF_ERROR(tables_.FreeRequest(request_id));
  cached_.erase(request_id);
  return absl::OkStatus();
}

absl::Status KvCache::Truncate(int64_t request_id, int64_t num_tokens) {
  const int64_t cached = cached_tokens(request_id);
  DCP_CHECK_ARG(cached >= 0, "request %d is not registered", request_id);
  DCP_CHECK_ARG(num_tokens >= 0 && num_tokens <= cached,
                "request %d: cannot keep %d tokens, it has %d cached", request_id, num_tokens,
                cached);
  DCP_ASSIGN_OR_RETURN(const bool shared, tables_.PartlyKeptBlockIsShared(request_id, num_tokens));
  DCP_CHECK_ARG(!shared,
                "request %d: cannot keep %d tokens: the block of token %d is shared with another "
                "request (ForkRequest) and the next write there would change its rows; keep a "
                "multiple of block_size x world size = %d",
                request_id, num_tokens, num_tokens, tables_.tokens_per_block());
  DCP_RETURN_IF_ERROR(tables_.Shrink(request_id, num_tokens));
  cached_[request_id] = num_tokens;
  return absl::OkStatus();
}

absl::Status KvCache::Fork(int64_t request_id, int64_t from_id, int64_t num_tokens) {
  const int64_t cached = cached_tokens(from_id);
  DCP_CHECK_ARG(cached >= 0, "request %d is not registered", from_id);
  DCP_CHECK_ARG(num_tokens <= cached, "request %d: cannot share %d tokens, it has %d cached",
                from_id, num_tokens, cached);
  DCP_RETURN_IF_ERROR(tables_.Fork(request_id, from_id, num_tokens));
  cached_[request_id] = num_tokens;
  return absl::OkStatus();
}

int64_t KvCache::cached_tokens(int64_t request_id) const {
  auto it = cached_.find(request_id);
  return it == cached_.end() ? -1 : it->second;
}

absl::Status KvCache::Scatter(const void* rows, const std::vector<int32_t>& slots) {
  DCP_ASSIGN_OR_RETURN(int32_t* index, Upload(device_, slots_, slots));
  const int64_t n = static_cast<int64_t>(slots.size());
  if (format_ == KvCacheDType::kFp8DsMla) {
    Fp8DsMlaWriteParams p;
    p.kv_c = rows;
    p.k_pe = static_cast<const std::byte*>(rows) +
             size_t{fp8_ds_mla::kLatentDim} * dtype_size(storage_);
    p.slot_mapping = index;
    p.cache = static_cast<uint8_t*>(rows_.data());
    p.dtype = storage_;
    p.num_rows = n;
    p.num_slots = num_slots_;
    p.kv_c_row_stride = row_width_;
    p.k_pe_row_stride = row_width_;
    p.cache_row_bytes = fp8_ds_mla::kRowBytes;
    return device_.WriteFp8DsMlaRows(p);
  }
  return device_.ScatterRows({rows, index, rows_.data(), storage_, n, num_slots_, row_width_,
                              row_width_, row_width_});
}

absl::Status KvCache::Load(int64_t request_id, int64_t num_tokens, const TensorView& local_rows) {
  // Whatever was cached is replaced, into blocks of the request's own: blocks it shared
  // (Fork) keep the other requests' rows.
  DCP_RETURN_IF_ERROR(tables_.Shrink(request_id, 0));
  // The old rows are gone from here on: a failure below leaves the request with nothing cached
  // and no blocks (its blocks went back to the pool, where other requests may take them, so
  // keeping the old length would read their rows).
  cached_[request_id] = 0;
  const absl::Status loaded = [&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(tables_.Grow(request_id, num_tokens));
    DCP_ASSIGN_OR_RETURN(void* staged, Stage(device_, staged_, local_rows, storage_));
    DCP_ASSIGN_OR_RETURN(auto table, tables_.table(request_id));
    const int64_t rows = local_rows.shape.empty() ? 0 : local_rows.shape[0];
    std::vector<int32_t> slots(rows);
    for (int64_t j = 0; j < rows; ++j) {
      slots[j] = static_cast<int32_t>(slot_of_local_row(table.data(), tables_.block_size(), j));
    }
    DCP_RETURN_IF_ERROR(Scatter(staged, slots));
    return device_.Synchronize();
  }();
  if (!loaded.ok()) {
    tables_.Shrink(request_id, 0).IgnoreError();  // it shrank to 0 above: cannot fail
    return loaded;
  }
  cached_[request_id] = num_tokens;
  return absl::OkStatus();
}

absl::Status KvCache::Grow(absl::Span<const BatchRequest> batch) {
  for (size_t i = 0; i < batch.size(); ++i) {
    const absl::Status grown = tables_.Grow(batch[i].request_id, batch[i].seq_len);
    if (!grown.ok()) {
      ReleaseUncommitted(batch.subspan(0, i));  // all or nothing
      return grown;
    }
  }
  return absl::OkStatus();
}

void KvCache::ReleaseUncommitted(absl::Span<const BatchRequest> batch) {
  for (const BatchRequest& r : batch) {
    const int64_t cached = cached_tokens(r.request_id);
    if (cached >= 0) tables_.Shrink(r.request_id, cached).IgnoreError();  // never grows
  }
}

void KvCache::CommitLengths(absl::Span<const BatchRequest> batch) {
  for (const BatchRequest& r : batch) cached_[r.request_id] = r.seq_len;
}

}  // namespace dcp
