#include "runtime/step.h"

#include <cstdint>
#include <limits>

#include "core/status.h"

namespace dcp {

absl::Status CheckStepTables(absl::Span<const BatchRequest> batch, const StepTables& tables,
                             const KvLayout& layout, int rank) {
  if (batch.empty()) return absl::OkStatus();  // an empty step reads no table
  DCP_CHECK_ARG(tables.block_size >= 1, "block tables of blocks of %d rows", tables.block_size);
  DCP_CHECK_ARG(tables.stride >= 0, "block table stride %d", tables.stride);
  for (size_t i = 0; i < batch.size(); ++i) {
    const int64_t rows = layout.local_length(batch[i].seq_len, rank);
    const int64_t needed = (rows + tables.block_size - 1) / tables.block_size;
    // A rank that holds no row of any request reads no table: at W > 1 its tables may be
    // empty ([num_requests, 0], data null).
    if (needed == 0) continue;
    DCP_CHECK_ARG(tables.data != nullptr, "the step has no block tables");
    DCP_CHECK_ARG(tables.num_blocks >= 1, "block tables over a cache of %d blocks",
                  tables.num_blocks);
    // Slots are int32 from here on (the plan's write slots, the kernels' slot lists).
    DCP_CHECK_ARG(tables.num_blocks <= std::numeric_limits<int32_t>::max() / tables.block_size,
                  "block tables over %d blocks of %d rows exceed the int32 slot range",
                  tables.num_blocks, tables.block_size);
    DCP_CHECK_ARG(needed <= tables.stride,
                  "request id %d needs %d blocks on rank %d for seq_len %d, but the block table "
                  "rows hold %d",
                  batch[i].request_id, needed, rank, batch[i].seq_len, tables.stride);
    const int32_t* row = tables.row(static_cast<int64_t>(i));
    // One branch-free pass (it vectorizes: a plan of 64 decodes over 4k tokens checks 4096
    // entries), then the first bad entry named.
    bool bad = false;
    for (int64_t b = 0; b < needed; ++b) {
      bad |= static_cast<uint64_t>(int64_t{row[b]}) >= static_cast<uint64_t>(tables.num_blocks);
    }
    for (int64_t b = 0; bad && b < needed; ++b) {
      DCP_CHECK_ARG(row[b] >= 0 && row[b] < tables.num_blocks,
                    "request id %d: block table entry %d is %d, outside the cache's %d blocks",
                    batch[i].request_id, b, row[b], tables.num_blocks);
    }
  }
  return absl::OkStatus();
}

int64_t TokenSlot(const int32_t* row, int block_size, const KvLayout& layout, int rank,
                  int64_t g) {
  if (layout.owner(g) != rank) return -1;
  return slot_of_local_row(row, block_size, layout.local_index(g));
}

}  // namespace dcp
