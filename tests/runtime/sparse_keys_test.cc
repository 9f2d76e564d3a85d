// ExpectedSparseKeys (runtime/sparse_route.h), the sparse MQA kernel's planning hint, against a
// brute-force dealing of the positions: a token at position p sees positions 0..p, dealt to the
// ranks in runs of I, round-robin (no KvLayout arithmetic); its top-k selects min(topk, p + 1)
// of them, and a rank's expected share is that times the fraction of the positions it was dealt,
// rounded up. The hint is the most over the step's tokens, at least 1 and at most the width.
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "core/kv_layout.h"
#include "gtest/gtest.h"
#include "runtime/sparse_route.h"

namespace dcp {
namespace {

// Positions 0..length-1 dealt to `world` ranks in runs of `interleave`: how many `rank` holds.
int64_t DealtTo(int64_t length, int world, int interleave, int rank) {
  int64_t held = 0;
  for (int64_t g = 0, owner = 0, in_run = 0; g < length; ++g) {
    held += owner == rank;
    if (++in_run == interleave) {
      in_run = 0;
      owner = (owner + 1) % world;
    }
  }
  return held;
}

TEST(ExpectedSparseKeysTest, MatchesBruteForceDealing) {
  std::mt19937_64 rng(::testing::UnitTest::GetInstance()->random_seed() + 11);
  for (int world : {1, 2, 3, 4, 8}) {
    for (int interleave : {1, 16, 64}) {
      const KvLayout layout{world, interleave};
      for (int topk : {0, 1, 64, 512, 2048}) {
        for (int trial = 0; trial < 4; ++trial) {
          std::vector<int32_t> positions(1 + rng() % 6);
          for (int32_t& p : positions) p = static_cast<int32_t>(rng() % (trial < 2 ? 300 : 20000));
          for (int rank = 0; rank < world; ++rank) {
            SCOPED_TRACE(::testing::Message() << "W " << world << " I " << interleave << " topk "
                                              << topk << " rank " << rank);
            int64_t want = 1;
            for (const int32_t p : positions) {
              const int64_t length = int64_t{p} + 1;
              const int64_t selected = std::min<int64_t>(topk, length);
              const int64_t held = DealtTo(length, world, interleave, rank);
              want = std::max(want, (selected * held + length - 1) / length);
            }
            want = std::min<int64_t>(want, std::max(topk, 1));
            EXPECT_EQ(ExpectedSparseKeys(layout, rank, positions, topk), want);
          }
        }
      }
    }
  }
}

TEST(ExpectedSparseKeysTest, OneRankLongAndShortContexts) {
  const KvLayout one{1, 1};
  // One rank: the selection itself, min(topk, context).
  EXPECT_EQ(ExpectedSparseKeys(one, 0, {4095}, 2048), 2048);
  EXPECT_EQ(ExpectedSparseKeys(one, 0, {1023}, 2048), 1024);
  EXPECT_EQ(ExpectedSparseKeys(one, 0, {0}, 2048), 1);
  EXPECT_EQ(ExpectedSparseKeys(one, 0, {511, 99, 1023}, 2048), 1024);  // the most
  // Four ranks, interleave 1, a long context: a quarter of the top-k each.
  const KvLayout four{4, 1};
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(ExpectedSparseKeys(four, rank, {32767}, 2048), 512);
  // A rank that holds none of a short context still plans one key; no tokens: one key.
  EXPECT_EQ(ExpectedSparseKeys(KvLayout{4, 64}, 3, {10}, 2048), 1);
  EXPECT_EQ(ExpectedSparseKeys(four, 0, {}, 2048), 1);
}

}  // namespace
}  // namespace dcp
