// NcclCommunicator in one process on one GPU (a world of one, adopted from ncclCommInitAll; no
// MPI): stream-ordered calls give the values host-completing ones give, a CUDA graph of
// collectives replays with equal results, Adopt leaves a borrowed communicator usable, and
// the control plane runs over NCCL when there is no MPI communicator. Multi-rank NCCL is
// checked by cuda_communicator_multirank_test at np = number of GPUs.
#include "collectives/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/collective_values.h"
#include "tests/common/communicator_exercise.h"
#include "tests/common/gpu_test_util.h"

namespace dcp::testing {
namespace {

class NcclCommunicatorTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    int device = 0;
    ASSERT_EQ(ncclCommInitAll(&comm_, 1, &device), ncclSuccess) << ncclGetLastError(nullptr);
    DCP_ASSERT_CUDA(cudaStreamCreate(&stream_));  // blocking: ordered with the legacy stream
  }
  void TearDown() override {
    if (comm_ != nullptr) EXPECT_EQ(ncclCommDestroy(comm_), ncclSuccess);
    if (stream_ != nullptr) EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
    GpuTest::TearDown();
  }
  std::unique_ptr<NcclCommunicator> Adopt(Completion completion, cudaStream_t stream) {
    NcclOptions options;
    options.timeout_s = 30.0;
    options.stream = stream;
    options.completion = completion;
    auto adopted = NcclCommunicator::Adopt(comm_, options, NcclCommunicator::Ownership::kBorrowed);
    EXPECT_TRUE(adopted.ok()) << adopted.status();
    return adopted.ok() ? std::move(adopted).value() : nullptr;
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

TEST_F(NcclCommunicatorTest, StreamOrderedGivesTheValuesOfHostCompletion) {
  for (Completion completion : {Completion::kHost, Completion::kStream}) {
    SCOPED_TRACE(completion == Completion::kHost ? "host completion" : "stream order");
    auto comm = Adopt(completion, stream_);
    ASSERT_NE(comm, nullptr);
    EXPECT_EQ(comm->completion(), completion);
    EXPECT_EQ(comm->rank(), 0);
    EXPECT_EQ(comm->world_size(), 1);
    ExerciseAll(*comm, stream_);  // the control plane goes over NCCL too (no MPI here)
    EXPECT_TRUE(AgreeOnStatus(*comm, absl::OkStatus()).ok());
    const absl::Status failed = AgreeOnStatus(*comm, absl::InternalError("rank 0 says no"));
    EXPECT_EQ(failed.code(), absl::StatusCode::kInternal);
    EXPECT_EQ(failed.message(), "rank 0 says no");
  }
  // Host completion -> stream order on the same communicator, and back.
  auto comm = Adopt(Completion::kHost, nullptr);
  ASSERT_NE(comm, nullptr);
  ASSERT_TRUE(comm->BindStream(stream_, Completion::kStream).ok());
  EXPECT_EQ(comm->stream(), stream_);
  ExerciseDataPlane<float>(*comm, stream_);
  ASSERT_TRUE(comm->BindStream(nullptr, Completion::kHost).ok());
  ExerciseDataPlane<int32_t>(*comm, nullptr);
}

// The collectives of a step, captured once and replayed: equal to the eager results, bit for
// bit, and a second replay after new inputs gives the new results (the graph really runs).
TEST_F(NcclCommunicatorTest, GraphCapturedCollectivesReplayEqual) {
  cudaStream_t stream = nullptr;
  DCP_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto comm = Adopt(Completion::kStream, stream);
  ASSERT_NE(comm, nullptr);
  constexpr size_t kCount = 3000;
  const auto fill = [&](int salt, DeviceArray<float>& f32, DeviceArray<bf16>& b16,
                        DeviceArray<int32_t>& i32) {
    std::vector<float> a(kCount);
    std::vector<bf16> b(kCount);
    std::vector<int32_t> c(kCount);
    for (size_t i = 0; i < kCount; ++i) {
      a[i] = as<float>(value_of(0, i, salt));
      b[i] = as<bf16>(value_of(0, i, salt + 1));
      c[i] = as<int32_t>(value_of(0, i, salt + 2));
    }
    f32.Upload(a);
    b16.Upload(b);
    i32.Upload(c);
  };
  DeviceArray<float> in_f32(kCount);
  DeviceArray<bf16> in_bf16(kCount);
  DeviceArray<int32_t> in_i32(kCount);
  fill(1, in_f32, in_bf16, in_i32);
  struct Outputs {
    DeviceArray<float> gathered{kCount};
    DeviceArray<bf16> summed{kCount};
    DeviceArray<int32_t> exchanged{kCount};
    DeviceArray<float> gathered_v{kCount};
    void Poison() {
      gathered.Poison();
      summed.Poison();
      exchanged.Poison();
      gathered_v.Poison();
    }
  };
  const std::vector<size_t> counts = {kCount};
  const auto step = [&](Outputs& out) {
    EXPECT_TRUE(comm->AllGather(in_f32.get(), out.gathered.get(), kCount, DType::kF32).ok());
    EXPECT_TRUE(comm->ReduceScatterSum(in_bf16.get(), out.summed.get(), kCount, DType::kBF16).ok());
    EXPECT_TRUE(comm->AllToAll(in_i32.get(), out.exchanged.get(), kCount, DType::kI32).ok());
    EXPECT_TRUE(
        comm->AllGatherV(in_f32.get(), kCount, out.gathered_v.get(), counts, DType::kF32).ok());
  };
  Outputs eager, replayed;
  eager.Poison();
  replayed.Poison();
  DCP_ASSERT_CUDA(cudaDeviceSynchronize());
  step(eager);  // also the warm-up before capture
  ASSERT_TRUE(comm->Synchronize().ok());
  ASSERT_TRUE(comm->ReserveReduceScatter(kCount, DType::kBF16).ok());

  DeviceArray<bf16> big_in(4 * kCount), big_out(4 * kCount);  // (no cudaMalloc in a capture)
  cudaGraph_t graph = nullptr;
  DCP_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  step(replayed);
  // Inside a capture nothing may allocate: a sum larger than reserved is refused, not grown.
  const absl::Status refused =
      comm->ReduceScatterSum(big_in.get(), big_out.get(), 4 * kCount, DType::kBF16);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("ReserveReduceScatter"), std::string::npos) << refused;
  DCP_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  DCP_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  DCP_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
  ASSERT_TRUE(comm->WatchStream("graph replay").ok());
  ASSERT_TRUE(comm->Synchronize().ok());
  EXPECT_EQ(DownloadOn(replayed.gathered, stream), DownloadOn(eager.gathered, stream));
  const auto summed = DownloadOn(replayed.summed, stream);
  const auto summed_eager = DownloadOn(eager.summed, stream);
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(back(summed[i]), back(summed_eager[i])) << i;
    ASSERT_EQ(back(summed[i]), value_of(0, i, 2)) << i;
  }
  EXPECT_EQ(DownloadOn(replayed.exchanged, stream), DownloadOn(eager.exchanged, stream));
  EXPECT_EQ(DownloadOn(replayed.gathered_v, stream), DownloadOn(eager.gathered_v, stream));

