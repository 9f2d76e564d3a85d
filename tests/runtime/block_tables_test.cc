// BlockTables under random sequences of what DcpContext does to them (add, grow, shrink, fork,
// free), against a model kept by the test: after every operation each request's table holds at
// least the blocks its length needs, no id twice and only ids of the pool, and the pool's free
// count is the number of blocks no table holds; a second rank's tables given the same sequence
// hold the same ids (the tables every rank must agree on without exchanging them).
#include "runtime/block_tables.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace dcp {
namespace {

// Blocks a request of `length` tokens needs: rank 0's local rows in blocks (positions are
// dealt to ranks in runs of `interleave`), written out from DESIGN.md section 4.
int64_t BlocksNeeded(int64_t length, int block_size, int world, int interleave) {
  int64_t rank0 = 0;
  for (int64_t g = 0; g < length; ++g) rank0 += (g / interleave) % world == 0;
  return (rank0 + block_size - 1) / block_size;
}

struct Case {
  int block_size, world, interleave, num_blocks;
};

class BlockTablesTest : public ::testing::TestWithParam<Case> {};

TEST_P(BlockTablesTest, RandomOperationsKeepTheTablesAndThePoolConsistent) {
  const Case c = GetParam();
  const KvLayout layout{c.world, c.interleave};
  BlockTables tables(c.num_blocks, c.block_size, layout, /*rank=*/0);
  BlockTables twin(c.num_blocks, c.block_size, layout, /*rank=*/1);  // another rank's view
  const int64_t unit = int64_t{c.block_size} * c.world;
  std::map<int64_t, int64_t> length;  // the model: each live request's length
  std::mt19937_64 rng(c.block_size * 1000 + c.world * 10 + c.interleave);
  int64_t next_id = 1;
  int forks = 0, refused = 0;
  for (int op = 0; op < 4000; ++op) {
    const int kind = int(rng() % 5);
    std::vector<int64_t> live;
    for (const auto& [id, n] : length) live.push_back(id);
    const int64_t pick = live.empty() ? -1 : live[rng() % live.size()];
    absl::Status st, st_twin;
    if (kind == 0 || live.empty()) {  // add, with some capacity
      const int64_t capacity = rng() % 80;
      st = tables.AddRequest(next_id, capacity);
      st_twin = twin.AddRequest(next_id, capacity);
      if (st.ok()) length[next_id] = capacity;
      ++next_id;
    } else if (kind == 1) {  // grow
      const int64_t n = length[pick] + int64_t(rng() % 40);
      st = tables.Grow(pick, n);
      st_twin = twin.Grow(pick, n);
      if (st.ok()) length[pick] = std::max(length[pick], n);
    } else if (kind == 2) {  // shrink (a rollback)
      const int64_t n = int64_t(rng() % (length[pick] + 1));
      auto shared = tables.PartlyKeptBlockIsShared(pick, n);
      ASSERT_TRUE(shared.ok());
      if (*shared) {
        ++refused;  // KvCache::Truncate refuses this one
        continue;
      }
      st = tables.Shrink(pick, n);
      st_twin = twin.Shrink(pick, n);
      if (st.ok()) length[pick] = n;
    } else if (kind == 3) {  // fork a whole-block prefix
      const int64_t n = unit * int64_t(rng() % (length[pick] / unit + 1));
      st = tables.Fork(next_id, pick, n);
      st_twin = twin.Fork(next_id, pick, n);
      if (st.ok()) {
        length[next_id] = n;
        ++forks;
      }
      ++next_id;
    } else {  // free
      st = tables.FreeRequest(pick);
      st_twin = twin.FreeRequest(pick);
      if (st.ok()) length.erase(pick);
    }
    ASSERT_EQ(st.code(), st_twin.code()) << "op " << op;
    if (!st.ok()) ASSERT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;

    // The tables against the model, and the pool against the tables.
    std::set<int32_t> held;
    for (const auto& [id, n] : length) {
      auto table = tables.table(id);
      auto table_twin = twin.table(id);
      ASSERT_TRUE(table.ok() && table_twin.ok());
      ASSERT_TRUE(std::equal(table->begin(), table->end(), table_twin->begin(), table_twin->end()))
          << "request " << id << ": the two ranks' tables differ";
      ASSERT_GE(int64_t(table->size()), BlocksNeeded(n, c.block_size, c.world, c.interleave))
          << "request " << id << " of " << n << " tokens";
      std::set<int32_t> own(table->begin(), table->end());
      ASSERT_EQ(own.size(), table->size()) << "request " << id << " holds a block twice";
      for (int32_t b : *table) {
        ASSERT_GE(b, 0);
        ASSERT_LT(b, c.num_blocks);
      }
      held.insert(own.begin(), own.end());
    }
    ASSERT_EQ(tables.num_free_blocks(), c.num_blocks - int(held.size())) << "op " << op;
  }
  for (const auto& [id, n] : length) ASSERT_TRUE(tables.FreeRequest(id).ok());
  EXPECT_EQ(tables.num_free_blocks(), c.num_blocks);
  EXPECT_GT(forks, 50);
  EXPECT_GT(refused, 0);
}

// Two requests of one fork hold the same ids for the prefix; a block stays held until its
// last holder lets it go; only a partly kept shared block is reported.
TEST(BlockTablesForkTest, SharedBlocksAreFreedByTheirLastHolder) {
  const KvLayout layout{/*world_size=*/2, /*interleave=*/1};
  BlockTables tables(/*num_blocks=*/16, /*block_size=*/4, layout, /*rank=*/0);
  ASSERT_TRUE(tables.AddRequest(1, 20).ok());  // 10 rows on rank 0: 3 blocks
  ASSERT_EQ(tables.num_free_blocks(), 13);
  EXPECT_FALSE(tables.Fork(2, 1, 12).ok());  // not a multiple of B x W = 8
  ASSERT_TRUE(tables.Fork(2, 1, 16).ok());   // 2 blocks
  EXPECT_EQ(tables.num_free_blocks(), 13);
  auto first = tables.table(1), second = tables.table(2);
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_EQ(second->size(), 2u);
  EXPECT_TRUE(std::equal(second->begin(), second->end(), first->begin()));
  EXPECT_TRUE(*tables.PartlyKeptBlockIsShared(1, 12));   // block 1 holds positions 8..15
  EXPECT_FALSE(*tables.PartlyKeptBlockIsShared(1, 8));   // block 1 dropped whole
  EXPECT_FALSE(*tables.PartlyKeptBlockIsShared(1, 18));  // block 2 is request 1's alone
  ASSERT_TRUE(tables.FreeRequest(1).ok());
  EXPECT_EQ(tables.num_free_blocks(), 14);  // request 1's own block only
  EXPECT_FALSE(*tables.PartlyKeptBlockIsShared(2, 12));
  ASSERT_TRUE(tables.FreeRequest(2).ok());
  EXPECT_EQ(tables.num_free_blocks(), 16);
}

INSTANTIATE_TEST_SUITE_P(Layouts, BlockTablesTest,
                         ::testing::Values(Case{4, 1, 1, 64}, Case{4, 2, 2, 64},
                                           Case{16, 3, 4, 96}, Case{8, 4, 8, 40}));

}  // namespace
}  // namespace dcp
