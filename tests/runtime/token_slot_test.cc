// TokenSlotWalker (runtime/step.h) against a brute-force dealing of the tokens: the tokens of a
// request are handed to the ranks in runs of I, round-robin, and each rank's local rows are
// counted as they arrive (no KvLayout arithmetic), then mapped through a random block table.
// Every world size 1-8, interleaves 1-64, block sizes 1-64, every rank, random start positions
// (inside a run, on a run's boundary, 0) and lengths (0, 1, across many blocks); TokenSlot too.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/step.h"

namespace dcp {
namespace {

// What CheckStepTables asks of a step's tables: none where this rank holds no row of the step
// (empty tables, data null, at W > 1), slots in int32 range, block ids inside the cache.
TEST(CheckStepTablesTest, EmptyTablesWhereNoRowIsHeldAndSlotsInInt32) {
  const KvLayout layout{2, 16};
  const std::vector<BatchRequest> batch = {{1, 5, 1}};  // positions 0-4: all on rank 0
  EXPECT_TRUE(CheckStepTables(batch, {nullptr, 0, 8, 16}, layout, 1).ok());
  const absl::Status rank0 = CheckStepTables(batch, {nullptr, 0, 8, 16}, layout, 0);
  EXPECT_NE(rank0.message().find("the step has no block tables"), std::string::npos) << rank0;
  const int32_t row[1] = {3};
  EXPECT_TRUE(CheckStepTables(batch, {row, 1, 8, 16}, layout, 0).ok());
  const int64_t too_many = int64_t{1} << 27;  // x 16 rows = 2^31 slots
  const absl::Status wide = CheckStepTables(batch, {row, 1, too_many, 16}, layout, 0);
  EXPECT_NE(wide.message().find("exceed the int32 slot range"), std::string::npos) << wide;
  EXPECT_TRUE(CheckStepTables(batch, {row, 1, too_many - 1, 16}, layout, 0).ok());
  const int32_t outside[1] = {8};
  const absl::Status bad = CheckStepTables(batch, {outside, 1, 8, 16}, layout, 0);
  EXPECT_NE(bad.message().find("block table entry 0 is 8, outside the cache's 8 blocks"),
            std::string::npos)
      << bad;
}

TEST(TokenSlotWalkerTest, MatchesBruteForceDealing) {
  std::mt19937_64 rng(testing::UnitTest::GetInstance()->random_seed() + 7);
  for (int world : {1, 2, 3, 4, 8}) {
    for (int interleave : {1, 2, 3, 16, 64}) {
      for (int block : {1, 5, 16, 64}) {
        const int64_t length = 700;
        // Brute force: owner and local row of every token, by dealing.
        std::vector<int> owner(length);
        std::vector<int64_t> local(length);
        std::vector<int64_t> dealt(world, 0);
        for (int64_t g = 0, rank = 0, in_run = 0; g < length; ++g) {
          owner[g] = static_cast<int>(rank);
          local[g] = dealt[rank]++;
          if (++in_run == interleave) in_run = 0, rank = (rank + 1) % world;
        }
        for (int rank = 0; rank < world; ++rank) {
          // A random permutation of physical blocks for this rank's rows.
          const int64_t blocks = dealt[rank] / block + 1;
          std::vector<int32_t> table(blocks);
          std::iota(table.begin(), table.end(), 1000);
          std::shuffle(table.begin(), table.end(), rng);
          const KvLayout layout{world, interleave};
          std::uniform_int_distribution<int64_t> pick(0, length);
          for (int trial = 0; trial < 12; ++trial) {
            int64_t first = trial == 0 ? 0 : pick(rng);
            if (trial == 1) first = std::min<int64_t>(length, interleave);  // run boundary
            int64_t count = trial == 2 ? 0 : pick(rng);
            count = std::min(count, length - first);
            TokenSlotWalker walker(table.data(), block, layout, rank, first);
            for (int64_t g = first; g < first + count; ++g) {
              const int64_t want = owner[g] != rank
                                       ? -1
                                       : int64_t{table[local[g] / block]} * block + local[g] % block;
              const int64_t got = walker.Next();
              ASSERT_EQ(got, want) << "W " << world << " I " << interleave << " B " << block
                                   << " rank " << rank << " first " << first << " g " << g;
              ASSERT_EQ(TokenSlot(table.data(), block, layout, rank, g), want) << "g " << g;
            }
            // The same tokens a run at a time (runs cut short at random, as a caller's last
            // tokens cut them): every run expands to what Next gives.
            TokenSlotWalker runs(table.data(), block, layout, rank, first);
            std::uniform_int_distribution<int> cap(1, 2 * std::max(interleave, block));
            for (int64_t g = first; g < first + count;) {
              const int max_tokens = static_cast<int>(std::min<int64_t>(cap(rng), first + count - g));
              const TokenSlotWalker::Run run = runs.NextRun(max_tokens);
              ASSERT_GE(run.length, 1);
              ASSERT_LE(run.length, max_tokens);
              for (int k = 0; k < run.length; ++k, ++g) {
                const int64_t want = owner[g] != rank
                                         ? -1
                                         : int64_t{table[local[g] / block]} * block + local[g] % block;
                ASSERT_EQ(run.first < 0 ? -1 : run.first + k, want)
                    << "run of " << run.length << " W " << world << " I " << interleave << " B "
                    << block << " rank " << rank << " first " << first << " g " << g;
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace dcp
