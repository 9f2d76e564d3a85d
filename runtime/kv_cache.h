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
#include "core/kv_cache_format.h"
#include "core/kv_layout.h"
#include "core/tensor.h"
#include "runtime/block_tables.h"
#include "runtime/device.h"
#include "runtime/batch.h"
#include "runtime/scratch.h"

namespace dcp {

// One layer's paged KV cache as the kernels address it: block b holds slots [b*B, (b+1)*B).
// Engine-owned memory on the rank's device (host memory on CPU ranks); dcp reads and writes it
// in place. Two row formats (attention.kv_cache_dtype, FORMATS.md "KV cache formats"):
//   kBF16:     slot s is the row at data + s * row_stride ELEMENTS of dtype, [kv_c | k_pe]
//              (the storage dtype's rows: bf16 on CUDA ranks, f32 or bf16 on CPU ranks).
//   kFp8DsMla: slot s is the 656-byte fp8_ds_mla row at data + s * row_stride BYTES; row_stride
//              must be 656 (fp8_ds_mla::kRowBytes) and the data 16-byte aligned on CUDA ranks.
//              The engine writes new tokens quantized and reads rows dequantized to dtype.
// In both formats dtype is the rank's storage dtype (Device::storage_dtype). On CUDA ranks the
// data is 16-byte aligned and rows lie a multiple of 16 bytes apart (a bf16 row_stride that is a
// multiple of 8), else Run refuses the layer before writing anything (Device::CheckLayerMemory).
struct KvCacheView {
  void* data = nullptr;     // [num_blocks * block_size] rows, see above
  DType dtype = DType::kF32;  // the rank's storage dtype (Device::storage_dtype)
  int64_t num_blocks = 0;
  int block_size = 0;       // B rows per block
  int64_t row_stride = 0;   // kBF16: elements, >= R + Dr; kFp8DsMla: bytes, == 656
  KvCacheDType format = KvCacheDType::kBF16;  // must equal attention.kv_cache_dtype
  int64_t num_slots() const { return num_blocks * block_size; }
};

class KvCache {
 public:
  // num_blocks blocks of block_size rows, zeroed: rows of `device`'s storage dtype, or
  // 656-byte fp8_ds_mla rows (row_width must then be 576).
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(
      Device& device, int64_t num_blocks, int block_size, int row_width, KvLayout layout,
      int rank, KvCacheDType format = KvCacheDType::kBF16);

  absl::Status AddRequest(int64_t request_id);
  absl::Status FreeRequest(int64_t request_id);
  // Keeps the request's first num_tokens cached tokens (0 <= num_tokens <= cached) and returns
  // the blocks past them to the pool: the rows after them were drafts the engine rejected.
  // Refused where the block of token num_tokens is shared (Fork) and would be partly kept.
  absl::Status Truncate(int64_t request_id, int64_t num_tokens);
  // Registers request_id with from_id's first num_tokens cached tokens, sharing their blocks
  // (BlockTables::Fork: num_tokens a multiple of block_size x world size).
  absl::Status Fork(int64_t request_id, int64_t from_id, int64_t num_tokens);
  // Places the request's first num_tokens tokens: local_rows [local_length(num_tokens), width]
  // in local order (already checked by the caller); quantized on the way in for fp8_ds_mla.
  // On an error the request is left registered with nothing cached (its old rows are gone).
  absl::Status Load(int64_t request_id, int64_t num_tokens, const TensorView& local_rows);
  // Once a step ran: each request's cached length becomes its seq_len.
  void CommitLengths(absl::Span<const BatchRequest> batch);

  bool has_request(int64_t request_id) const { return cached_.contains(request_id); }
  // Tokens cached for the request; -1 when it is not registered.
  int64_t cached_tokens(int64_t request_id) const;
  absl::StatusOr<absl::Span<const int32_t>> table(int64_t request_id) const {
    return tables_.table(request_id);
  }
  KvCacheView view() const {
    return {rows_.data(), storage_, num_slots_ / tables_.block_size(), tables_.block_size(),
            format_ == KvCacheDType::kFp8DsMla ? int64_t{fp8_ds_mla::kRowBytes} : row_width_,
            format_};
  }
  const BlockTables& tables() const { return tables_; }
  // Grows each request of the batch to its seq_len (blocks for the new tokens): all or nothing.
  absl::Status Grow(absl::Span<const BatchRequest> batch);
  // Gives back the blocks Grow added past each request's cached length (a step that failed
  // after Grow; CommitLengths makes them the request's instead).
  void ReleaseUncommitted(absl::Span<const BatchRequest> batch);
  const KvLayout& layout() const { return tables_.layout(); }
  int rank() const { return tables_.rank(); }

 private:
  KvCache(Device& device, int64_t num_blocks, int block_size, int row_width, KvLayout layout,
          int rank, KvCacheDType format);
  absl::Status Scatter(const void* rows, const std::vector<int32_t>& slots);

  Device& device_;
  BlockTables tables_;
  DType storage_;
  int row_width_;
  KvCacheDType format_;
  int64_t num_slots_;
  Buffer rows_;  // [num_slots, row_width] of storage_, or [num_slots, 656] bytes (fp8_ds_mla)
  absl::flat_hash_map<int64_t, int64_t> cached_;  // request id -> cached tokens
  ScratchBuffer slots_, staged_;
};

}  // namespace dcp
