// Top-k positions: ValidateTopkPositions (the checked entry, also through CpuDevice) and
// cpu::TopkToSlots, the latter against a brute-force enumeration that deals every request's
// tokens to the ranks in runs of I and counts each rank's rows (no layout formula shared with
// the code under test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "attention/cpu/attention_cpu.h"
#include "attention/topk_validation.h"
#include "runtime/device.h"
#include "tests/attention/attention_test_util.h"

namespace dcp {
namespace {

using testing::FreshSeed;
using testing::Rng;

void ExpectInvalid(const absl::Status& status, const std::vector<std::string>& needles) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  for (const std::string& needle : needles) {
    EXPECT_NE(std::string(status.message()).find(needle), std::string::npos)
        << "'" << needle << "' not in: " << status.message();
  }
}

TEST(TopkValidationTest, AcceptsValidRows) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  const int tokens = 20, width = 32;
  std::vector<int32_t> topk, positions;
  for (int t = 0; t < tokens; ++t) {
    const int position = rng.Int(0, 100);
    positions.push_back(position);
    std::vector<int32_t> all(position + 1);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng.engine());
    std::vector<int32_t> row(width, -1);
    const int count = rng.Int(0, std::min(width, position + 1));
    std::copy(all.begin(), all.begin() + count, row.begin());
    std::shuffle(row.begin(), row.end(), rng.engine());
    topk.insert(topk.end(), row.begin(), row.end());
  }
  EXPECT_TRUE(ValidateTopkPositions(topk.data(), positions.data(), tokens, width).ok());
  EXPECT_TRUE(ValidateTopkPositions(nullptr, nullptr, 0, width).ok());
}

TEST(TopkValidationTest, RejectsFutureNegativeAndRepeatedIndices) {
  // Token 0 at position 3, token 1 at position 7.
  const std::vector<int32_t> positions = {3, 7};
  std::vector<int32_t> topk = {0, 3, -1, 2, 7, 6, -1, 0};
  ASSERT_TRUE(ValidateTopkPositions(topk.data(), positions.data(), 2, 4).ok());
  topk[5] = 8;  // past the position: a future key
  ExpectInvalid(ValidateTopkPositions(topk.data(), positions.data(), 2, 4),
                {"index 8", "token 1", "column 1", "position 7"});
  topk[5] = -2;
  ExpectInvalid(ValidateTopkPositions(topk.data(), positions.data(), 2, 4),
                {"index -2", "token 1"});
  topk[5] = 6, topk[3] = 3;  // token 0 holds 3 twice
  ExpectInvalid(ValidateTopkPositions(topk.data(), positions.data(), 2, 4),
                {"index 3", "token 0", "repeated", "columns 1 and 3"});
  // A failed row must not leave marks behind that break the next call.
  topk[3] = 2;
  EXPECT_TRUE(ValidateTopkPositions(topk.data(), positions.data(), 2, 4).ok());
  ExpectInvalid(ValidateTopkPositions(nullptr, positions.data(), 2, 4), {"topk is null"});
}

