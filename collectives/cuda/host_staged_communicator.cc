#include "collectives/cuda/host_staged_communicator.h"

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "core/cuda/cuda_status.h"
#include "core/status.h"

namespace dcp {

absl::StatusOr<std::unique_ptr<HostStagedCommunicator>> HostStagedCommunicator::Create(
    Communicator& host, cudaStream_t stream) {
  DCP_CHECK_ARG(host.memory_space() == MemorySpace::kHost,
                "HostStagedCommunicator: the wrapped communicator '%s' must use host memory",
                host.name());
  int device = -1;
  DCP_CUDA_CHECK(cudaGetDevice(&device));
  return std::unique_ptr<HostStagedCommunicator>(
      new HostStagedCommunicator(host, stream, device));
}

HostStagedCommunicator::~HostStagedCommunicator() {
  if (send_.data != nullptr) cudaFreeHost(send_.data);
  if (recv_.data != nullptr) cudaFreeHost(recv_.data);
}

absl::Status HostStagedCommunicator::Reserve(Pinned& buffer, size_t bytes) {
  if (bytes <= buffer.bytes) return absl::OkStatus();
  // Grow geometrically so a sweep of sizes does not re-pin at every call.
  const size_t grown = std::max(bytes, 2 * buffer.bytes);
  if (buffer.data != nullptr) {
    DCP_CUDA_CHECK(cudaFreeHost(buffer.data));
    buffer = Pinned{};
  }
  DCP_CUDA_CHECK(cudaHostAlloc(&buffer.data, grown, cudaHostAllocDefault));
  buffer.bytes = grown;
  return absl::OkStatus();
}

absl::Status HostStagedCommunicator::ToHost(void* host, const void* device, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  DCP_CUDA_CHECK(cudaSetDevice(device_));
  DCP_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_));
  DCP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status HostStagedCommunicator::ToDevice(void* device, const void* host, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  DCP_CUDA_CHECK(cudaSetDevice(device_));
  DCP_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_));
  // The pinned buffer is reused by the next call: the copy must be done before we return.
  DCP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status HostStagedCommunicator::AllGather(const void* send, void* recv, size_t count,
                                               DType dtype) {
  const size_t bytes = count * dtype_size(dtype);
  const size_t total = bytes * size_t(world_size());
  DCP_RETURN_IF_ERROR(Reserve(send_, bytes));
  DCP_RETURN_IF_ERROR(Reserve(recv_, total));
  // A failed copy still joins the collective (with stale bytes), so that the peers' calls
  // keep pairing with this rank's; the error follows, and the step's agreement spreads it.
  const absl::Status staged = ToHost(send_.data, send, bytes);
  DCP_RETURN_IF_ERROR(host_.AllGather(send_.data, recv_.data, count, dtype));
  DCP_RETURN_IF_ERROR(staged);
  return ToDevice(recv, recv_.data, total);
}

absl::Status HostStagedCommunicator::AllGatherV(const void* send, size_t send_count, void* recv,
                                                absl::Span<const size_t> counts, DType dtype) {
  const size_t element = dtype_size(dtype);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0}) * element;
  DCP_RETURN_IF_ERROR(Reserve(send_, send_count * element));
  DCP_RETURN_IF_ERROR(Reserve(recv_, total));
  const absl::Status staged = ToHost(send_.data, send, send_count * element);
  DCP_RETURN_IF_ERROR(host_.AllGatherV(send_.data, send_count, recv_.data, counts, dtype));
  DCP_RETURN_IF_ERROR(staged);  // joined the collective anyway (AllGather says why)
  return ToDevice(recv, recv_.data, total);
}

absl::Status HostStagedCommunicator::ReduceScatterSum(const void* send, void* recv, size_t count,
                                                      DType dtype) {
  const size_t bytes = count * dtype_size(dtype);
  const size_t total = bytes * size_t(world_size());
  DCP_RETURN_IF_ERROR(Reserve(send_, total));
  DCP_RETURN_IF_ERROR(Reserve(recv_, bytes));
  const absl::Status staged = ToHost(send_.data, send, total);
  DCP_RETURN_IF_ERROR(host_.ReduceScatterSum(send_.data, recv_.data, count, dtype));
  DCP_RETURN_IF_ERROR(staged);  // joined the collective anyway (AllGather says why)
  return ToDevice(recv, recv_.data, bytes);
}

