#include "workspace/chunk_plan.h"

#include <algorithm>

#include "core/status.h"

namespace dcp {

absl::StatusOr<std::vector<ContextChunk>> PlanContextChunks(
    absl::Span<const int64_t> context_lengths, int64_t rows_per_chunk, const KvLayout& layout) {
  const int64_t unit = int64_t{layout.world_size} * layout.interleave;
  DCP_CHECK_ARG(rows_per_chunk > 0 && rows_per_chunk % unit == 0,
                "workspace rows per chunk (%d) must be a positive multiple of W*I (%d)",
                rows_per_chunk, unit);
  std::vector<ContextChunk> chunks;
  ContextChunk current;
  auto flush = [&] {
    if (!current.segments.empty()) chunks.push_back(std::move(current));
    current = ContextChunk{};
  };
  for (size_t i = 0; i < context_lengths.size(); ++i) {
    const int64_t length = context_lengths[i];
    DCP_CHECK_ARG(length >= 0, "context length of request %d is negative (%d)", i, length);
    int64_t begin = 0;
    while (begin < length) {
      int64_t room = rows_per_chunk - current.padded_rows;  // a multiple of unit
      if (room == 0) {
        flush();
        room = rows_per_chunk;
      }
      const int64_t padded_rest = (length - begin + unit - 1) / unit * unit;
      const int64_t take_padded = std::min(room, padded_rest);
      const int64_t end = std::min(length, begin + take_padded);
      current.segments.push_back(ChunkSegment{static_cast<int32_t>(i), begin, end,
                                              current.padded_rows, current.num_keys});
      current.padded_rows += take_padded;
      current.num_keys += end - begin;
      begin = end;
    }
  }
  flush();
  return chunks;
}

LocalRange SegmentLocalRows(const ChunkSegment& segment, const KvLayout& layout, int rank) {
  const int64_t first = layout.local_length(segment.begin, rank);
  return LocalRange{first, layout.local_length(segment.end, rank) - first};
}

std::vector<int32_t> ReorganizeIndex(const ContextChunk& chunk, int64_t local_rows,
                                     const KvLayout& layout) {
  std::vector<int32_t> index(static_cast<size_t>(chunk.num_keys));
  for (const ChunkSegment& segment : chunk.segments) {
    const int64_t local_offset = segment.padded_offset / layout.world_size;
    for (int64_t g = segment.begin; g < segment.end; ++g) {
      // begin is a multiple of W*I, so position g - begin has the owner and the local index
      // (relative to the segment) that g has.
      const int64_t relative = g - segment.begin;
      const int64_t row = int64_t{layout.owner(relative)} * local_rows + local_offset +
                          layout.local_index(relative);
      index[segment.key_offset + relative] = static_cast<int32_t>(row);
    }
  }
  return index;
}

}  // namespace dcp
