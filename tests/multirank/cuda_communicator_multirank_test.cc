// The CUDA communicators on device buffers, under mpirun: MPI with host staging (always), the
// factory's "auto" choice, and NCCL when every rank has its own GPU (at np 1 that is a world
// of one; on the single-GPU machine np > 1 shares the GPU, where "nccl" must be a clear error).
// Values are small multiples of 1/4 so bf16 holds them and their sums exactly.
#include <cuda_runtime.h>

#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "collectives/cuda/cuda_communicator_factory.h"
#include "collectives/cuda/nccl_communicator.h"
#include "runtime/cuda/cuda_device.h"
#include "tests/common/communicator_exercise.h"
#include "tests/common/gpu_test_util.h"
#include "tests/multirank/multirank_test.h"

namespace dcp::testing {
namespace {

class CudaCommunicatorTest : public MultiRankTest {
 protected:
  void SetUp() override {
    MultiRankTest::SetUp();
    DCP_SKIP_OR_FAIL_WITHOUT_GPU();
    auto ordinal = SelectLocalDevice();
    ASSERT_TRUE(ordinal.ok()) << ordinal.status();
    auto device = CudaDevice::Create(*ordinal);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(device).value();
    auto share = RanksShareGpu(mpi_comm());
    ASSERT_TRUE(share.ok()) << share.status();
    share_gpu_ = *share;
  }
  void TearDown() override {
    device_.reset();
    MultiRankTest::TearDown();
  }
  std::unique_ptr<CudaDevice> device_;
  bool share_gpu_ = false;
};

TEST_F(CudaCommunicatorTest, MpiWithHostStaging) {
  auto comm = MakeCudaCommunicator(mpi_comm(), "mpi", 60.0, device_->stream());
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_NE((*comm)->name().find("host_staging"), std::string::npos);
  ExerciseAll(**comm, device_->stream());
}

TEST_F(CudaCommunicatorTest, HostStagingKeepsHostCompletionWhenAskedForStreamOrder) {
  auto comm = MakeCudaCommunicator(mpi_comm(), "mpi", 60.0);
  ASSERT_TRUE(comm.ok()) << comm.status();
  ASSERT_TRUE((*comm)->BindStream(device_->stream(), Completion::kStream).ok());
  EXPECT_EQ((*comm)->completion(), Completion::kHost);
  ExerciseAll(**comm, device_->stream());
}

TEST_F(CudaCommunicatorTest, AutoPicksNcclOnlyForDistinctGpus) {
  auto comm = MakeCudaCommunicator(mpi_comm(), "auto", 60.0);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->name() == "nccl", !share_gpu_) << (*comm)->name();
  ExerciseAll(**comm);  // the legacy default stream
}

TEST_F(CudaCommunicatorTest, NcclOrAClearErrorOnSharedGpus) {
  auto comm = MakeCudaCommunicator(mpi_comm(), "nccl", 60.0, device_->stream());
  if (share_gpu_) {
    ASSERT_FALSE(comm.ok());
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(comm.status().message().find("one GPU per rank"), std::string::npos)
        << comm.status();
    return;
  }
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->name(), "nccl");
  ExerciseAll(**comm, device_->stream());
}

// NCCL needs one GPU per rank: these run at np = the number of GPUs (np 1 everywhere; np 2+ on a
// machine with that many GPUs) and skip, saying why, where ranks share a GPU.
#define DCP_SKIP_IF_SHARED_GPU()                                                              \
  do {                                                                                        \
    if (share_gpu_) {                                                                         \
      GTEST_SKIP() << "ranks share a GPU and NCCL refuses that: run at np <= number of GPUs"; \
    }                                                                                         \
  } while (0)

