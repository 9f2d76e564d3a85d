// The collectives a DCP group needs, behind one interface with an MPI backend (host buffers,
// Open MPI over UCX or its other transports), a world-of-one backend (a rank's own reference),
// and an NCCL backend (device buffers) on CUDA builds.
//
// Two planes:
//  - data plane (AllGather ... Broadcast): buffers live in memory_space(); element counts are
//    per rank; every rank passes the same counts and dtype unless the call says otherwise.
//  - control plane (Host*): small host-memory exchanges (plans, error agreement), always on
//    host buffers whatever the data plane.
// Every call returns a Status. A call that fails, or does not complete within the configured
// timeout, returns an error (DeadlineExceeded for a timeout) and marks the communicator broken:
// later calls fail at once. The caller then returns the error; a launcher calls Abort() so no
// rank hangs in a collective its peers will never join. A timed-out operation cannot be
// cancelled: if the late peers do arrive, it still completes into its buffers, at the latest
// while the communicator is destroyed, so those buffers must outlive the communicator (or the
// process must abort). Collectives know nothing of attention.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace dcp {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual MemorySpace memory_space() const = 0;
  virtual std::string name() const = 0;  // "mpi", "local", "nccl", ...

  // send: [count]; recv: [W, count], rank-major.
  virtual absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype) = 0;
  // send: [send_count] (== counts[rank]); recv: the ranks' parts concatenated rank-major,
  // sum(counts) elements. counts: [W] on the host, identical on every rank.
  virtual absl::Status AllGatherV(const void* send, size_t send_count, void* recv,
                                  absl::Span<const size_t> counts, DType dtype) = 0;
  // send: [W, count]; recv: [count] = sum over ranks q of q's send[rank]. F32, BF16 (summed in
  // fp32, rounded once), I32.
  virtual absl::Status ReduceScatterSum(const void* send, void* recv, size_t count,
                                        DType dtype) = 0;
  // send: [W, count], block q goes to rank q; recv: [W, count], block q came from rank q.
  virtual absl::Status AllToAll(const void* send, void* recv, size_t count, DType dtype) = 0;
  // Variable all-to-all; counts and displacements in elements, [W] each, on the host.
  virtual absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                                 absl::Span<const size_t> send_displs, void* recv,
                                 absl::Span<const size_t> recv_counts,
                                 absl::Span<const size_t> recv_displs, DType dtype) = 0;
  // data: [bytes] on every rank; root's bytes are copied to all.
  virtual absl::Status Broadcast(void* data, size_t bytes, int root) = 0;
  virtual absl::Status Barrier() = 0;

  // Control plane, host memory. values: [W] receives every rank's value.
  virtual absl::Status HostAllGather(int64_t value, absl::Span<int64_t> values) = 0;
  virtual absl::Status HostBroadcast(void* data, size_t bytes, int root) = 0;

  // Ends every process of the group (used after an error that peers may not have seen).
  [[noreturn]] virtual void Abort(int exit_code) = 0;
};

// One outcome for the whole group: OK when every rank's `local` is OK, else the error of the
// lowest failing rank (its message, naming that rank) on every rank. A rank that fails alone
// therefore never leaves its peers waiting in a later collective.
absl::Status AgreeOnStatus(Communicator& comm, const absl::Status& local);

// Typed conveniences over the untyped calls, checking buffer sizes.
template <typename T>
absl::Status AllGather(Communicator& comm, absl::Span<const T> send, absl::Span<T> recv) {
  if (recv.size() != send.size() * size_t(comm.world_size())) {
    return absl::InvalidArgumentError("AllGather: recv must hold world_size * send elements");
  }
  return comm.AllGather(send.data(), recv.data(), send.size(), dtype_of<T>());
}

template <typename T>
absl::Status ReduceScatterSum(Communicator& comm, absl::Span<const T> send, absl::Span<T> recv) {
  if (send.size() != recv.size() * size_t(comm.world_size())) {
    return absl::InvalidArgumentError("ReduceScatterSum: send must hold world_size * recv elements");
  }
  return comm.ReduceScatterSum(send.data(), recv.data(), recv.size(), dtype_of<T>());
}

template <typename T>
absl::Status AllToAll(Communicator& comm, absl::Span<const T> send, absl::Span<T> recv) {
  const size_t world = size_t(comm.world_size());
  if (send.size() != recv.size() || send.size() % world != 0) {
    return absl::InvalidArgumentError("AllToAll: send and recv must be equal multiples of world_size");
  }
  return comm.AllToAll(send.data(), recv.data(), send.size() / world, dtype_of<T>());
}

}  // namespace dcp