// Through the Device (CpuDevice::ValidateTopk): a strided slice of a larger batch, named by the
// caller's token index, and the position limit.
TEST(TopkValidationTest, CpuDeviceChecksStridedSlices) {
  std::unique_ptr<Device> device = MakeCpuDevice();
  // Rows of 3 columns in a stride of 5 (the last 2 are never read: 99 there would be invalid).
  const std::vector<int32_t> positions = {4, 9, 2};
  std::vector<int32_t> topk = {4,  0, -1, 99, 99,  //
                               9,  8, 1,  99, 99,  //
                               -1, 2, 1,  99, 99};
  TopkValidateParams p;
  p.topk = topk.data();
  p.token_position = positions.data();
  p.num_tokens = 3;
  p.topk_width = 3;
  p.topk_token_stride = 5;
  p.max_positions = 10;
  p.first_token = 40;
  EXPECT_TRUE(device->ValidateTopk(p).ok());
  topk[11] = 3;  // token 2 (caller's 42), column 1: past position 2
  ExpectInvalid(device->ValidateTopk(p),
                {"top-k", "index 3", "token 42", "column 1", "position 2", "future key"});
  topk[11] = 2, topk[7] = 9;  // token 1 holds 9 twice
  ExpectInvalid(device->ValidateTopk(p), {"index 9", "token 41", "repeated", "columns 0 and 2"});
  topk[7] = -5;
  ExpectInvalid(device->ValidateTopk(p), {"index -5", "token 41", "column 2", "below -1"});
  topk[7] = 1;
  p.max_positions = 9;  // token 1 sits at 9
  ExpectInvalid(device->ValidateTopk(p), {"token 41", "position 9", "max_positions 9"});
  p.max_positions = 10;
  EXPECT_TRUE(device->ValidateTopk(p).ok());
  p.num_tokens = 0;
  p.topk = nullptr;
  EXPECT_TRUE(device->ValidateTopk(p).ok());
  p.num_tokens = 3;
  p.topk = topk.data();
  p.topk_token_stride = 2;
  EXPECT_EQ(device->ValidateTopk(p).code(), absl::StatusCode::kInvalidArgument);
}

// The rank-r rows of a request, by dealing: runs of `interleave` tokens go to ranks 0, 1, ...,
// W-1, 0, ...; each rank numbers the tokens it receives 0, 1, 2, ...
struct Dealt {
  std::vector<int> owner;      // [len]
  std::vector<int64_t> local;  // [len]
};
Dealt Deal(int len, int world_size, int interleave) {
  Dealt dealt;
  std::vector<int64_t> received(world_size, 0);
  int rank = 0, in_run = 0;
  for (int g = 0; g < len; ++g) {
    dealt.owner.push_back(rank);
    dealt.local.push_back(received[rank]++);
    if (++in_run == interleave) {
      in_run = 0;
      rank = (rank + 1) % world_size;
    }
  }
  return dealt;
}

TEST(TopkToSlotsTest, MatchesBruteForceDealing) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  for (int iteration = 0; iteration < 20; ++iteration) {
    const int world_size = rng.Int(1, 4);
    const int interleave = 1 << rng.Int(0, 2);
    const int block_size = interleave * (1 << rng.Int(0, 2));
    const int rank = rng.Int(0, world_size - 1);
    const int num_requests = rng.Int(1, 4), max_blocks = rng.Int(1, 6), width = rng.Int(1, 24);
    SCOPED_TRACE(absl::StrFormat("W=%d I=%d B=%d rank=%d requests=%d max_blocks=%d width=%d",
                                 world_size, interleave, block_size, rank, num_requests, max_blocks,
                                 width));
    // Physical block ids: distinct, shuffled, a few unallocated (-1).
    std::vector<int32_t> ids(num_requests * max_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng.engine());
    for (int32_t& id : ids) {
      if (rng.Int(0, 9) == 0) id = -1;
    }
    // Tokens: a random request and position each; positions may run past the block table (the
    // table covers max_blocks * B * W tokens) to check the -1 there.
    const int tokens = rng.Int(1, 12);
    std::vector<int32_t> token_request(tokens), token_position(tokens), topk(tokens * width);
    for (int t = 0; t < tokens; ++t) {
      token_request[t] = rng.Int(0, num_requests - 1);
      token_position[t] = rng.Int(0, max_blocks * block_size * world_size + 10);
      for (int c = 0; c < width; ++c) {
        topk[t * width + c] = rng.Int(0, 3) == 0 ? -1 : rng.Int(0, token_position[t]);
      }
    }
    std::vector<int32_t> slots(tokens * width, -7);
    TopkToSlotsParams p;
    p.topk = topk.data(), p.token_request = token_request.data();
    p.token_position = token_position.data(), p.block_tables = ids.data(), p.slots = slots.data();
    p.num_tokens = tokens, p.topk_width = width, p.num_requests = num_requests;
    p.max_blocks = max_blocks, p.world_size = world_size, p.interleave = interleave;
    p.rank = rank, p.block_size = block_size;
    ASSERT_TRUE(cpu::TopkToSlots(p).ok());
    for (int t = 0; t < tokens; ++t) {
      const Dealt dealt = Deal(token_position[t] + 1, world_size, interleave);
      for (int c = 0; c < width; ++c) {
        const int g = topk[t * width + c];
        int32_t want = -1;
        if (g >= 0 && dealt.owner[g] == rank) {
          const int64_t j = dealt.local[g];
          if (j / block_size < max_blocks) {
            const int32_t id = ids[token_request[t] * max_blocks + j / block_size];
            if (id >= 0) want = static_cast<int32_t>(int64_t{id} * block_size + j % block_size);
          }
        }
        ASSERT_EQ(slots[t * width + c], want) << "token " << t << " column " << c << " g " << g;
      }
    }
    // The compacting form, without slots: each row's valid slots in order, then -1, and the
    // count.
    std::vector<int32_t> valid(tokens * width, -7), counts(tokens, -7);
    TopkToSlotsParams pc = p;
    pc.slots = nullptr;
    pc.valid_slots = valid.data();
    pc.valid_counts = counts.data();
    ASSERT_TRUE(cpu::TopkToSlots(pc).ok());
    for (int t = 0; t < tokens; ++t) {
      std::vector<int32_t> want;
      for (int c = 0; c < width; ++c) {
        if (slots[t * width + c] >= 0) want.push_back(slots[t * width + c]);
      }
      ASSERT_EQ(counts[t], static_cast<int32_t>(want.size())) << "token " << t;
      want.resize(width, -1);
      ASSERT_EQ(std::vector<int32_t>(valid.begin() + t * width, valid.begin() + (t + 1) * width),
                want)
          << "token " << t;
    }
  }
}

