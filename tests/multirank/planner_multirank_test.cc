// ExchangePlan (runtime/planner.h) across ranks: every rank gets rank 0's plan, equal to what it
// builds itself, for a small plan (one broadcast) and one longer than the frame (a second
// broadcast); a damaged plan, an error in `local` on one rank and an error of `then` on one rank
// each come back on every rank with that rank's message; `then` runs once per rank on the plan
// it returns, and never where the inputs or the plan failed; and how many host collectives it
// takes.
#include <cstdlib>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "core/status.h"
#include "runtime/plan.h"
#include "runtime/planner.h"
#include "tests/multirank/multirank_test.h"

namespace dcp::testing {
namespace {

// Forwards to another communicator, counting the host collectives.
class CountingCommunicator final : public Communicator {
 public:
  explicit CountingCommunicator(Communicator& inner) : inner_(inner) {}
  int host_collectives() const { return host_collectives_; }
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  MemorySpace memory_space() const override { return inner_.memory_space(); }
  std::string name() const override { return inner_.name(); }
  absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype) override {
    return inner_.AllGather(send, recv, count, dtype);
  }
  absl::Status AllGatherV(const void* send, size_t send_count, void* recv,
                          absl::Span<const size_t> recv_counts, DType dtype) override {
    return inner_.AllGatherV(send, send_count, recv, recv_counts, dtype);
  }
  absl::Status ReduceScatterSum(const void* send, void* recv, size_t count,
                                DType dtype) override {
    return inner_.ReduceScatterSum(send, recv, count, dtype);
  }
  absl::Status AllToAll(const void* send, void* recv, size_t count, DType dtype) override {
    return inner_.AllToAll(send, recv, count, dtype);
  }
  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                         absl::Span<const size_t> send_displs, void* recv,
                         absl::Span<const size_t> recv_counts,
                         absl::Span<const size_t> recv_displs, DType dtype) override {
    return inner_.AllToAllV(send, send_counts, send_displs, recv, recv_counts, recv_displs,
                            dtype);
  }
  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    return inner_.Broadcast(data, bytes, root);
  }
  absl::Status Barrier() override { return inner_.Barrier(); }
  absl::Status HostAllGather(int64_t value, absl::Span<int64_t> values) override {
    ++host_collectives_;
    return inner_.HostAllGather(value, values);
  }
  absl::Status HostBroadcast(void* data, size_t bytes, int root) override {
    ++host_collectives_;
    return inner_.HostBroadcast(data, bytes, root);
  }
  [[noreturn]] void Abort(int exit_code) override {
    inner_.Abort(exit_code);
    std::abort();  // not reached: the compiler does not see through the virtual call
  }

 private:
  Communicator& inner_;
  int host_collectives_ = 0;
};

class PlannerTest : public MultiRankTest {
 protected:
  PlannerConfig Config() const {
    PlannerConfig config;
    config.scheduler.block_size = 16;
    config.scheduler.max_num_seqs = 4096;
    config.scheduler.max_model_len = 4096;
    config.attention.index_topk = 512;
    config.layout = KvLayout{world(), 1};
    config.dense_mha_available = true;
    config.workspace =
        ComputeWorkspaceSize({16, 4096, 4096, 512, world(), 1, 576, 0}).value();
    return config;
  }
  // `count` requests: decodes and short prefills with context, so both kinds of entries and
  // the dense route's chunks are in the plan.
  static std::vector<BatchRequest> Batch(int count) {
    std::vector<BatchRequest> batch;
    for (int i = 0; i < count; ++i) {
      const int seq_len = 40 + (i * 37) % 400;
      batch.push_back({i, seq_len, i % 3 == 0 ? 1 + i % 17 : 1});
    }
    return batch;
  }
};

TEST_F(PlannerTest, EveryRankGetsRankZerosPlanWhateverItsSize) {
  const PlannerConfig config = Config();
  for (int count : {3, 2000}) {
    const std::vector<BatchRequest> batch = Batch(count);
    const absl::StatusOr<Plan> own = BuildPlan(batch, config);
    ASSERT_TRUE(own.ok()) << own.status();
    const std::string bytes = SerializePlan(*own);
    if (count == 2000) {
      ASSERT_GT(bytes.size(), kPlanFrameBytes) << "the large case must take a second broadcast";
    } else {
      ASSERT_LT(bytes.size(), kPlanFrameBytes);
    }
    int calls = 0;
    std::string seen;
    CountingCommunicator counting(comm());
    const absl::StatusOr<Plan> got =
        ExchangePlan(counting, batch, config, absl::OkStatus(), [&](const Plan& plan) {
          ++calls;
          seen = SerializePlan(plan);
          return absl::OkStatus();
        });
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(SerializePlan(*got), bytes) << count << " requests";
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(seen, bytes);
    // The agreement on the inputs and the planning, the plan's frame (and its rest), the
    // agreement on the check and `then`; nothing at all in a world of one.
    const int expected = world() == 1 ? 0 : count == 2000 ? 4 : 3;
    EXPECT_EQ(counting.host_collectives(), expected) << count << " requests";
  }
}

TEST_F(PlannerTest, EveryFailureComesBackOnEveryRank) {
  const PlannerConfig config = Config();
  const int last = world() - 1;
  for (int count : {3, 2000}) {
    const std::vector<BatchRequest> batch = Batch(count);
    int calls = 0;
    auto count_calls = [&](const Plan&) {
      ++calls;
      return absl::OkStatus();
    };
    // The last rank's inputs are bad: nobody plans on, nobody prepares.
    const absl::Status local = rank() == last ? DCP_ERROR(InvalidArgument, "rank %d's inputs", last)
                                              : absl::OkStatus();
    absl::StatusOr<Plan> got = ExchangePlan(comm(), batch, config, local, count_calls);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
    EXPECT_NE(got.status().message().find("rank " + std::to_string(last) + "'s inputs"),
              std::string::npos)
        << got.status();
    EXPECT_EQ(calls, 0);
    // The last rank's preparation fails: the others prepared, and all return its error.
    got = ExchangePlan(comm(), batch, config, absl::OkStatus(), [&](const Plan&) {
      return rank() == last ? DCP_ERROR(ResourceExhausted, "rank %d cannot prepare", last)
                            : absl::OkStatus();
    });
    EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted) << got.status();
    EXPECT_NE(got.status().message().find("cannot prepare"), std::string::npos) << got.status();
    // A damaged broadcast (the byte flipped in the middle: in the second part for the large
    // plan): every rank refuses it, and none prepares.
    calls = 0;
    got = ExchangePlan(comm(), batch, config, absl::OkStatus(), count_calls,
                       /*damage_for_testing=*/rank() == 0);
    EXPECT_FALSE(got.ok());
    EXPECT_EQ(calls, 0) << count << " requests";
  }
}

}  // namespace
}  // namespace dcp::testing
