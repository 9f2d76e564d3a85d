// The chunk plan's invariants, and the row maps checked by simulating the whole data path
// (local gather -> all-gather -> reorganize) with a brute-force dealer of tokens to ranks.
#include "workspace/chunk_plan.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace dcp {
namespace {

// Local rows of each rank for one request, by dealing runs of I tokens round-robin.
std::vector<std::vector<int64_t>> Deal(int world, int interleave, int64_t length) {
  std::vector<std::vector<int64_t>> piles(world);
  for (int64_t g = 0; g < length; ++g) piles[(g / interleave) % world].push_back(g);
  return piles;
}

TEST(ChunkPlanTest, CoversEveryPositionOnceWithinCapacity) {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 300; ++trial) {
    const int world = 1 + rng() % 6, interleave = 1 << (rng() % 3);
    const KvLayout layout{world, interleave};
    const int64_t unit = int64_t{world} * interleave;
    const int64_t rows = unit * (1 + rng() % 12);
    std::vector<int64_t> lengths(1 + rng() % 6);
    for (auto& length : lengths) length = (rng() % 4 == 0) ? 0 : 1 + rng() % 200;
    SCOPED_TRACE(testing::Message() << "W " << world << " I " << interleave << " S " << rows);
    auto chunks = PlanContextChunks(lengths, rows, layout);
    ASSERT_TRUE(chunks.ok()) << chunks.status();
    std::vector<std::vector<int>> seen(lengths.size());
    for (size_t i = 0; i < lengths.size(); ++i) seen[i].assign(lengths[i], 0);
    for (const ContextChunk& chunk : *chunks) {
      ASSERT_FALSE(chunk.segments.empty());
      ASSERT_LE(chunk.padded_rows, rows);
      int64_t padded = 0, keys = 0;
      for (const ChunkSegment& s : chunk.segments) {
        ASSERT_EQ(s.begin % unit, 0);
        ASSERT_LT(s.begin, s.end);
        ASSERT_EQ(s.padded_offset, padded);
        ASSERT_EQ(s.key_offset, keys);
        padded += (s.end - s.begin + unit - 1) / unit * unit;
        keys += s.end - s.begin;
        for (int64_t g = s.begin; g < s.end; ++g) seen[s.request][g]++;
      }
      ASSERT_EQ(padded, chunk.padded_rows);
      ASSERT_EQ(keys, chunk.num_keys);
    }
    for (size_t i = 0; i < lengths.size(); ++i)
      for (int64_t g = 0; g < lengths[i]; ++g) ASSERT_EQ(seen[i][g], 1) << "req " << i << " g " << g;
  }
}

TEST(ChunkPlanTest, GatherAllGatherReorganizeGivesGlobalOrder) {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 200; ++trial) {
    const int world = 1 + rng() % 5, interleave = 1 << (rng() % 3);
    const KvLayout layout{world, interleave};
    const int64_t unit = int64_t{world} * interleave;
    const int64_t rows = unit * (1 + rng() % 8);
    const int64_t local_rows = rows / world;
    std::vector<int64_t> lengths(1 + rng() % 4);
    for (auto& length : lengths) length = rng() % 150;
    auto chunks = PlanContextChunks(lengths, rows, layout).value();
    for (const ContextChunk& chunk : chunks) {
      // Row value = (request, position) encoded; -1 marks padding.
      std::vector<int64_t> all_gather(world * local_rows, -1);
      for (int r = 0; r < world; ++r) {
        for (const ChunkSegment& s : chunk.segments) {
          const auto piles = Deal(world, interleave, lengths[s.request]);
          const LocalRange range = SegmentLocalRows(s, layout, r);
          ASSERT_LE(range.count, (s.end - s.begin + unit - 1) / unit * unit / world);
          for (int64_t x = 0; x < range.count; ++x) {
            all_gather[r * local_rows + s.padded_offset / world + x] =
                s.request * 100000 + piles[r][range.first + x];
          }
        }
      }
      const std::vector<int32_t> index = ReorganizeIndex(chunk, local_rows, layout);
      ASSERT_EQ(int64_t(index.size()), chunk.num_keys);
      for (const ChunkSegment& s : chunk.segments) {
        for (int64_t g = s.begin; g < s.end; ++g) {
          ASSERT_EQ(all_gather[index[s.key_offset + g - s.begin]], s.request * 100000 + g)
              << "W " << world << " I " << interleave << " request " << s.request << " g " << g;
        }
      }
    }
  }
}

TEST(ChunkPlanTest, LongContextTakesSeveralChunks) {
  const KvLayout layout{4, 2};
  auto chunks = PlanContextChunks(std::vector<int64_t>{100, 0, 37}, 40, layout).value();
  // 100 -> 40 + 40 + 24 (padded 24), then 37 (padded 40) does not fit the 16 left: 16 + 24.
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks[2].segments.size(), 2u);
  EXPECT_EQ(chunks[2].segments[1].request, 2);
  EXPECT_EQ(chunks[2].segments[1].end, 16);
  EXPECT_FALSE(PlanContextChunks(std::vector<int64_t>{5}, 12, layout).ok());  // S % (W*I) != 0
}

}  // namespace
}  // namespace dcp
