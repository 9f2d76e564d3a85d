// KvLayout against a brute-force dealer: ranks take turns taking I consecutive tokens, and a
// token's local index is its position in its rank's pile. No formula of kv_layout.h is reused.
#include "core/kv_layout.h"

#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace dcp {
namespace {

struct Dealt {
  std::vector<int> owner;                    // [L]
  std::vector<int64_t> local;                // [L]
  std::vector<std::vector<int64_t>> piles;   // [W][local rows] -> global token
};

Dealt Deal(int world, int interleave, int64_t length) {
  Dealt dealt;
  dealt.piles.resize(world);
  int turn = 0;
  for (int64_t start = 0; start < length; start += interleave) {
    for (int64_t g = start; g < std::min<int64_t>(start + interleave, length); ++g) {
      dealt.owner.push_back(turn);
      dealt.local.push_back(static_cast<int64_t>(dealt.piles[turn].size()));
      dealt.piles[turn].push_back(g);
    }
    turn = (turn + 1) % world;
  }
  return dealt;
}

TEST(KvLayoutTest, MatchesBruteForceDealing) {
  const int block_size = 16;
  for (int world = 1; world <= 8; ++world) {
    for (int interleave : {1, 2, 4, block_size}) {
      const KvLayout layout{world, interleave};
      const Dealt dealt = Deal(world, interleave, 300);
      for (int64_t length = 0; length <= 300; ++length) {
        int64_t sum = 0;
        for (int r = 0; r < world; ++r) {
          int64_t expected = 0;
          for (int64_t g : dealt.piles[r]) expected += g < length ? 1 : 0;
          ASSERT_EQ(layout.local_length(length, r), expected)
              << "W " << world << " I " << interleave << " L " << length << " r " << r;
          sum += layout.local_length(length, r);
        }
        ASSERT_EQ(sum, length);
      }
      for (int64_t g = 0; g < 300; ++g) {
        ASSERT_EQ(layout.owner(g), dealt.owner[g]) << "W " << world << " I " << interleave;
        ASSERT_EQ(layout.local_index(g), dealt.local[g]);
        ASSERT_EQ(layout.global_index(dealt.local[g], dealt.owner[g]), g);
      }
      for (int r = 0; r < world; ++r) {
        for (size_t j = 0; j < dealt.piles[r].size(); ++j) {
          ASSERT_EQ(layout.global_index(static_cast<int64_t>(j), r), dealt.piles[r][j]);
        }
      }
    }
  }
}

TEST(KvLayoutTest, SlotsOfDistinctRowsNeverCollide) {
  const int block_size = 8;
  // Two requests interleaving their blocks in one pool.
  const std::vector<int32_t> table_a = {3, 0, 5};
  const std::vector<int32_t> table_b = {1, 4, 2};
  std::set<int64_t> seen;
  for (const auto* table : {&table_a, &table_b}) {
    for (int64_t j = 0; j < 24; ++j) {
      const int64_t slot = slot_of_local_row(table->data(), block_size, j);
      EXPECT_EQ(slot / block_size, (*table)[j / block_size]);
      EXPECT_TRUE(seen.insert(slot).second) << "slot " << slot << " used twice";
    }
  }
  EXPECT_EQ(seen.size(), 48u);
}

}  // namespace
}  // namespace dcp
