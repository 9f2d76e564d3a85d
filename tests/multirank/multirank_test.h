// The harness of the multi-rank tests: one gtest binary started by `mpirun -np N`.
//
// - main (multirank_main.cc) initializes MPI, keeps rank > 0 quiet unless one of its tests
//   fails, and returns the same exit code on every rank.
// - MultiRankTest is the fixture every multi-rank test derives from: its TearDown shares the
//   verdict, so a failure on any rank fails the test on every rank (naming the ranks).
// - comm() is a fresh MpiCommunicator over MPI_COMM_WORLD with a short timeout, so a rank
//   that bails out early turns its peers' collectives into errors instead of a hang.
#pragma once

#include <mpi.h>

#include <memory>

#include "collectives/mpi_communicator.h"
#include "gtest/gtest.h"

namespace dcp::testing {

// A multi-rank binary's exit code when every test that ran skipped on every rank and none
// failed (no GPU): CTest's SKIP_RETURN_CODE of the GPU entries (tests/multirank/CMakeLists.txt).
inline constexpr int kAllSkippedExitCode = 77;

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

inline int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

class MultiRankTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  Communicator& comm() { return *comm_; }
  MpiCommunicator& mpi_comm() { return *comm_; }
  int rank() const { return comm_->rank(); }
  int world() const { return comm_->world_size(); }

 private:
  std::unique_ptr<MpiCommunicator> comm_;
};

}  // namespace dcp::testing
