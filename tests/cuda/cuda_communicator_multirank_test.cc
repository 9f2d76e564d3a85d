// The CUDA communicators on device buffers, under mpirun: MPI with host staging (always), the
// factory's "auto" choice, and NCCL when every rank has its own GPU (at np 1 that is a world
// of one; on the single-GPU machine np > 1 shares the GPU, where "nccl" must be a clear error).
// Values are small multiples of 1/4 so bf16 holds them and their sums exactly.
#include <cuda_runtime.h>

#include <numeric>
#include <vector>

#include "collectives/cuda/cuda_communicator_factory.h"
#include "collectives/cuda/nccl_communicator.h"
#include "runtime/cuda/cuda_device.h"
#include "tests/cuda/gpu_test_util.h"
#include "tests/multirank/collective_values.h"
#include "tests/multirank/multirank_test.h"

namespace dcp::testing {
namespace {

template <typename T>
void ExerciseDataPlane(Communicator& comm) {
  const int world = comm.world_size(), me = comm.rank();
  const DType dtype = dtype_of<T>();
  SCOPED_TRACE(std::string(comm.name()) + " " + std::string(dtype_name(dtype)));
  // AllGather
  for (size_t count : {size_t{1}, size_t{4099}}) {
    std::vector<T> send(count);
    for (size_t i = 0; i < count; ++i) send[i] = as<T>(value_of(me, i, 1));
    DeviceArray<T> d_send(send), d_recv(count * world);
    d_recv.Poison();
    ASSERT_TRUE(comm.AllGather(d_send.get(), d_recv.get(), count, dtype).ok());
    const auto recv = d_recv.Download();
    for (int r = 0; r < world; ++r)
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(back(recv[r * count + i]), value_of(r, i, 1));
  }
  // AllGatherV with empty parts
  {
    std::vector<size_t> counts(world);
    for (int r = 0; r < world; ++r) counts[r] = (r % 3 == 1) ? 0 : size_t(r * 5 + 3);
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    std::vector<T> send(counts[me]);
    for (size_t i = 0; i < send.size(); ++i) send[i] = as<T>(value_of(me, i, 2));
    DeviceArray<T> d_send(send), d_recv(total);
    d_recv.Poison();
    ASSERT_TRUE(comm.AllGatherV(d_send.get(), send.size(), d_recv.get(), counts, dtype).ok());
    const auto recv = d_recv.Download();
    size_t offset = 0;
    for (int r = 0; r < world; ++r) {
      for (size_t i = 0; i < counts[r]; ++i) ASSERT_EQ(back(recv[offset + i]), value_of(r, i, 2));
      offset += counts[r];
    }
  }
  // ReduceScatterSum
  {
    const size_t count = 2048;
    std::vector<T> send(count * world);
    for (int q = 0; q < world; ++q)
      for (size_t i = 0; i < count; ++i) send[q * count + i] = as<T>(value_of(me, i + q * 3, 3));
    DeviceArray<T> d_send(send), d_recv(count);
    d_recv.Poison();
    ASSERT_TRUE(comm.ReduceScatterSum(d_send.get(), d_recv.get(), count, dtype).ok());
    const auto recv = d_recv.Download();
    for (size_t i = 0; i < count; ++i) {
      double want = 0;
      for (int r = 0; r < world; ++r) want += value_of(r, i + me * 3, 3);
      ASSERT_EQ(back(recv[i]), want) << "element " << i;
    }
  }
  // AllToAll
  {
    const size_t count = 777;
    std::vector<T> send(count * world);
    for (int q = 0; q < world; ++q)
      for (size_t i = 0; i < count; ++i) send[q * count + i] = as<T>(value_of(me * 7 + q, i, 4));
    DeviceArray<T> d_send(send), d_recv(count * world);
    d_recv.Poison();
    ASSERT_TRUE(comm.AllToAll(d_send.get(), d_recv.get(), count, dtype).ok());
    const auto recv = d_recv.Download();
    for (int q = 0; q < world; ++q)
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(back(recv[q * count + i]), value_of(q * 7 + me, i, 4));
  }
  // AllToAllV: block sizes (sender + receiver) % 3 * 10 (some empty)
  {
    std::vector<size_t> sc(world), sd(world), rc(world), rd(world);
    size_t s_total = 0, r_total = 0;
    for (int q = 0; q < world; ++q) {
      sc[q] = size_t((me + q) % 3) * 10;
      rc[q] = size_t((q + me) % 3) * 10;
      sd[q] = s_total;
      rd[q] = r_total;
      s_total += sc[q];
      r_total += rc[q];
    }
    std::vector<T> send(s_total);
    for (int q = 0; q < world; ++q)
      for (size_t i = 0; i < sc[q]; ++i) send[sd[q] + i] = as<T>(value_of(me * 5 + q, i, 5));
    DeviceArray<T> d_send(send), d_recv(std::max<size_t>(r_total, 1));
    d_recv.Poison();
    ASSERT_TRUE(comm.AllToAllV(d_send.get(), sc, sd, d_recv.get(), rc, rd, dtype).ok());
    const auto recv = d_recv.Download();
    for (int q = 0; q < world; ++q)
      for (size_t i = 0; i < rc[q]; ++i)
        ASSERT_EQ(back(recv[rd[q] + i]), value_of(q * 5 + me, i, 5));
  }
  // Broadcast from the last rank
  {
    const size_t count = 1000;
    const int root = world - 1;
    std::vector<T> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = as<T>(value_of(me, i, 6));
    DeviceArray<T> d_data(data);
    ASSERT_TRUE(comm.Broadcast(d_data.get(), count * sizeof(T), root).ok());
    const auto got = d_data.Download();
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(back(got[i]), value_of(root, i, 6));
  }
  ASSERT_TRUE(comm.Barrier().ok());
  std::vector<int64_t> values(world);
  ASSERT_TRUE(comm.HostAllGather(me * 3 + 1, absl::MakeSpan(values)).ok());
  for (int r = 0; r < world; ++r) ASSERT_EQ(values[r], r * 3 + 1);
}

void ExerciseAll(Communicator& comm) {
  EXPECT_EQ(comm.memory_space(), MemorySpace::kDevice);
  ExerciseDataPlane<float>(comm);
  ExerciseDataPlane<bf16>(comm);
  ExerciseDataPlane<int32_t>(comm);
}

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
  ExerciseAll(**comm);
}

TEST_F(CudaCommunicatorTest, AutoPicksNcclOnlyForDistinctGpus) {
  auto comm = MakeCudaCommunicator(mpi_comm(), "auto", 60.0);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->name() == "nccl", !share_gpu_) << (*comm)->name();
  ExerciseAll(**comm);
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
  ExerciseAll(**comm);
}

TEST_F(CudaCommunicatorTest, RejectsUnknownComm) {
  auto comm = MakeCudaCommunicator(mpi_comm(), "gloo", 60.0);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dcp::testing