  // New inputs, poisoned outputs, replay again.
  fill(7, in_f32, in_bf16, in_i32);
  replayed.Poison();
  DCP_ASSERT_CUDA(cudaDeviceSynchronize());
  DCP_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
  ASSERT_TRUE(comm->WatchStream("graph replay").ok());
  const auto gathered = DownloadOn(replayed.gathered, stream);
  const auto exchanged = DownloadOn(replayed.exchanged, stream);
  const auto summed2 = DownloadOn(replayed.summed, stream);
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(gathered[i], as<float>(value_of(0, i, 7))) << i;
    ASSERT_EQ(back(summed2[i]), value_of(0, i, 8)) << i;
    ASSERT_EQ(exchanged[i], as<int32_t>(value_of(0, i, 9))) << i;
  }
  ASSERT_TRUE(comm->Synchronize().ok());
  EXPECT_TRUE(comm->failure().ok());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  comm.reset();
  DCP_ASSERT_CUDA(cudaStreamDestroy(stream));
}

// Host completion cannot be captured: a clear error, not a broken capture or a hang.
TEST_F(NcclCommunicatorTest, HostCompletionInsideACaptureIsAClearError) {
  cudaStream_t stream = nullptr;
  DCP_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    auto comm = Adopt(Completion::kHost, stream);
    ASSERT_NE(comm, nullptr);
    DeviceArray<float> send(std::vector<float>(64, 1.0f)), recv(64);
    ASSERT_TRUE(comm->AllGather(send.get(), recv.get(), 64, DType::kF32).ok());  // warm-up
    cudaGraph_t graph = nullptr;
    DCP_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const absl::Status status = comm->AllGather(send.get(), recv.get(), 64, DType::kF32);
    DCP_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_NE(status.message().find("Completion::kStream"), std::string::npos) << status;
    if (graph != nullptr) cudaGraphDestroy(graph);
    EXPECT_EQ(comm->BindStream(stream, Completion::kStream), absl::OkStatus());
    ASSERT_TRUE(comm->AllGather(send.get(), recv.get(), 64, DType::kF32).ok());
    ASSERT_TRUE(comm->Synchronize().ok());
  }
  DCP_ASSERT_CUDA(cudaStreamDestroy(stream));
}

