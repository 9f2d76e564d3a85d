// Top-k positions -> local slots on the GPU (attention/cuda/topk_to_slots.h) against a
// brute-force enumeration written here: walking a request's tokens in order and counting, per
// rank, how many it already holds (no closed-form layout formula shared with the kernel).
#include "attention/cuda/topk_to_slots.h"

#include <algorithm>
#include <random>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/gpu_test_util.h"

namespace dcp::testing {
namespace {

class TopkToSlotsCudaTest : public GpuTest {};

TEST_F(TopkToSlotsCudaTest, MatchesEnumeration) {
  std::mt19937_64 rng(TestSeed());
  for (auto [world, interleave, block_size] :
       {std::tuple{1, 1, 16}, {2, 1, 64}, {4, 2, 16}, {3, 4, 8}, {8, 1, 1}}) {
    for (int rank = 0; rank < world; ++rank) {
      const int requests = 3, max_blocks = 9, width = 70;
      const std::vector<int> seq_len = {1, 300, 97};
      // owner[q][g] and local index by enumeration.
      std::vector<std::vector<int>> owner(requests), local(requests);
      for (int q = 0; q < requests; ++q) {
        std::vector<int> held(world, 0);
        for (int g = 0; g < seq_len[q]; ++g) {
          const int o = (g / interleave) % world;
          owner[q].push_back(o);
          local[q].push_back(held[o]++);
        }
      }
      std::vector<int32_t> tables(requests * max_blocks);
      std::uniform_int_distribution<int> block_id(-1, 200);
      for (int32_t& b : tables) b = block_id(rng);  // some -1: unallocated
      std::vector<int32_t> token_request, token_position, topk;
      std::uniform_int_distribution<int> coin(0, 5);
      for (int q = 0; q < requests; ++q) {
        for (int pos : {seq_len[q] - 1, seq_len[q] / 2}) {
          token_request.push_back(q);
          token_position.push_back(pos);
          std::uniform_int_distribution<int> any(0, pos);
          for (int k = 0; k < width; ++k) {
            const int c = coin(rng);
            topk.push_back(c == 0 ? -1 : c == 1 ? pos + 1 + k : any(rng));  // pos+1..: invalid
          }
        }
      }
      const int tokens = int(token_request.size());
      DeviceArray<int32_t> d_topk(topk), d_req(token_request), d_pos(token_position),
          d_tables(tables), d_slots(topk.size());
      d_slots.Poison();
      TopkToSlotsParams p;
      p.topk = d_topk.get();
      p.token_request = d_req.get();
      p.token_position = d_pos.get();
      p.block_tables = d_tables.get();
      p.slots = d_slots.get();
      p.num_tokens = tokens;
      p.topk_width = width;
      p.num_requests = requests;
      p.max_blocks = max_blocks;
      p.world_size = world;
      p.interleave = interleave;
      p.rank = rank;
      p.block_size = block_size;
      ASSERT_TRUE(cuda::TopkToSlots(p, nullptr).ok());
      const auto slots = d_slots.Download();
      // The compacting form: the same slots (when asked for too), and per token the valid ones
      // in order, then -1, and their count. Without slots as well.
      DeviceArray<int32_t> d_valid(topk.size()), d_counts(tokens), d_slots2(topk.size());
      for (bool with_slots : {true, false}) {
        d_valid.Poison();
        d_counts.Poison();
        d_slots2.Poison();
        TopkToSlotsParams pc = p;
        pc.slots = with_slots ? d_slots2.get() : nullptr;
        pc.valid_slots = d_valid.get();
        pc.valid_counts = d_counts.get();
        ASSERT_TRUE(cuda::TopkToSlots(pc, nullptr).ok());
        const auto valid = d_valid.Download();
        const auto counts = d_counts.Download();
        if (with_slots) ASSERT_EQ(d_slots2.Download(), slots);
        for (int t = 0; t < tokens; ++t) {
          std::vector<int32_t> want;
          for (int k = 0; k < width; ++k) {
            if (slots[t * width + k] >= 0) want.push_back(slots[t * width + k]);
          }
          ASSERT_EQ(counts[t], int(want.size())) << "token " << t;
          want.resize(width, -1);
          ASSERT_EQ(
              std::vector<int32_t>(valid.begin() + t * width, valid.begin() + (t + 1) * width),
              want)
              << "token " << t;
        }
      }
      for (int t = 0; t < tokens; ++t) {
        const int q = token_request[t];
        for (int k = 0; k < width; ++k) {
          const int g = topk[t * width + k];
          int32_t want = -1;
          if (g >= 0 && g <= token_position[t] && owner[q][g] == rank) {
            const int j = local[q][g];
            if (j / block_size < max_blocks) {
              const int physical = tables[q * max_blocks + j / block_size];
              if (physical >= 0) want = physical * block_size + j % block_size;
            }
          }
          ASSERT_EQ(slots[t * width + k], want)
              << "W " << world << " I " << interleave << " B " << block_size << " rank " << rank
              << " token " << t << " position " << g;
        }
      }
    }
  }
}

TEST_F(TopkToSlotsCudaTest, CompactsLongRows) {
  // Rows of one 2048-entry chunk of the compacting kernel, and wider rows with a partial last
  // chunk, with every count class.
  for (const int width : {2048, 5000}) {
    SCOPED_TRACE(::testing::Message() << "width " << width);
    const int world = 2, rank = 1;
    std::mt19937_64 rng(TestSeed());
    std::vector<int> wanted = {0, 1, 63, 64, 65, 300, 1024};
    if (width > 2048) wanted.insert(wanted.end(), {2047, 2048, 2049, 2500});
    std::vector<int32_t> topk, token_request, token_position;
    std::vector<int32_t> want_counts;
    for (int t = 0; t < int(wanted.size()); ++t) {
      token_request.push_back(0);
      token_position.push_back(2 * width);
      // positions 2j + 1 are rank 1's (interleave 1, W 2); -1 elsewhere, shuffled in.
      std::vector<int32_t> row(width, -1);
      for (int j = 0; j < wanted[t]; ++j) row[j] = 2 * j + 1;
      for (int j = wanted[t]; j < width; j += 3) row[j] = 2 * j;  // rank 0's: dropped
      std::shuffle(row.begin(), row.end(), rng);
      topk.insert(topk.end(), row.begin(), row.end());
      want_counts.push_back(wanted[t]);
    }
    const int tokens = int(wanted.size()), max_blocks = 2 * width;
    std::vector<int32_t> tables(max_blocks);
    for (int b = 0; b < max_blocks; ++b) tables[b] = b;  // block size 1: slot = local index
    DeviceArray<int32_t> d_topk(topk), d_req(token_request), d_pos(token_position),
        d_tables(tables), d_valid(topk.size()), d_counts(tokens);
    d_valid.Poison();
    d_counts.Poison();
    TopkToSlotsParams p;
    p.topk = d_topk.get();
    p.token_request = d_req.get();
    p.token_position = d_pos.get();
    p.block_tables = d_tables.get();
    p.valid_slots = d_valid.get();
    p.valid_counts = d_counts.get();
    p.num_tokens = tokens;
    p.topk_width = width;
    p.num_requests = 1;
    p.max_blocks = max_blocks;
    p.world_size = world;
    p.rank = rank;
    ASSERT_TRUE(cuda::TopkToSlots(p, nullptr).ok());
    const auto valid = d_valid.Download();
    ASSERT_EQ(d_counts.Download(), want_counts);
    for (int t = 0; t < tokens; ++t) {
      std::vector<int32_t> want;
      for (int k = 0; k < width; ++k) {
        const int32_t g = topk[t * width + k];
        if (g >= 0 && g % 2 == 1) want.push_back(g / 2);  // local index of position g
      }
      want.resize(width, -1);
      ASSERT_EQ(std::vector<int32_t>(valid.begin() + t * width, valid.begin() + (t + 1) * width),
                want)
          << "token " << t;
    }
    p.valid_counts = nullptr;  // both or neither
    EXPECT_EQ(cuda::TopkToSlots(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST_F(TopkToSlotsCudaTest, RejectsBadRank) {
  TopkToSlotsParams p;
  p.world_size = 2;
  p.rank = -1;
  EXPECT_EQ(cuda::TopkToSlots(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dcp::testing
