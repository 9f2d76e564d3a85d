// Communicator over NCCL for device buffers (one GPU per rank), bootstrapped through MPI.
//
// - Create: rank 0 makes the NCCL unique id, the MPI communicator broadcasts it, every rank
//   joins a *non-blocking* NCCL communicator (config.blocking = 0) whose initialization is
//   polled against the timeout; the ranks then agree on the outcome over MPI.
// - Data plane on device buffers, enqueued on `stream` (null: the legacy default stream, which
//   is ordered with CudaDevice's blocking stream both ways). AllToAll(V) and AllGatherV are
//   ncclSend/ncclRecv groups (a rank's own block is a device copy). BF16 ReduceScatterSum is
//   done in fp32 (converted into a scratch buffer, reduced, rounded once), as the interface
//   promises.
// - Every call waits for its completion: an event on the stream is polled together with
//   ncclCommGetAsyncError; an NCCL error or the deadline turns into a Status, the communicator
//   is aborted (ncclCommAbort) and marked broken, and later calls fail at once.
// - Control plane (Host*) and Abort go to the MPI communicator, which must outlive this one.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "collectives/mpi_communicator.h"

namespace dcp {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over the ranks of `mpi`; the current CUDA device (cudaSetDevice) is this rank's
  // GPU, which no other rank of the group may use.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(MpiCommunicator& mpi,
                                                                  double timeout_s,
                                                                  cudaStream_t stream = nullptr);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  MemorySpace memory_space() const override { return MemorySpace::kDevice; }
  std::string name() const override { return "nccl"; }

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

 private:
  NcclCommunicator(MpiCommunicator& mpi, ncclComm_t comm, cudaStream_t stream, cudaEvent_t event,
                   int device, double timeout_s);
  absl::Status CheckUsable(const char* what) const;
  // `enqueued` is the return code of the NCCL call (or group end) that queued the work; waits
  // until the queued work has run. On error or timeout: abort, mark broken, return the error.
  absl::Status Complete(ncclResult_t enqueued, const char* what);
  absl::Status Fail(absl::Status status, const char* reason);
  absl::Status EnsureScratch(size_t bytes);

  MpiCommunicator& mpi_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  cudaEvent_t event_;
  int device_;
  int rank_;
  int world_size_;
  double timeout_s_;
  bool broken_ = false;
  std::string broken_reason_;
  void* scratch_ = nullptr;  // device memory: fp32 staging of bf16 sums, the barrier's word
  size_t scratch_bytes_ = 0;
};

}  // namespace dcp
