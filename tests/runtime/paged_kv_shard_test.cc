#include "runtime/paged_kv_shard.h"

#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace dcp {
namespace {

KvShardConfig MakeConfig(int world, int interleave, int rank, int num_blocks) {
  KvShardConfig config;
  config.block_size = 8;
  config.num_blocks = num_blocks;
  config.row_width = 3;
  config.dtype = DType::kF32;
  config.layout = KvLayout{world, interleave};
  config.rank = rank;
  return config;
}

// Row content that names the request and the global token.
float cell(int64_t request, int64_t g, int c) { return float(request * 100000 + g * 10 + c); }

TEST(BlockAllocatorTest, LowestFreeFirstAndExhaustion) {
  BlockAllocator allocator(4);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(allocator.Allocate(2, &a).ok());
  ASSERT_TRUE(allocator.Allocate(1, &b).ok());
  EXPECT_EQ(a, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(b, (std::vector<int32_t>{2}));
  allocator.Free(a);
  std::vector<int32_t> c;
  EXPECT_EQ(allocator.Allocate(4, &c).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(c.empty());
  ASSERT_TRUE(allocator.Allocate(3, &c).ok());
  EXPECT_EQ(c, (std::vector<int32_t>{0, 1, 3}));
}

TEST(PagedKvShardTest, WritesOwnedTokensAndReadsThemBackInLocalOrder) {
  for (int world : {1, 2, 3, 4}) {
    for (int interleave : {1, 2, 8}) {
      for (int rank = 0; rank < world; ++rank) {
        auto made = PagedKvShard::Create(MakeConfig(world, interleave, rank, 64));
        ASSERT_TRUE(made.ok()) << made.status();
        PagedKvShard shard = std::move(made).value();
        const std::vector<int64_t> lengths = {1, 37, 100};
        for (size_t r = 0; r < lengths.size(); ++r) {
          ASSERT_TRUE(shard.AddRequest(int64_t(r), lengths[r]).ok());
          // Write in two steps, as a prefill then a decode would.
          for (auto [first, count] : {std::pair<int64_t, int64_t>{0, lengths[r] - 1},
                                      std::pair<int64_t, int64_t>{lengths[r] - 1, 1}}) {
            std::vector<float> rows(size_t(count) * 3);
            for (int64_t i = 0; i < count; ++i)
              for (int c = 0; c < 3; ++c) rows[i * 3 + c] = cell(r, first + i, c);
            ASSERT_TRUE(shard.WriteTokens(int64_t(r), first, count, rows.data()).ok());
          }
        }
        std::set<int64_t> slots;
        for (size_t r = 0; r < lengths.size(); ++r) {
          // The tokens this rank owns, found by scanning (no layout formula).
          std::vector<int64_t> mine;
          for (int64_t g = 0; g < lengths[r]; ++g) {
            if ((g / interleave) % world == rank) mine.push_back(g);
          }
          std::vector<float> out(mine.size() * 3, -1.0f);
          ASSERT_TRUE(shard.ReadLocalRows(int64_t(r), 0, int64_t(mine.size()), out.data()).ok());
          for (size_t j = 0; j < mine.size(); ++j)
            for (int c = 0; c < 3; ++c) ASSERT_EQ(out[j * 3 + c], cell(r, mine[j], c));
          for (int64_t g = 0; g < lengths[r]; ++g) {
            auto slot = shard.slot(int64_t(r), g);
            ASSERT_TRUE(slot.ok());
            if ((g / interleave) % world != rank) {
              EXPECT_EQ(*slot, -1);
            } else {
              EXPECT_TRUE(slots.insert(*slot).second) << "slot collision";
            }
          }
        }
      }
    }
  }
}

TEST(PagedKvShardTest, TablesAgreeAcrossRanksAndBlocksRunOut) {
  std::vector<std::vector<int32_t>> tables;
  for (int rank = 0; rank < 3; ++rank) {
    auto shard = PagedKvShard::Create(MakeConfig(3, 2, rank, 6)).value();
    ASSERT_TRUE(shard.AddRequest(7, 50).ok());
    ASSERT_TRUE(shard.AddRequest(8, 20).ok());
    ASSERT_TRUE(shard.FreeRequest(7).ok());
    ASSERT_TRUE(shard.AddRequest(9, 30).ok());
    auto table = shard.block_table(9).value();
    tables.emplace_back(table.begin(), table.end());
    absl::Status status = shard.AddRequest(10, 1000);
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(status.message().find("out of KV blocks"), std::string::npos);
    EXPECT_FALSE(shard.HasRequest(10));
    EXPECT_EQ(shard.AddRequest(8, 1).code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(tables[0], tables[1]);
  EXPECT_EQ(tables[1], tables[2]);
}

TEST(PagedKvShardTest, OutOfRangeAccessIsAnError) {
  auto shard = PagedKvShard::Create(MakeConfig(2, 1, 0, 4)).value();
  ASSERT_TRUE(shard.AddRequest(1, 10).ok());
  std::vector<float> rows(3 * 40);
  EXPECT_FALSE(shard.WriteTokens(1, 0, 40, rows.data()).ok());
  EXPECT_FALSE(shard.ReadLocalRows(1, 0, 40, rows.data()).ok());
  EXPECT_FALSE(shard.WriteTokens(2, 0, 1, rows.data()).ok());
  EXPECT_FALSE(PagedKvShard::Create(MakeConfig(2, 3, 0, 4)).ok());  // I does not divide B
}

}  // namespace
}  // namespace dcp
