// The chunk plan of the dense route's context (DESIGN.md section 6) and the row maps that
// execute it.
//
// The context (cached tokens) of the batch's prefills is cut into chunks of at most S rows.
// A chunk is a list of segments, each a range [begin, end) of one request's global context
// positions with begin a multiple of W*I; the segment takes round_up(end - begin, W*I) rows of
// the chunk's padded layout, so every rank contributes exactly its local rows of the range,
// padded to (padded rows)/W. Requests are packed several to a chunk, or split across chunks at
// multiples of W*I; no chunk is empty and none overflows S.
//
// Per chunk, on rank r:
//   local region [S/W]: row padded_offset/W + x = rank r's x-th local row of the segment
//   all-gather region [W, S/W]: rank-major copy of every rank's local region
//   reorganized keys [num_keys]: row key_offset + (g - begin) = context position g, in order
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/kv_layout.h"

namespace dcp {

struct ChunkSegment {
  int32_t request = 0;         // index of the request in the caller's list
  int64_t begin = 0, end = 0;  // global context positions [begin, end)
  int64_t padded_offset = 0;   // first row in the chunk's padded layout, multiple of W*I
  int64_t key_offset = 0;      // first row in the chunk's reorganized keys
};

struct ContextChunk {
  std::vector<ChunkSegment> segments;
  int64_t num_keys = 0;     // sum of end - begin
  int64_t padded_rows = 0;  // rows of the padded layout in use, <= S
};

// context_lengths[i]: cached tokens of request i (0: not in any chunk). rows_per_chunk (S)
// must be a positive multiple of W*I.
absl::StatusOr<std::vector<ContextChunk>> PlanContextChunks(
    absl::Span<const int64_t> context_lengths, int64_t rows_per_chunk, const KvLayout& layout);

// Rank r's local rows [first, first + count) of a segment, in the request's local order.
struct LocalRange {
  int64_t first = 0, count = 0;
};
LocalRange SegmentLocalRows(const ChunkSegment& segment, const KvLayout& layout, int rank);

// For every reorganized key of the chunk, its row in the all-gather region [W, local_rows].
std::vector<int32_t> ReorganizeIndex(const ContextChunk& chunk, int64_t local_rows,
                                     const KvLayout& layout);

}  // namespace dcp
