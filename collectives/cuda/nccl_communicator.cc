#include "collectives/cuda/nccl_communicator.h"

#include <chrono>
#include <thread>
#include <vector>

#include "core/cuda/convert.h"
#include "collectives/cuda/nccl_status.h"
#include "core/cuda/cuda_status.h"
#include "core/status.h"

namespace dcp {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kI32: return ncclInt32;
  }
  return ncclFloat32;
}

Clock::time_point DeadlineAfter(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(seconds));
}

// Within a group every call is still made (the group must end); the first real error wins.
void KeepFirstError(ncclResult_t code, ncclResult_t* first) {
  if (*first == ncclSuccess || *first == ncclInProgress) *first = code;
}

// Spin (yielding) for the first 2 ms, the whole life of a decode-sized collective, so that
// completion is seen within a microsecond or so; then sleep in growing steps so a rank waiting
// on a slow peer does not burn a core for the whole timeout.
void Backoff(Clock::time_point started) {
  const auto waited = Clock::now() - started;
  if (waited < std::chrono::milliseconds(2)) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(
        waited < std::chrono::milliseconds(100) ? 20 : 200));
  }
}

// Polls a non-blocking communicator until its pending operation (init, enqueue) has left
// ncclInProgress. Returns the final async state (ncclSuccess or the error) or
// DeadlineExceeded.
absl::Status WaitNotInProgress(ncclComm_t comm, Clock::time_point deadline, const char* what,
                               double timeout_s) {
  const auto started = Clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    DCP_NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclCodeToStatus(state, what, __FILE__, __LINE__);
    if (Clock::now() > deadline) {
      return DCP_ERROR(DeadlineExceeded,
                       "%s did not complete within %.1f s: a peer rank failed or never joined",
                       what, timeout_s);
    }
    Backoff(started);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(MpiCommunicator& mpi,
                                                                            double timeout_s,
                                                                            cudaStream_t stream) {
  DCP_CHECK_ARG(timeout_s > 0, "NcclCommunicator: timeout must be positive, got %g", timeout_s);
  int device = -1;
  DCP_CUDA_CHECK(cudaGetDevice(&device));
  ncclUniqueId id{};
  absl::Status local = absl::OkStatus();
  if (mpi.rank() == 0) local = NcclCodeToStatus(ncclGetUniqueId(&id), "ncclGetUniqueId", __FILE__,
                                                __LINE__);
  DCP_RETURN_IF_ERROR(AgreeOnStatus(mpi, local));
  DCP_RETURN_IF_ERROR(mpi.HostBroadcast(&id, sizeof(id), 0));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init and every call return at once; we poll with a deadline
  ncclComm_t comm = nullptr;
  const ncclResult_t started =
      ncclCommInitRankConfig(&comm, mpi.world_size(), id, mpi.rank(), &config);
  if (started != ncclSuccess && started != ncclInProgress) {
    local = NcclCodeToStatus(started, "ncclCommInitRankConfig", __FILE__, __LINE__);
  } else {
    local = WaitNotInProgress(comm, DeadlineAfter(timeout_s), "ncclCommInitRankConfig",
                              timeout_s);
  }
  cudaEvent_t event = nullptr;
  if (local.ok()) {
    local = CudaCodeToStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                             "cudaEventCreateWithFlags", __FILE__, __LINE__);
  }
  // Every rank learns whether every rank got a communicator; on failure none keeps one.
  const absl::Status agreed = AgreeOnStatus(mpi, local);
  if (!agreed.ok()) {
    if (comm != nullptr) ncclCommAbort(comm);
    if (event != nullptr) cudaEventDestroy(event);
    return agreed;
  }
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(mpi, comm, stream, event, device, timeout_s));
}

NcclCommunicator::NcclCommunicator(MpiCommunicator& mpi, ncclComm_t comm, cudaStream_t stream,
                                   cudaEvent_t event, int device, double timeout_s)
    : mpi_(mpi),
      comm_(comm),
      stream_(stream),
      event_(event),
      device_(device),
      rank_(mpi.rank()),
      world_size_(mpi.world_size()),
      timeout_s_(timeout_s) {}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(device_);
  if (comm_ != nullptr) {
    if (broken_) {
      ncclCommAbort(comm_);
    } else {
      cudaStreamSynchronize(stream_);
      // Destroy of a non-blocking communicator may report ncclInProgress; wait briefly, then
      // abort rather than hang in a destructor.
      const ncclResult_t code = ncclCommDestroy(comm_);
      if (code != ncclSuccess && code != ncclInProgress) ncclCommAbort(comm_);
    }
  }
  if (scratch_ != nullptr) cudaFree(scratch_);
  if (event_ != nullptr) cudaEventDestroy(event_);
}

absl::Status NcclCommunicator::CheckUsable(const char* what) const {
  if (broken_) {
    return DCP_ERROR(FailedPrecondition, "%s on a broken NCCL communicator (%s)", what,
                     broken_reason_);
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Fail(absl::Status status, const char* reason) {
  broken_ = true;
  broken_reason_ = reason;
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);  // kernels stuck waiting for peers exit; the stream drains
    comm_ = nullptr;
  }
  return status;
}

