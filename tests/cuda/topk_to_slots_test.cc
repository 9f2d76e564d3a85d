// Top-k positions -> local slots on the GPU (attention/cuda/topk_to_slots.h) against a
// brute-force enumeration written here: walking a request's tokens in order and counting, per
// rank, how many it already holds (no closed-form layout formula shared with the kernel).
#include <random>
#include <tuple>
#include <vector>

#include "attention/cuda/topk_to_slots.h"
#include "gtest/gtest.h"
#include "tests/cuda/gpu_test_util.h"

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

TEST_F(TopkToSlotsCudaTest, RejectsBadRank) {
  TopkToSlotsParams p;
  p.world_size = 2;
  p.rank = -1;
  EXPECT_EQ(cuda::TopkToSlots(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dcp::testing