TEST_F(CudaCommunicatorTest, NcclStreamOrderedGivesTheSameValues) {
  DCP_SKIP_IF_SHARED_GPU();
  auto comm = MakeCudaCommunicator(mpi_comm(), "nccl", 60.0);
  ASSERT_TRUE(comm.ok()) << comm.status();
  ASSERT_TRUE((*comm)->BindStream(device_->stream(), Completion::kStream).ok());
  EXPECT_EQ((*comm)->completion(), Completion::kStream);
  ExerciseAll(**comm, device_->stream());
}

// A peer that never joins: rank 0 enqueues an all-gather the others skip. Its watchdog must
// abort it at the deadline and its next call return DeadlineExceeded naming the collective;
// then the others enqueue one that cannot complete either (rank 0 is gone) and fail the same
// way. Nobody hangs.
TEST_F(CudaCommunicatorTest, NcclWatchdogFailsEveryRankWhenAPeerIsMissing) {
  if (world() < 2) GTEST_SKIP() << "needs 2+ ranks (and as many GPUs)";
  DCP_SKIP_IF_SHARED_GPU();
  constexpr double kTimeout = 2.0;
  NcclOptions options;
  options.timeout_s = kTimeout;
  options.stream = device_->stream();
  options.completion = Completion::kStream;
  auto created = NcclCommunicator::Create(mpi_comm(), options);
  ASSERT_TRUE(created.ok()) << created.status();
  NcclCommunicator& nccl = **created;
  DeviceArray<float> send(std::vector<float>(1024, 1.0f)), recv(1024 * size_t(world()));
  ASSERT_TRUE(nccl.AllGather(send.get(), recv.get(), 1024, DType::kF32).ok());
  ASSERT_TRUE(nccl.Synchronize().ok());  // connected and working

  const auto waited_for_failure = [&](double limit_s) {
    const auto started = std::chrono::steady_clock::now();
    while (nccl.failure().ok() &&
           std::chrono::steady_clock::now() - started < std::chrono::duration<double>(limit_s)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };
  if (rank() == 0) {
    const auto started = std::chrono::steady_clock::now();
    ASSERT_TRUE(nccl.AllGather(send.get(), recv.get(), 1024, DType::kF32).ok());
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
              0.5 * kTimeout)
        << "a stream-ordered call must not wait for its peers";
    const double waited = waited_for_failure(kTimeout + 10);
    EXPECT_GT(waited, 0.5 * kTimeout);
    EXPECT_LT(waited, kTimeout + 5);
  }
  std::vector<int64_t> sync(world());
  ASSERT_TRUE(mpi_comm().HostAllGather(0, absl::MakeSpan(sync)).ok());  // rank 0 has failed
  if (rank() != 0) {
    // The first may still pair with what rank 0 left behind; the second cannot complete.
    for (int call = 0; call < 2 && nccl.failure().ok(); ++call) {
      (void)nccl.AllGather(send.get(), recv.get(), 1024, DType::kF32);
    }
    const double waited = waited_for_failure(kTimeout + 10);
    EXPECT_LT(waited, kTimeout + 5);
  }
  const absl::Status next = nccl.AllGather(send.get(), recv.get(), 1024, DType::kF32);
  ASSERT_FALSE(next.ok()) << "rank " << rank() << ": no error after the peer went missing";
  EXPECT_TRUE(next.code() == absl::StatusCode::kDeadlineExceeded ||
              next.code() == absl::StatusCode::kInternal)
      << next;
  EXPECT_NE(next.message().find("ncclAllGather"), std::string::npos) << next;
  EXPECT_NE(next.message().find(absl::StrFormat("rank %d of", rank())), std::string::npos) << next;
  EXPECT_EQ(nccl.Synchronize(), next);  // the same error from every later call
  EXPECT_EQ(nccl.HostAllGather(1, absl::MakeSpan(sync)), next);
}

TEST_F(CudaCommunicatorTest, RejectsUnknownComm) {
  auto comm = MakeCudaCommunicator(mpi_comm(), "gloo", 60.0);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dcp::testing