absl::Status NcclCommunicator::Complete(ncclResult_t enqueued, const char* what) {
  if (enqueued != ncclSuccess && enqueued != ncclInProgress) {
    return Fail(NcclCodeToStatus(enqueued, what, __FILE__, __LINE__), what);
  }
  const auto deadline = DeadlineAfter(timeout_s_);
  if (absl::Status queued = WaitNotInProgress(comm_, deadline, what, timeout_s_); !queued.ok()) {
    return Fail(queued, what);
  }
  if (absl::Status recorded = CudaCodeToStatus(cudaEventRecord(event_, stream_),
                                               "cudaEventRecord", __FILE__, __LINE__);
      !recorded.ok()) {
    return Fail(recorded, what);
  }
  const auto started = Clock::now();
  for (int polls = 0;; ++polls) {
    const cudaError_t done = cudaEventQuery(event_);
    if (done == cudaSuccess) return absl::OkStatus();
    if (done != cudaErrorNotReady) {
      return Fail(CudaCodeToStatus(done, what, __FILE__, __LINE__), what);
    }
    if (polls % 32 != 31) {  // the event is cheap to poll; NCCL's async state less so
      Backoff(started);
      continue;
    }
    ncclResult_t state = ncclSuccess;
    const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
    if (queried != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      return Fail(NcclCodeToStatus(queried != ncclSuccess ? queried : state, what, __FILE__,
                                   __LINE__),
                  what);
    }
    if (Clock::now() > deadline) {
      return Fail(DCP_ERROR(DeadlineExceeded,
                            "%s did not complete within %.1f s: a peer rank failed or never "
                            "joined; NCCL communicator aborted",
                            what, timeout_s_),
                  "timed out");
    }
    Backoff(started);
  }
}

absl::Status NcclCommunicator::EnsureScratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return absl::OkStatus();
  if (scratch_ != nullptr) {
    DCP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    DCP_CUDA_CHECK(cudaFree(scratch_));
    scratch_ = nullptr;
    scratch_bytes_ = 0;
  }
  DCP_CUDA_CHECK(cudaMalloc(&scratch_, bytes));
  scratch_bytes_ = bytes;
  return absl::OkStatus();
}

absl::Status NcclCommunicator::AllGather(const void* send, void* recv, size_t count,
                                         DType dtype) {
  DCP_RETURN_IF_ERROR(CheckUsable("AllGather"));
  if (count == 0) return absl::OkStatus();
  DCP_CUDA_CHECK(cudaSetDevice(device_));
  return Complete(ncclAllGather(send, recv, count, NcclType(dtype), comm_, stream_),
                  "ncclAllGather");
}

absl::Status NcclCommunicator::AllGatherV(const void* send, size_t send_count, void* recv,
                                          absl::Span<const size_t> counts, DType dtype) {
  DCP_RETURN_IF_ERROR(CheckUsable("AllGatherV"));
  DCP_CHECK_ARG(counts.size() == size_t(world_size_), "AllGatherV: counts has %d entries, not %d",
                counts.size(), world_size_);
  DCP_CHECK_ARG(counts[rank_] == send_count, "AllGatherV: send_count %d != counts[%d] = %d",
                send_count, rank_, counts[rank_]);
  DCP_CUDA_CHECK(cudaSetDevice(device_));
  const size_t element = dtype_size(dtype);
  std::vector<size_t> displs(world_size_);
  size_t offset = 0;
  for (int r = 0; r < world_size_; ++r) {
    displs[r] = offset;
    offset += counts[r];
  }
  auto* out = static_cast<char*>(recv);
  if (send_count > 0) {
    DCP_CUDA_CHECK(cudaMemcpyAsync(out + displs[rank_] * element, send, send_count * element,
                                   cudaMemcpyDeviceToDevice, stream_));
  }
  if (world_size_ == 1) return Complete(ncclSuccess, "AllGatherV");
  DCP_NCCL_CHECK(ncclGroupStart());
  ncclResult_t first = ncclSuccess;
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    if (send_count > 0) {
      KeepFirstError(ncclSend(send, send_count, NcclType(dtype), r, comm_, stream_), &first);
    }
    if (counts[r] > 0) {
      KeepFirstError(
          ncclRecv(out + displs[r] * element, counts[r], NcclType(dtype), r, comm_, stream_),
          &first);
    }
  }
  KeepFirstError(ncclGroupEnd(), &first);
  return Complete(first, "ncclSend/ncclRecv group (AllGatherV)");
}

