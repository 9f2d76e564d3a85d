// What an engine tells dcp about one step, besides the batch: this rank's block tables (and,
// optionally, the slot mapping of the new tokens), in vLLM's layout.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/kv_layout.h"
#include "runtime/batch.h"

namespace dcp {

// This rank's block tables for the step, one row per request of the batch (caller order).
// Row i lists the blocks of request i's local rows: local row j of the request (DESIGN.md
// section 4) is slot table[j / B] * B + j % B. Entries past the blocks a request needs are
// ignored. Host memory, read during Plan only.
struct StepTables {
  const int32_t* data = nullptr;  // [num_requests, stride] block ids
  int64_t stride = 0;             // >= the blocks any request of the step needs
  int64_t num_blocks = 0;         // the cache's blocks: every id used must be below
  int block_size = 0;             // B
  const int32_t* row(int64_t i) const { return data + i * stride; }
};

// Every request's blocks exist for its seq_len on `rank` and lie in [0, num_blocks).
absl::Status CheckStepTables(absl::Span<const BatchRequest> batch, const StepTables& tables,
                             const KvLayout& layout, int rank);

// Slot of request-local token g of the request whose table row is `row`, or -1 when another
// rank owns g.
int64_t TokenSlot(const int32_t* row, int block_size, const KvLayout& layout, int rank,
                  int64_t g);

}  // namespace dcp
