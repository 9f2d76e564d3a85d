// The data plane of a device-buffer communicator exercised with values every rank can predict
// (collective_values.h), shared by the CUDA communicator tests. Results are read back by a copy
// enqueued on the communicator's stream, without Synchronize(), so a stream-ordered
// communicator is checked in stream order (its result must be ready for later work on that
// stream); Synchronize() must then succeed too. Inputs are uploaded with cudaMemcpy and outputs
// poisoned on the legacy default stream: the stream must be a blocking one (or null).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "gtest/gtest.h"
#include "tests/common/collective_values.h"
#include "tests/common/gpu_test_util.h"

namespace dcp::testing {

// Copies `array` to the host through `stream` and waits for that stream only.
template <typename T>
std::vector<T> DownloadOn(const DeviceArray<T>& array, cudaStream_t stream) {
  std::vector<T> host(array.size());
  if (array.size() == 0) return host;
  EXPECT_EQ(cudaMemcpyAsync(host.data(), array.get(), array.size() * sizeof(T),
                            cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return host;
}

template <typename T>
void ExerciseDataPlane(Communicator& comm, cudaStream_t stream) {
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
    const auto recv = DownloadOn(d_recv, stream);
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
    const auto recv = DownloadOn(d_recv, stream);
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
    const auto recv = DownloadOn(d_recv, stream);
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
    const auto recv = DownloadOn(d_recv, stream);
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
    const auto recv = DownloadOn(d_recv, stream);
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
    const auto got = DownloadOn(d_data, stream);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(back(got[i]), value_of(root, i, 6));
  }
  ASSERT_TRUE(comm.Barrier().ok());
  ASSERT_TRUE(comm.Synchronize().ok());
  std::vector<int64_t> values(world);
  ASSERT_TRUE(comm.HostAllGather(me * 3 + 1, absl::MakeSpan(values)).ok());
  for (int r = 0; r < world; ++r) ASSERT_EQ(values[r], r * 3 + 1);
}

// `stream`: the stream the communicator is bound to (null: the legacy default stream).
inline void ExerciseAll(Communicator& comm, cudaStream_t stream = nullptr) {
  EXPECT_EQ(comm.memory_space(), MemorySpace::kDevice);
  ExerciseDataPlane<float>(comm, stream);
  ExerciseDataPlane<bf16>(comm, stream);
  ExerciseDataPlane<int32_t>(comm, stream);
}

}  // namespace dcp::testing
