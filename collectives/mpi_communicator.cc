#include "collectives/mpi_communicator.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "collectives/mpi_status.h"
#include "core/status.h"

namespace dcp {
namespace {

MPI_Datatype MpiType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kBF16: return MPI_UINT16_T;
    case DType::kI32: return MPI_INT32_T;
  }
  return MPI_DATATYPE_NULL;
}

// MPI counts are int: a larger request is an error, never a silent truncation.
absl::Status ToInt(size_t value, const char* what, int* out) {
  if (value > static_cast<size_t>(INT_MAX)) {
    return DCP_ERROR(InvalidArgument, "%s: %d elements exceed MPI's int count limit", what,
                     value);
  }
  *out = static_cast<int>(value);
  return absl::OkStatus();
}

absl::Status ToInts(absl::Span<const size_t> values, const char* what, std::vector<int>* out) {
  out->resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) DCP_RETURN_IF_ERROR(ToInt(values[i], what, &(*out)[i]));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create(MPI_Comm comm,
                                                                          double timeout_s) {
  int initialized = 0;
  DCP_MPI_CHECK(MPI_Initialized(&initialized));
  DCP_CHECK_ARG(initialized, "MpiCommunicator: MPI is not initialized");
  DCP_CHECK_ARG(timeout_s > 0, "MpiCommunicator: timeout must be positive, got %g", timeout_s);
  MPI_Comm dup;
  DCP_MPI_CHECK(MPI_Comm_dup(comm, &dup));
  DCP_MPI_CHECK(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN));
  int rank = 0, world = 0;
  DCP_MPI_CHECK(MPI_Comm_rank(dup, &rank));
  DCP_MPI_CHECK(MPI_Comm_size(dup, &world));
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(dup, rank, world, timeout_s));
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, int rank, int world_size, double timeout_s)
    : comm_(comm), rank_(rank), world_size_(world_size), timeout_s_(timeout_s) {}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // Requests that timed out complete if the late peers arrive; give them a moment, and leave a
  // communicator with requests still in flight alone (freeing it could block).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  bool all_done = true;
  for (MPI_Request& request : abandoned_) {
    int done = 0;
    while (MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    all_done = all_done && done;
  }
  if (all_done) MPI_Comm_free(&comm_);
}

