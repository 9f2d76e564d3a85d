// The collectives a DCP group needs, behind one interface with an MPI backend (host buffers,
// Open MPI over UCX or its other transports), a world-of-one backend (a rank's own reference),
// and an NCCL backend (device buffers) on CUDA builds.
//
// Two planes:
//  - data plane (AllGather ... Broadcast): buffers live in memory_space(); element counts are
//    per rank; every rank passes the same counts and dtype unless the call says otherwise.
//  - control plane (Host*): small host-memory exchanges (plans, error agreement), always on
//    host buffers whatever the data plane, and always complete on the host when they return.
//
// Completion of the data plane (BindStream):
//  - Completion::kHost (the default, and the only mode of the host-memory backends): a call
//    returns once its result is in the receive buffer.
//  - Completion::kStream (NCCL): a call enqueues its work on the bound CUDA stream and returns;
//    the result is ready for work enqueued after it on that stream. No host wait, no device
//    allocation (after ReserveReduceScatter), no host-side polling: the calls can be captured
//    into a CUDA graph. Synchronize() waits on the host for everything enqueued so far.
//    completion() says what a backend really does: host-staged MPI asked for kStream keeps
//    kHost (it must wait to stage), which is also correct in stream order, only slower.
//
// Failures: every call returns a Status. A call that fails, or does not complete within the
// configured timeout, returns an error (DeadlineExceeded for a timeout) and marks the
// communicator broken: later calls fail at once. Under kStream the failure of enqueued work is
// found by the backend's watchdog (NCCL: a thread per communicator polls its asynchronous error
// and a deadline per enqueued collective) and returned by the next call, or by Synchronize().
// The caller then returns the error; a launcher calls Abort() so no rank hangs in a collective
// its peers will never join. A timed-out MPI operation cannot be cancelled: if the late peers
// do arrive, it still completes into its buffers, at the latest while the communicator is
// destroyed, so those buffers must outlive the communicator (or the process must abort).
// Collectives know nothing of attention.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace dcp {

// When a data-plane call's result is ready (see the top of this file).
enum class Completion { kHost, kStream };

// A CUDA stream (cudaStream_t) passed through this CUDA-free header; null: the legacy default
// stream (device backends) or "no stream" (host backends).
using StreamHandle = void*;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual MemorySpace memory_space() const = 0;
  virtual std::string name() const = 0;  // "mpi", "local", "nccl", ...
  // The most elements one collective call may carry per rank (the count arguments below): MPI
  // counts are int; NCCL's and the local group's are size_t. An engine refuses a step whose
  // collectives would pass it at Plan, before any Run writes a cache.
  virtual uint64_t max_count() const { return UINT64_MAX; }

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

  // ---- Stream order (defaults: the host-completing backends) ----
  // Runs later data-plane calls on `stream` with `completion` asked for. Backends on host
  // memory accept only a null stream and complete on the host in either mode. A device
  // backend checks that the stream belongs to its GPU (InvalidArgument otherwise) and orders
  // the new stream after work still queued on the old one. Not during a graph capture.
  virtual absl::Status BindStream(StreamHandle stream, Completion completion);
  // What the data plane really does now (kHost unless the backend enqueues and returns).
  virtual Completion completion() const { return Completion::kHost; }
  // Waits on the host until every data-plane call made so far has completed; returns the
  // first failure (the communicator's, whoever found it). Immediate where calls complete on
  // the host.
  virtual absl::Status Synchronize() { return absl::OkStatus(); }
  // Puts the work enqueued so far on the bound stream under the deadline, named `what`: for
  // work the backend did not enqueue itself, e.g. after cudaGraphLaunch of a graph that holds
  // collectives (captured calls are not tracked). No-op under host completion. `what` is kept
  // by pointer: pass a string literal.
  virtual absl::Status WatchStream(const char* what);
  // Makes ReduceScatterSum calls of up to `count` elements of `dtype` free of allocation (NCCL
  // sums BF16 in fp32 scratch). Not collective; may wait on the host: call it at plan time.
  virtual absl::Status ReserveReduceScatter(size_t count, DType dtype);
};

// One outcome for the whole group: OK when every rank's `local` is OK, else the error of the
// lowest failing rank (its message, naming that rank) on every rank. A rank that fails alone
// therefore never leaves its peers waiting in a later collective. A world of one returns
// `local` without a collective.
absl::Status AgreeOnStatus(Communicator& comm, const absl::Status& local);

// Errors that mean the group itself failed (a peer stopped, died or never joined: a collective
// timed out, or the communicator broke): no agreement can follow them.
inline bool IsGroupFailure(const absl::Status& status) {
  return status.code() == absl::StatusCode::kDeadlineExceeded ||
         status.code() == absl::StatusCode::kUnavailable;
}

// The argument check every AllToAllV shares: four spans of `world_size` entries each.
absl::Status CheckAllToAllVArgs(int world_size, absl::Span<const size_t> send_counts,
                                absl::Span<const size_t> send_displs,
                                absl::Span<const size_t> recv_counts,
                                absl::Span<const size_t> recv_displs);

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