absl::Status NcclCommunicator::ReduceScatterSum(const void* send, void* recv, size_t count,
                                                DType dtype) {
  DCP_RETURN_IF_ERROR(CheckUsable("ReduceScatterSum"));
  if (count == 0) return absl::OkStatus();
  DCP_CUDA_CHECK(cudaSetDevice(device_));
  if (dtype != DType::kBF16) {
    return Complete(ncclReduceScatter(send, recv, count, NcclType(dtype), ncclSum, comm_, stream_),
                    "ncclReduceScatter");
  }
  // bf16: sum in fp32, round once (NCCL's own bf16 sum rounds at every hop).
  const size_t total = count * size_t(world_size_);
  DCP_RETURN_IF_ERROR(EnsureScratch((total + count) * sizeof(float)));
  float* send_f32 = static_cast<float*>(scratch_);
  float* recv_f32 = send_f32 + total;
  DCP_RETURN_IF_ERROR(cuda::Convert(send_f32, DType::kF32, send, DType::kBF16, total, stream_));
  DCP_RETURN_IF_ERROR(Complete(
      ncclReduceScatter(send_f32, recv_f32, count, ncclFloat32, ncclSum, comm_, stream_),
      "ncclReduceScatter(bf16 as fp32)"));
  DCP_RETURN_IF_ERROR(cuda::Convert(recv, DType::kBF16, recv_f32, DType::kF32, count, stream_));
  return Complete(ncclSuccess, "ReduceScatterSum(bf16 rounding)");
}

absl::Status NcclCommunicator::AllToAll(const void* send, void* recv, size_t count, DType dtype) {
  DCP_RETURN_IF_ERROR(CheckUsable("AllToAll"));
  if (count == 0) return absl::OkStatus();
  std::vector<size_t> counts(world_size_, count), displs(world_size_);
  for (int r = 0; r < world_size_; ++r) displs[r] = size_t(r) * count;
  return AllToAllV(send, counts, displs, recv, counts, displs, dtype);
}

absl::Status NcclCommunicator::AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                                         absl::Span<const size_t> send_displs, void* recv,
                                         absl::Span<const size_t> recv_counts,
                                         absl::Span<const size_t> recv_displs, DType dtype) {
  DCP_RETURN_IF_ERROR(CheckUsable("AllToAllV"));
  const size_t world = size_t(world_size_);
  DCP_CHECK_ARG(send_counts.size() == world && send_displs.size() == world &&
                    recv_counts.size() == world && recv_displs.size() == world,
                "AllToAllV: counts and displacements must have %d entries", world_size_);
  DCP_CHECK_ARG(send_counts[rank_] == recv_counts[rank_],
                "AllToAllV: own block sizes differ (send %d, recv %d)", send_counts[rank_],
                recv_counts[rank_]);
  DCP_CUDA_CHECK(cudaSetDevice(device_));
  const size_t element = dtype_size(dtype);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  if (send_counts[rank_] > 0) {
    DCP_CUDA_CHECK(cudaMemcpyAsync(out + recv_displs[rank_] * element,
                                   in + send_displs[rank_] * element,
                                   send_counts[rank_] * element, cudaMemcpyDeviceToDevice,
                                   stream_));
  }
  if (world_size_ == 1) return Complete(ncclSuccess, "AllToAllV");
  DCP_NCCL_CHECK(ncclGroupStart());
  ncclResult_t first = ncclSuccess;
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    if (send_counts[r] > 0) {
      KeepFirstError(ncclSend(in + send_displs[r] * element, send_counts[r], NcclType(dtype), r,
                              comm_, stream_),
                     &first);
    }
    if (recv_counts[r] > 0) {
      KeepFirstError(ncclRecv(out + recv_displs[r] * element, recv_counts[r], NcclType(dtype), r,
                              comm_, stream_),
                     &first);
    }
  }
  KeepFirstError(ncclGroupEnd(), &first);
  return Complete(first, "ncclSend/ncclRecv group (AllToAllV)");
}

absl::Status NcclCommunicator::Broadcast(void* data, size_t bytes, int root) {
  DCP_RETURN_IF_ERROR(CheckUsable("Broadcast"));
  DCP_CHECK_ARG(root >= 0 && root < world_size_, "Broadcast: root %d outside [0, %d)", root,
                world_size_);
  if (bytes == 0) return absl::OkStatus();
  DCP_CUDA_CHECK(cudaSetDevice(device_));
  return Complete(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_),
                  "ncclBroadcast");
}

absl::Status NcclCommunicator::Barrier() {
  DCP_RETURN_IF_ERROR(CheckUsable("Barrier"));
  DCP_CUDA_CHECK(cudaSetDevice(device_));
  DCP_RETURN_IF_ERROR(EnsureScratch(sizeof(float)));
  return Complete(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_),
                  "ncclAllReduce(barrier)");
}

absl::Status NcclCommunicator::HostAllGather(int64_t value, absl::Span<int64_t> values) {
  DCP_RETURN_IF_ERROR(CheckUsable("HostAllGather"));
  return mpi_.HostAllGather(value, values);
}

absl::Status NcclCommunicator::HostBroadcast(void* data, size_t bytes, int root) {
  DCP_RETURN_IF_ERROR(CheckUsable("HostBroadcast"));
  return mpi_.HostBroadcast(data, bytes, root);
}

void NcclCommunicator::Abort(int exit_code) {
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
  mpi_.Abort(exit_code);
}

}  // namespace dcp