absl::Status MpiCommunicator::CheckUsable(const char* what) const {
  if (broken_) {
    // Unavailable, not FailedPrecondition: the group failed, the caller's input did not.
    return DCP_ERROR(Unavailable, "%s on a broken MPI communicator (%s)", what, broken_reason_);
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Wait(MPI_Request* request, const char* what) {
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  const auto deadline = started + std::chrono::duration<double>(timeout_s_);
  int done = 0;
  for (;;) {
    const int code = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (code != MPI_SUCCESS) {
      broken_ = true;
      broken_reason_ = std::string(what) + " failed";
      return MpiCodeToStatus(code, what, __FILE__, __LINE__);
    }
    if (done) return absl::OkStatus();
    if (Clock::now() > deadline) {
      broken_ = true;
      broken_reason_ = std::string(what) + " timed out";
      abandoned_.push_back(*request);
      return DCP_ERROR(DeadlineExceeded,
                       "%s did not complete within %.1f s: a peer rank failed or never joined",
                       what, timeout_s_);
    }
    // Spin (yielding, so an oversubscribed core still serves the other ranks) for the first
    // 2 ms, the life of a small collective; then sleep in growing steps.
    const auto waited = Clock::now() - started;
    if (waited < std::chrono::milliseconds(2)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(
          std::chrono::microseconds(waited < std::chrono::milliseconds(100) ? 20 : 200));
    }
  }
}

absl::Status MpiCommunicator::AllGather(const void* send, void* recv, size_t count,
                                        DType dtype) {
  DCP_RETURN_IF_ERROR(CheckUsable("AllGather"));
  int n = 0;
  DCP_RETURN_IF_ERROR(ToInt(count, "AllGather", &n));
  MPI_Request request;
  DCP_MPI_CHECK(MPI_Iallgather(send, n, MpiType(dtype), recv, n, MpiType(dtype), comm_, &request));
  return Wait(&request, "MPI_Iallgather");
}

absl::Status MpiCommunicator::AllGatherV(const void* send, size_t send_count, void* recv,
                                         absl::Span<const size_t> counts, DType dtype) {
  DCP_RETURN_IF_ERROR(CheckUsable("AllGatherV"));
  DCP_CHECK_ARG(counts.size() == size_t(world_size_), "AllGatherV: counts has %d entries, not %d",
                counts.size(), world_size_);
  DCP_CHECK_ARG(counts[rank_] == send_count, "AllGatherV: send_count %d != counts[%d] = %d",
                send_count, rank_, counts[rank_]);
  std::vector<int> recv_counts, displs(world_size_);
  DCP_RETURN_IF_ERROR(ToInts(counts, "AllGatherV", &recv_counts));
  size_t offset = 0;
  for (int r = 0; r < world_size_; ++r) {
    DCP_RETURN_IF_ERROR(ToInt(offset, "AllGatherV displacement", &displs[r]));
    offset += counts[r];
  }
  MPI_Request request;
  DCP_MPI_CHECK(MPI_Iallgatherv(send, recv_counts[rank_], MpiType(dtype), recv,
                                recv_counts.data(), displs.data(), MpiType(dtype), comm_,
                                &request));
  return Wait(&request, "MPI_Iallgatherv");
}

// An all-to-all followed by a local sum, not MPI_Ireduce_scatter_block: the same bytes move,
// Open MPI's all-to-all is 3-5x faster than its reduce-scatter on shared memory at 1-64 MiB
// (dcp_bench collectives), and the sum is done in fp32 in rank order and rounded once, as the
// interface promises for BF16 (a pairwise MPI op would round at every step).
absl::Status MpiCommunicator::ReduceScatterSum(const void* send, void* recv, size_t count,
                                               DType dtype) {
  DCP_RETURN_IF_ERROR(CheckUsable("ReduceScatterSum"));
  if (count == 0) return absl::OkStatus();
  int n = 0;  // refused before the staging buffer of world x count is allocated
  DCP_RETURN_IF_ERROR(ToInt(count, "ReduceScatterSum", &n));
  std::vector<std::byte> gathered(count * world_size_ * dtype_size(dtype));
  DCP_RETURN_IF_ERROR(AllToAll(send, gathered.data(), count, dtype));
  // Summed block by block in rank order (contiguous, vectorizable inner loops).
  const size_t world = size_t(world_size_);
  switch (dtype) {
    case DType::kF32: {
      const auto* in = reinterpret_cast<const float*>(gathered.data());
      auto* out = static_cast<float*>(recv);
      std::copy_n(in, count, out);
      for (size_t q = 1; q < world; ++q) {
        for (size_t i = 0; i < count; ++i) out[i] += in[q * count + i];
      }
      break;
    }
    case DType::kBF16: {
      const auto* in = reinterpret_cast<const bf16*>(gathered.data());
      std::vector<float> sum(count, 0.0f);
      for (size_t q = 0; q < world; ++q) {
        for (size_t i = 0; i < count; ++i) sum[i] += bf16_to_float(in[q * count + i]);
      }
      auto* out = static_cast<bf16*>(recv);
      for (size_t i = 0; i < count; ++i) out[i] = float_to_bf16(sum[i]);
      break;
    }
    case DType::kI32: {
      const auto* in = reinterpret_cast<const int32_t*>(gathered.data());
      auto* out = static_cast<int32_t*>(recv);
      std::copy_n(in, count, out);
      for (size_t q = 1; q < world; ++q) {
        for (size_t i = 0; i < count; ++i) out[i] += in[q * count + i];
      }
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::AllToAll(const void* send, void* recv, size_t count,
                                       DType dtype) {
  DCP_RETURN_IF_ERROR(CheckUsable("AllToAll"));
  int n = 0;
  DCP_RETURN_IF_ERROR(ToInt(count, "AllToAll", &n));
  MPI_Request request;
  DCP_MPI_CHECK(MPI_Ialltoall(send, n, MpiType(dtype), recv, n, MpiType(dtype), comm_, &request));
  return Wait(&request, "MPI_Ialltoall");
}

absl::Status MpiCommunicator::AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                                        absl::Span<const size_t> send_displs, void* recv,
                                        absl::Span<const size_t> recv_counts,
                                        absl::Span<const size_t> recv_displs, DType dtype) {
  DCP_RETURN_IF_ERROR(CheckUsable("AllToAllV"));
  DCP_RETURN_IF_ERROR(
      CheckAllToAllVArgs(world_size_, send_counts, send_displs, recv_counts, recv_displs));
  std::vector<int> sc, sd, rc, rd;
  DCP_RETURN_IF_ERROR(ToInts(send_counts, "AllToAllV", &sc));
  DCP_RETURN_IF_ERROR(ToInts(send_displs, "AllToAllV", &sd));
  DCP_RETURN_IF_ERROR(ToInts(recv_counts, "AllToAllV", &rc));
  DCP_RETURN_IF_ERROR(ToInts(recv_displs, "AllToAllV", &rd));
  MPI_Request request;
  DCP_MPI_CHECK(MPI_Ialltoallv(send, sc.data(), sd.data(), MpiType(dtype), recv, rc.data(),
                               rd.data(), MpiType(dtype), comm_, &request));
  return Wait(&request, "MPI_Ialltoallv");
}

absl::Status MpiCommunicator::Broadcast(void* data, size_t bytes, int root) {
  return HostBroadcast(data, bytes, root);
}

absl::Status MpiCommunicator::Barrier() {
  DCP_RETURN_IF_ERROR(CheckUsable("Barrier"));
  MPI_Request request;
  DCP_MPI_CHECK(MPI_Ibarrier(comm_, &request));
  return Wait(&request, "MPI_Ibarrier");
}

absl::Status MpiCommunicator::HostAllGather(int64_t value, absl::Span<int64_t> values) {
  DCP_RETURN_IF_ERROR(CheckUsable("HostAllGather"));
  DCP_CHECK_ARG(values.size() == size_t(world_size_), "HostAllGather: values must hold %d",
                world_size_);
  MPI_Request request;
  DCP_MPI_CHECK(MPI_Iallgather(&value, 1, MPI_INT64_T, values.data(), 1, MPI_INT64_T, comm_,
                               &request));
  return Wait(&request, "MPI_Iallgather(control)");
}

absl::Status MpiCommunicator::HostBroadcast(void* data, size_t bytes, int root) {
  DCP_RETURN_IF_ERROR(CheckUsable("Broadcast"));
  DCP_CHECK_ARG(root >= 0 && root < world_size_, "Broadcast: root %d outside [0, %d)", root,
                world_size_);
  int n = 0;
  DCP_RETURN_IF_ERROR(ToInt(bytes, "Broadcast", &n));
  MPI_Request request;
  DCP_MPI_CHECK(MPI_Ibcast(data, n, MPI_BYTE, root, comm_, &request));
  return Wait(&request, "MPI_Ibcast");
}

void MpiCommunicator::Abort(int exit_code) {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

}  // namespace dcp