absl::Status HostStagedCommunicator::AllToAll(const void* send, void* recv, size_t count,
                                              DType dtype) {
  const size_t total = count * dtype_size(dtype) * size_t(world_size());
  DCP_RETURN_IF_ERROR(Reserve(send_, total));
  DCP_RETURN_IF_ERROR(Reserve(recv_, total));
  const absl::Status staged = ToHost(send_.data, send, total);
  DCP_RETURN_IF_ERROR(host_.AllToAll(send_.data, recv_.data, count, dtype));
  DCP_RETURN_IF_ERROR(staged);  // joined the collective anyway (AllGather says why)
  return ToDevice(recv, recv_.data, total);
}

absl::Status HostStagedCommunicator::AllToAllV(const void* send,
                                               absl::Span<const size_t> send_counts,
                                               absl::Span<const size_t> send_displs, void* recv,
                                               absl::Span<const size_t> recv_counts,
                                               absl::Span<const size_t> recv_displs,
                                               DType dtype) {
  const size_t world = size_t(world_size());
  DCP_RETURN_IF_ERROR(
      CheckAllToAllVArgs(world_size(), send_counts, send_displs, recv_counts, recv_displs));
  // The extent of each side: the furthest element any block touches.
  size_t send_extent = 0, recv_extent = 0;
  for (size_t r = 0; r < world; ++r) {
    if (send_counts[r] > 0) send_extent = std::max(send_extent, send_displs[r] + send_counts[r]);
    if (recv_counts[r] > 0) recv_extent = std::max(recv_extent, recv_displs[r] + recv_counts[r]);
  }
  const size_t element = dtype_size(dtype);
  DCP_RETURN_IF_ERROR(Reserve(send_, send_extent * element));
  DCP_RETURN_IF_ERROR(Reserve(recv_, recv_extent * element));
  absl::Status staged = ToHost(send_.data, send, send_extent * element);
  // Gaps between the received blocks keep the device's values: stage them too.
  if (staged.ok()) staged = ToHost(recv_.data, recv, recv_extent * element);
  DCP_RETURN_IF_ERROR(host_.AllToAllV(send_.data, send_counts, send_displs, recv_.data,
                                      recv_counts, recv_displs, dtype));
  DCP_RETURN_IF_ERROR(staged);  // joined the collective anyway (AllGather says why)
  return ToDevice(recv, recv_.data, recv_extent * element);
}

absl::Status HostStagedCommunicator::Broadcast(void* data, size_t bytes, int root) {
  DCP_CHECK_ARG(root >= 0 && root < world_size(), "Broadcast: root %d outside [0, %d)", root,
                world_size());
  DCP_RETURN_IF_ERROR(Reserve(send_, bytes));
  const absl::Status staged = rank() == root ? ToHost(send_.data, data, bytes) : absl::OkStatus();
  DCP_RETURN_IF_ERROR(host_.Broadcast(send_.data, bytes, root));
  if (rank() == root) return staged;  // joined the collective anyway (AllGather says why)
  return ToDevice(data, send_.data, bytes);
}

absl::Status HostStagedCommunicator::Barrier() {
  DCP_CUDA_CHECK(cudaSetDevice(device_));
  DCP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return host_.Barrier();
}

absl::Status HostStagedCommunicator::HostAllGather(int64_t value, absl::Span<int64_t> values) {
  return host_.HostAllGather(value, values);
}

absl::Status HostStagedCommunicator::HostBroadcast(void* data, size_t bytes, int root) {
  return host_.HostBroadcast(data, bytes, root);
}

absl::Status HostStagedCommunicator::BindStream(StreamHandle stream, Completion completion) {
  DCP_CHECK_ARG(completion == Completion::kHost || completion == Completion::kStream,
                "%s: unknown completion mode %d", name(), static_cast<int>(completion));
  auto* cuda_stream = static_cast<cudaStream_t>(stream);
  if (cuda_stream != nullptr) {
    int stream_device = -1;
    DCP_CUDA_CHECK(cudaStreamGetDevice(cuda_stream, &stream_device));
    DCP_CHECK_ARG(stream_device == device_,
                  "%s: the stream belongs to GPU %d, the communicator to GPU %d", name(),
                  stream_device, device_);
  }
  // Every call synchronizes its stream before returning: nothing of ours is queued on the old
  // stream, so there is nothing to order.
  stream_ = cuda_stream;
  return absl::OkStatus();
}

void HostStagedCommunicator::Abort(int exit_code) {
  host_.Abort(exit_code);
  std::_Exit(exit_code);  // not reached; Abort is [[noreturn]]
}

}  // namespace dcp
