// main() of every multi-rank gtest binary; see multirank_test.h.
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "core/status.h"
#include "tests/multirank/multirank_test.h"

namespace dcp::testing {

void MultiRankTest::SetUp() {
  auto comm = MpiCommunicator::Create(MPI_COMM_WORLD, /*timeout_s=*/60.0);
  ASSERT_TRUE(comm.ok()) << comm.status();
  comm_ = std::move(comm).value();
}

void MultiRankTest::TearDown() {
  // Every rank reaches TearDown (gtest runs it after a failed ASSERT too), so this plain
  // blocking all-reduce cannot hang on a rank that gave up early.
  const int mine = HasFailure() ? 1 : 0;
  std::vector<int> flags(world_size());
  MPI_Allgather(&mine, 1, MPI_INT, flags.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::string failed_ranks;
  for (size_t r = 0; r < flags.size(); ++r) {
    if (flags[r]) failed_ranks += (failed_ranks.empty() ? "" : ",") + std::to_string(r);
  }
  if (!failed_ranks.empty() && !mine) {
    ADD_FAILURE() << "the test failed on rank(s) " << failed_ranks;
  }
  comm_.reset();
}

namespace {

// Prints what a non-zero rank must say: its failures, with the rank in front.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", rank_, info.test_suite_name(),
                   info.name());
    }
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace dcp::testing

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int rank = dcp::testing::world_rank();
  dcp::set_current_rank(rank);
  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new dcp::testing::FailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  // Skipped as a whole only when nothing failed and every test that ran skipped on every rank
  // (CTest's SKIP_RETURN_CODE): a failure beside skips stays a failure, which a match on
  // "[  SKIPPED ]" in the output did not ensure.
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  int all_skipped = failed == 0 && unit.test_to_run_count() > 0 &&
                            unit.skipped_test_count() == unit.test_to_run_count()
                        ? 1
                        : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_skipped, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Finalize();
  if (failed) return 1;
  return all_skipped ? dcp::testing::kAllSkippedExitCode : 0;
}