TEST_F(NcclCommunicatorTest, AdoptLeavesABorrowedCommunicatorToItsOwner) {
  {
    auto comm = Adopt(Completion::kStream, stream_);
    ASSERT_NE(comm, nullptr);
    EXPECT_EQ(comm->name(), "nccl");
    EXPECT_EQ(comm->device(), 0);
    DeviceArray<float> send(std::vector<float>(16, 2.0f)), recv(16);
    ASSERT_TRUE(comm->AllGather(send.get(), recv.get(), 16, DType::kF32).ok());
    ASSERT_TRUE(comm->Synchronize().ok());
  }
  // Still the engine's, still working.
  DeviceArray<float> send(std::vector<float>(16, 3.0f)), recv(16);
  recv.Poison();
  ASSERT_EQ(ncclAllGather(send.get(), recv.get(), 16, ncclFloat32, comm_, stream_), ncclSuccess);
  const auto got = DownloadOn(recv, stream_);
  for (float v : got) ASSERT_EQ(v, 3.0f);

  NcclOptions options;
  auto null_comm =
      NcclCommunicator::Adopt(nullptr, options, NcclCommunicator::Ownership::kBorrowed);
  EXPECT_EQ(null_comm.status().code(), absl::StatusCode::kInvalidArgument);
  options.timeout_s = 0;
  auto no_timeout = NcclCommunicator::Adopt(comm_, options, NcclCommunicator::Ownership::kBorrowed);
  EXPECT_EQ(no_timeout.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(NcclCommunicatorTest, AdoptOwnedDestroysTheCommunicator) {
  int device = 0;
  ncclComm_t owned = nullptr;
  ASSERT_EQ(ncclCommInitAll(&owned, 1, &device), ncclSuccess);
  NcclOptions options;
  options.completion = Completion::kStream;
  auto comm = NcclCommunicator::Adopt(owned, options, NcclCommunicator::Ownership::kOwned);
  ASSERT_TRUE(comm.ok()) << comm.status();
  DeviceArray<int32_t> send(std::vector<int32_t>(8, 5)), recv(8);
  ASSERT_TRUE((*comm)->AllToAll(send.get(), recv.get(), 8, DType::kI32).ok());
  ASSERT_TRUE((*comm)->Synchronize().ok());
  EXPECT_EQ(DownloadOn(recv, nullptr), std::vector<int32_t>(8, 5));
  comm->reset();  // finalizes and destroys `owned`; a leak or a hang would show here
}

TEST_F(NcclCommunicatorTest, RejectsAStreamOfAnotherGpu) {
  if (VisibleGpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs (a stream of the other one)";
  DCP_ASSERT_CUDA(cudaSetDevice(1));
  cudaStream_t other = nullptr;
  DCP_ASSERT_CUDA(cudaStreamCreate(&other));
  DCP_ASSERT_CUDA(cudaSetDevice(0));
  auto comm = Adopt(Completion::kStream, stream_);
  ASSERT_NE(comm, nullptr);
  const absl::Status status = comm->BindStream(other, Completion::kStream);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("GPU 1"), std::string::npos) << status;
  EXPECT_EQ(comm->stream(), stream_);
  DCP_ASSERT_CUDA(cudaStreamDestroy(other));
}

}  // namespace
}  // namespace dcp::testing
