// Communicator for device buffers over a host (MPI) communicator, staging every transfer
// through pinned host memory: device -> pinned send buffer, the host collective, pinned recv
// buffer -> device. This is the data plane when ranks share a GPU (NCCL refuses two ranks on
// one device), e.g. W ranks on the single-H200 machine. Slower than NCCL by two PCIe copies
// per call; correct for any placement.
// Copies run on `stream` (null: the legacy default stream, ordered with CudaDevice's blocking
// stream) and are synchronized before the host collective, so a call returns with its device
// results written. Errors and timeouts are the host communicator's (it polls a deadline). A
// device-to-host copy that fails still joins the host collective (with stale bytes) and then
// returns its error, so the peers' calls keep pairing with this rank's (the step's status
// agreement spreads the error); a pinned buffer that cannot be grown fails before the call.
// Stream order: BindStream moves the copies to another stream of this GPU, but every call still
// completes on the host (completion() stays kHost, also when kStream is asked for), which is
// correct in stream order too; such calls cannot be captured into a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"

namespace dcp {

class HostStagedCommunicator final : public Communicator {
 public:
  // `host` must be a host-memory communicator (MpiCommunicator) that outlives this one.
  static absl::StatusOr<std::unique_ptr<HostStagedCommunicator>> Create(
      Communicator& host, cudaStream_t stream = nullptr);
  ~HostStagedCommunicator() override;

  int rank() const override { return host_.rank(); }
  int world_size() const override { return host_.world_size(); }
  MemorySpace memory_space() const override { return MemorySpace::kDevice; }
  std::string name() const override { return host_.name() + "+host_staging"; }
  uint64_t max_count() const override { return host_.max_count(); }

  absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype) override;
  absl::Status AllGatherV(const void* send, size_t send_count, void* recv,
                          absl::Span<const size_t> counts, DType dtype) override;
  absl::Status ReduceScatterSum(const void* send, void* recv, size_t count,
                                DType dtype) override;
  absl::Status AllToAll(const void* send, void* recv, size_t count, DType dtype) override;
  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                         absl::Span<const size_t> send_displs, void* recv,
                         absl::Span<const size_t> recv_counts,
                         absl::Span<const size_t> recv_displs, DType dtype) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Barrier() override;
  absl::Status HostAllGather(int64_t value, absl::Span<int64_t> values) override;
  absl::Status HostBroadcast(void* data, size_t bytes, int root) override;
  [[noreturn]] void Abort(int exit_code) override;
  absl::Status BindStream(StreamHandle stream, Completion completion) override;

 private:
  // A pinned host buffer that grows on demand.
  struct Pinned {
    void* data = nullptr;
    size_t bytes = 0;
  };
  HostStagedCommunicator(Communicator& host, cudaStream_t stream, int device)
      : host_(host), stream_(stream), device_(device) {}
  absl::Status Reserve(Pinned& buffer, size_t bytes);
  absl::Status ToHost(void* host, const void* device, size_t bytes);
  absl::Status ToDevice(void* device, const void* host, size_t bytes);

  Communicator& host_;
  cudaStream_t stream_;
  int device_;
  Pinned send_, recv_;
};

}  // namespace dcp
