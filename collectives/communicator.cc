#include "collectives/communicator.h"

#include <string>
#include <vector>

#include "core/status.h"

namespace dcp {

absl::Status Communicator::BindStream(StreamHandle stream, Completion completion) {
  DCP_CHECK_ARG(completion == Completion::kHost || completion == Completion::kStream,
                "%s: unknown completion mode %d", name(), static_cast<int>(completion));
  DCP_CHECK_ARG(stream == nullptr,
                "%s: communicator on host memory cannot run on a CUDA stream (pass null)", name());
  return absl::OkStatus();
}

absl::Status Communicator::WatchStream(const char*) { return absl::OkStatus(); }

absl::Status Communicator::ReserveReduceScatter(size_t, DType) { return absl::OkStatus(); }

absl::Status AgreeOnStatus(Communicator& comm, const absl::Status& local) {
  const int world = comm.world_size();
  if (world == 1) return local;  // nobody to agree with: no host collective (tens of us on NCCL)
  std::vector<int64_t> codes(world);
  DCP_RETURN_IF_ERROR(comm.HostAllGather(static_cast<int64_t>(local.code()), absl::MakeSpan(codes)));
  int first_failed = -1;
  for (int r = 0; r < world; ++r) {
    if (codes[r] != static_cast<int64_t>(absl::StatusCode::kOk)) {
      first_failed = r;
      break;
    }
  }
  if (first_failed < 0) return absl::OkStatus();

  std::string message = first_failed == comm.rank() ? std::string(local.message()) : "";
  int64_t length = static_cast<int64_t>(message.size());
  DCP_RETURN_IF_ERROR(comm.HostBroadcast(&length, sizeof(length), first_failed));
  message.resize(static_cast<size_t>(length));
  DCP_RETURN_IF_ERROR(comm.HostBroadcast(message.data(), message.size(), first_failed));
  return absl::Status(static_cast<absl::StatusCode>(codes[first_failed]), message);
}

absl::Status CheckAllToAllVArgs(int world_size, absl::Span<const size_t> send_counts,
                                absl::Span<const size_t> send_displs,
                                absl::Span<const size_t> recv_counts,
                                absl::Span<const size_t> recv_displs) {
  const size_t world = static_cast<size_t>(world_size);
  DCP_CHECK_ARG(send_counts.size() == world && send_displs.size() == world &&
                    recv_counts.size() == world && recv_displs.size() == world,
                "AllToAllV: counts and displacements must have %d entries", world_size);
  return absl::OkStatus();
}

}  // namespace dcp
