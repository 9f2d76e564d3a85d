#include "collectives/local_communicator.h"

#include <cstdlib>
#include <cstring>

#include "core/status.h"

namespace dcp {
namespace {
void Copy(const void* send, void* recv, size_t count, DType dtype) {
  if (count > 0 && send != recv) std::memmove(recv, send, count * dtype_size(dtype));
}
}  // namespace

absl::Status LocalCommunicator::AllGather(const void* send, void* recv, size_t count,
                                          DType dtype) {
  Copy(send, recv, count, dtype);
  return absl::OkStatus();
}

absl::Status LocalCommunicator::AllGatherV(const void* send, size_t send_count, void* recv,
                                           absl::Span<const size_t> counts, DType dtype) {
  DCP_CHECK_ARG(counts.size() == 1 && counts[0] == send_count,
                "AllGatherV: counts must be [send_count] on a group of one");
  Copy(send, recv, send_count, dtype);
  return absl::OkStatus();
}

absl::Status LocalCommunicator::ReduceScatterSum(const void* send, void* recv, size_t count,
                                                 DType dtype) {
  Copy(send, recv, count, dtype);
  return absl::OkStatus();
}

absl::Status LocalCommunicator::AllToAll(const void* send, void* recv, size_t count,
                                         DType dtype) {
  Copy(send, recv, count, dtype);
  return absl::OkStatus();
}

absl::Status LocalCommunicator::AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                                          absl::Span<const size_t> send_displs, void* recv,
                                          absl::Span<const size_t> recv_counts,
                                          absl::Span<const size_t> recv_displs, DType dtype) {
  DCP_CHECK_ARG(send_counts.size() == 1 && recv_counts.size() == 1 && send_displs.size() == 1 &&
                    recv_displs.size() == 1 && send_counts[0] == recv_counts[0],
                "AllToAllV: counts and displacements must be [1] and agree on a group of one");
  const size_t size = dtype_size(dtype);
  Copy(static_cast<const std::byte*>(send) + send_displs[0] * size,
       static_cast<std::byte*>(recv) + recv_displs[0] * size, send_counts[0], dtype);
  return absl::OkStatus();
}

absl::Status LocalCommunicator::Broadcast(void*, size_t, int root) {
  DCP_CHECK_ARG(root == 0, "Broadcast: root %d outside a group of one", root);
  return absl::OkStatus();
}

absl::Status LocalCommunicator::HostAllGather(int64_t value, absl::Span<int64_t> values) {
  DCP_CHECK_ARG(values.size() == 1, "HostAllGather: values must hold 1 element");
  values[0] = value;
  return absl::OkStatus();
}

absl::Status LocalCommunicator::HostBroadcast(void*, size_t, int root) {
  DCP_CHECK_ARG(root == 0, "HostBroadcast: root %d outside a group of one", root);
  return absl::OkStatus();
}

void LocalCommunicator::Abort(int exit_code) { std::exit(exit_code); }

}  // namespace dcp