TEST(TopkToSlotsTest, InvalidPositionsGiveMinusOne) {
  const int32_t table[2] = {5, 9};
  const int32_t request = 0, position = 3;
  const std::vector<int32_t> topk = {-1, -5, 4, 100, 3};
  std::vector<int32_t> slots(5, 0);
  TopkToSlotsParams p;
  p.topk = topk.data(), p.token_request = &request, p.token_position = &position;
  p.block_tables = table, p.slots = slots.data();
  p.num_tokens = 1, p.topk_width = 5, p.num_requests = 1, p.max_blocks = 2, p.block_size = 4;
  ASSERT_TRUE(cpu::TopkToSlots(p).ok());
  EXPECT_EQ(slots, (std::vector<int32_t>{-1, -1, -1, -1, 23}));
  // Without token_position only the block table bounds the positions.
  p.token_position = nullptr;
  ASSERT_TRUE(cpu::TopkToSlots(p).ok());
  EXPECT_EQ(slots, (std::vector<int32_t>{-1, -1, 36, -1, 23}));
}

TEST(TopkToSlotsTest, RejectsBadParams) {
  const int32_t table[1] = {0}, request = 0, topk[1] = {0};
  int32_t slot;
  TopkToSlotsParams good;
  good.topk = topk, good.token_request = &request, good.block_tables = table, good.slots = &slot;
  good.num_tokens = 1, good.topk_width = 1, good.num_requests = 1, good.max_blocks = 1;
  ASSERT_TRUE(cpu::TopkToSlots(good).ok());
  TopkToSlotsParams p = good;
  p.rank = 1;
  ExpectInvalid(cpu::TopkToSlots(p), {"rank 1"});
  p = good, p.slots = nullptr;
  ExpectInvalid(cpu::TopkToSlots(p), {"slots is null"});
  p = good, p.num_requests = 0;
  ExpectInvalid(cpu::TopkToSlots(p), {"token 0", "request 0"});
  p = good, p.interleave = 0;
  ExpectInvalid(cpu::TopkToSlots(p), {"interleave"});
}

}  // namespace
}  // namespace dcp
