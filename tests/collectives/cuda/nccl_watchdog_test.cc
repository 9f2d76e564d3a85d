// The watchdog of NcclCommunicator on one GPU: a stream held by a kernel that spins on a
// host-mapped flag stands in for a collective that cannot complete. The deadline must fire
// (DeadlineExceeded naming the call and the rank), every later call must return that error,
// and after the flag is released the stream must drain. The peer-missing case needs 2 GPUs:
// cuda_communicator_multirank_test (NcclWatchdogFailsEveryRankWhenAPeerIsMissing).
// A binary of its own: an aborted communicator must not leave state behind for other tests.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "collectives/cuda/nccl_communicator.h"
#include "gtest/gtest.h"
#include "tests/common/gpu_test_util.h"
#include "tests/common/spin_kernel.h"

namespace dcp::testing {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kTimeout = 0.5;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

class NcclWatchdogTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    int device = 0;
    ASSERT_EQ(ncclCommInitAll(&comm_, 1, &device), ncclSuccess) << ncclGetLastError(nullptr);
    DCP_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DCP_ASSERT_CUDA(cudaHostAlloc(&flag_, sizeof(int), cudaHostAllocMapped));
    *flag_ = 0;
    DCP_ASSERT_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_flag_), flag_, 0));
    // Allocated up front: cudaFree waits for the device, which the held stream keeps busy.
    probe_send_ = DeviceArray<float>(16);
    probe_recv_ = DeviceArray<float>(16);
  }
  void TearDown() override {
    if (flag_ != nullptr) {
      Release();
      EXPECT_TRUE(StreamDrains(10.0)) << "the stream did not drain after the flag was set";
    }
    comm_wrapper_.reset();
    // The communicator was aborted by the watchdog (ours, kOwned): nothing left to destroy.
    if (stream_ != nullptr) EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
    if (flag_ != nullptr) EXPECT_EQ(cudaFreeHost(flag_), cudaSuccess);
    GpuTest::TearDown();
  }

  NcclCommunicator& Adopt(Completion completion) {
    NcclOptions options;
    options.timeout_s = kTimeout;
    options.stream = stream_;
    options.completion = completion;
    options.watchdog_interval_s = 0.001;
    auto adopted = NcclCommunicator::Adopt(comm_, options, NcclCommunicator::Ownership::kOwned);
    EXPECT_TRUE(adopted.ok()) << adopted.status();
    comm_wrapper_ = std::move(adopted).value();
    comm_ = nullptr;  // the wrapper owns it now
    return *comm_wrapper_;
  }
  void Block() { ASSERT_EQ(LaunchSpinUntilSet(device_flag_, 30.0, stream_), cudaSuccess); }
  void Release() { __atomic_store_n(flag_, 1, __ATOMIC_SEQ_CST); }
  bool StreamDrains(double limit_s) {
    const auto start = Clock::now();
    while (SecondsSince(start) < limit_s) {
      const cudaError_t state = cudaStreamQuery(stream_);
      if (state == cudaSuccess) return true;
      if (state != cudaErrorNotReady) {
        ADD_FAILURE() << "stream error: " << cudaGetErrorString(state);
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }
  // Waits (bounded) until the communicator reports a failure; returns the seconds waited.
  double WaitForFailure(NcclCommunicator& comm, double limit_s) {
    const auto start = Clock::now();
    while (comm.failure().ok() && SecondsSince(start) < limit_s) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return SecondsSince(start);
  }
  // The failure, then: every later call returns it unchanged.
  void ExpectBrokenWith(NcclCommunicator& comm, const std::string& what) {
    const absl::Status failure = comm.failure();
    ASSERT_EQ(failure.code(), absl::StatusCode::kDeadlineExceeded) << failure;
    EXPECT_NE(failure.message().find(what), std::string::npos) << failure;
    EXPECT_NE(failure.message().find("rank 0 of 1"), std::string::npos) << failure;
    EXPECT_NE(failure.message().find("aborted"), std::string::npos) << failure;
    EXPECT_EQ(comm.AllGather(probe_send_.get(), probe_recv_.get(), 16, DType::kF32), failure);
    EXPECT_EQ(comm.ReduceScatterSum(probe_send_.get(), probe_recv_.get(), 16, DType::kF32),
              failure);
    EXPECT_EQ(comm.Synchronize(), failure);
    std::vector<int64_t> values(1);
    EXPECT_EQ(comm.HostAllGather(1, absl::MakeSpan(values)), failure);
    EXPECT_EQ(comm.WatchStream("again"), failure);
  }

  ncclComm_t comm_ = nullptr;
  std::unique_ptr<NcclCommunicator> comm_wrapper_;
  cudaStream_t stream_ = nullptr;
  int* flag_ = nullptr;
  int* device_flag_ = nullptr;
  DeviceArray<float> probe_send_, probe_recv_;
};

// WatchStream puts the held stream under the deadline; no NCCL work is queued behind it.
TEST_F(NcclWatchdogTest, DeadlineFiresOnAHeldStream) {
  NcclCommunicator& comm = Adopt(Completion::kStream);
  Block();
  ASSERT_TRUE(comm.WatchStream("held stream").ok());
  const double waited = WaitForFailure(comm, 10.0);
  EXPECT_GE(waited, 0.8 * kTimeout);
  EXPECT_LT(waited, kTimeout + 2.0);
  ExpectBrokenWith(comm, "held stream");
  Release();
  EXPECT_TRUE(StreamDrains(10.0));
}

// Host completion: the call itself waits, and returns DeadlineExceeded at the deadline.
TEST_F(NcclWatchdogTest, HostCompletionReturnsDeadlineExceeded) {
  NcclCommunicator& comm = Adopt(Completion::kHost);
  DeviceArray<float> send(std::vector<float>(256, 1.0f)), recv(256);
  ASSERT_TRUE(comm.AllGather(send.get(), recv.get(), 256, DType::kF32).ok());  // warm-up
  Block();
  // ncclCommAbort in the failing call may wait for the device on some NCCL versions: let the
  // stream go a second after the deadline so that this cannot hang; either way the call must
  // return within the deadline plus a few seconds (the contract in nccl_communicator.h). The
  // abort itself took 0.8 s on the H200 with the rest of the suite running beside it.
  std::thread releaser([this] {
    std::this_thread::sleep_for(std::chrono::duration<double>(kTimeout + 1.0));
    Release();
  });
  const auto start = Clock::now();
  const absl::Status status = comm.AllGather(send.get(), recv.get(), 256, DType::kF32);
  const double waited = SecondsSince(start);
  releaser.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_GE(waited, 0.8 * kTimeout);
  EXPECT_LT(waited, kTimeout + 3.0);
  ExpectBrokenWith(comm, "ncclAllGather");
  Release();
  EXPECT_TRUE(StreamDrains(10.0));
}

// A stream-ordered collective queued behind the held stream: the call returns at once, the
// watchdog aborts at the deadline, the next call returns the error naming the collective.
TEST_F(NcclWatchdogTest, DeadlineFiresOnAStreamOrderedCollective) {
  NcclCommunicator& comm = Adopt(Completion::kStream);
  DeviceArray<float> send(std::vector<float>(256, 1.0f)), recv(256);
  ASSERT_TRUE(comm.AllGather(send.get(), recv.get(), 256, DType::kF32).ok());  // warm-up
  ASSERT_TRUE(comm.Synchronize().ok());
  Block();
  const auto start = Clock::now();
  ASSERT_TRUE(comm.AllGather(send.get(), recv.get(), 256, DType::kF32).ok());
  EXPECT_LT(SecondsSince(start), 0.5 * kTimeout) << "a stream-ordered call must not wait";
  const double waited = WaitForFailure(comm, 10.0);
  EXPECT_GE(waited, 0.5 * kTimeout);
  EXPECT_LT(waited, kTimeout + 2.0);
  ExpectBrokenWith(comm, "ncclAllGather (call #2");
  Release();
  EXPECT_TRUE(StreamDrains(10.0));
}

// A failure while a CUDA graph holding the communicator's calls still exists: NCCL's abort
// waits until that graph is destroyed, and the thread that owns the graph is the caller's. The
// failing call (host completion: its own deadline) must return at the deadline, not wait in
// the abort for a graph only it can destroy; once the graph goes, the abort finishes and the
// communicator can be destroyed. Before, the call aborted on its own thread and never returned.
TEST_F(NcclWatchdogTest, AFailureWithALiveGraphReturnsAndTheAbortWaitsForTheGraph) {
  NcclCommunicator& comm = Adopt(Completion::kStream);
  DeviceArray<float> send(std::vector<float>(256, 1.0f)), recv(256);
  ASSERT_TRUE(comm.AllGather(send.get(), recv.get(), 256, DType::kF32).ok());  // warm-up
  ASSERT_TRUE(comm.Synchronize().ok());
  cudaGraph_t graph = nullptr;
  DCP_ASSERT_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  const absl::Status captured = comm.AllGather(send.get(), recv.get(), 256, DType::kF32);
  DCP_ASSERT_CUDA(cudaStreamEndCapture(stream_, &graph));
  ASSERT_TRUE(captured.ok()) << captured;
  cudaGraphExec_t exec = nullptr;
  DCP_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  ASSERT_TRUE(comm.BindStream(stream_, Completion::kHost).ok());
  Block();
  const auto start = Clock::now();
  const absl::Status status = comm.AllGather(send.get(), recv.get(), 256, DType::kF32);
  const double waited = SecondsSince(start);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_LT(waited, kTimeout + 2.0) << "the failing call waited in NCCL's abort";
  ExpectBrokenWith(comm, "ncclAllGather");

  // The graph goes, the stream is let go: the abort (on the watchdog's thread) can finish,
  // and TearDown destroys the communicator, which waits for it.
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  Release();
  EXPECT_TRUE(StreamDrains(10.0));
}

}  // namespace
}  // namespace dcp::testing
