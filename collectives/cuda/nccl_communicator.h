// Communicator over NCCL for device buffers (one GPU per rank).
//
// Construction:
// - Create: bootstrapped through MPI. Rank 0 makes the NCCL unique id, the MPI communicator
//   broadcasts it, every rank joins a *non-blocking* NCCL communicator (config.blocking = 0)
//   whose initialization is polled against the timeout; the ranks then agree on the outcome
//   over MPI. The control plane (Host*) and Abort go to that MPI communicator.
// - Adopt: wraps an NCCL communicator the engine already has (blocking or not). Destroyed by us
//   only with Ownership::kOwned, and only once Adopt succeeded (on an error the caller keeps
//   it, untouched). While wrapped it is used through the wrapper only (the watchdog polls it
//   from its own thread: NCCL forbids concurrent use of one communicator) and must outlive the
//   wrapper. Without an MPI communicator the control plane runs over NCCL itself (small device
//   copies, completed on the host) and Abort ends this process only.
//
// Data plane on device buffers, enqueued on the bound stream (null: the legacy default stream,
// which is ordered with CudaDevice's blocking stream both ways). AllToAll(V) and AllGatherV are
// ncclSend/ncclRecv groups (a rank's own block is a device copy). BF16 ReduceScatterSum is done
// in fp32 (converted into scratch, reduced, rounded once), as the interface promises.
//
// Completion (communicator.h):
// - kHost (default, today's behaviour): each call enqueues, then waits on the host for its
//   completion (an event polled with NCCL's asynchronous error, against the timeout).
// - kStream: each call enqueues and returns. Nothing in the call waits on the host, allocates
//   (once ReserveReduceScatter covers BF16 sums) or polls, so a captured CUDA graph holds it.
//   Exception: a non-blocking NCCL communicator (Create's) may answer ncclInProgress: NCCL
//   2.28 hands every group's launch to a thread of its own (and connects peers on the first
//   use of a pattern), so the call polls until NCCL has enqueued, not until the collective
//   completes (bounded by the timeout; host time only, nothing waits on the device). Run each
//   collective once eagerly before a capture (engines warm up anyway).
//   Barrier() is then a stream-ordered all-reduce of one word: it orders device work across
//   ranks, it does not wait on the host.
//
// The watchdog, and what a failure looks like (the contract):
// - One thread per communicator wakes every `watchdog_interval_s` and (a) polls
//   ncclCommGetAsyncError, (b) retires the events recorded after each stream-ordered call, in
//   order, and checks the oldest outstanding one against its deadline: `timeout_s` counted from
//   the call's enqueue (so it covers the work queued ahead of the collective too: choose a
//   timeout well above a step's time). Calls made during a graph capture are not tracked; after
//   cudaGraphLaunch call WatchStream() to put the replay under the deadline.
// - On an NCCL error or a missed deadline the communicator is marked broken and aborted
//   (ncclCommAbort on the watchdog's thread: NCCL's kernels stuck waiting for peers exit, the
//   stream drains; the caller's thread does not wait for it). The error is
//   DeadlineExceeded ("... did not complete within T s") or Internal (NCCL's error), naming the
//   collective, its call number and the rank. The next call of any kind - data plane, control
//   plane, Synchronize - returns that error (same code, same message), as does every later one.
// - Every rank of a group gets an error: a rank whose collective cannot complete because a peer
//   is gone or aborted misses its own deadline. So a rank returns within timeout_s (+ one
//   watchdog interval) of enqueueing a collective that cannot complete.
//   The abort may wait for work on the stream that is not NCCL's (a kernel spinning ahead of
//   the collective): a caller's stuck kernel is the caller's to end.
// - After a failure the receive buffers of the failed and later collectives hold undefined
//   values, and an adopted communicator has been aborted too (NCCL frees it): the engine must
//   not use or destroy it again. A launcher ends the job (Abort) as after any collective error;
//   Abort does not wait for NCCL (the processes end, and its state with them).
// - CUDA graphs: NCCL's abort and destruction of a communicator wait until every graph that
//   captured its calls is destroyed. Destroy such graphs (and their executables) before this
//   communicator: its destructor waits for the abort, or destroys an owned communicator.
//   Scratch outgrown by a larger BF16 sum is kept until destruction (graphs hold its address).
// - A step of a call that is not NCCL's (a device copy, a conversion, scratch) failing after
//   the call began breaks the communicator too: the peers' part of that collective is enqueued.
// - Destruction waits (bounded) for the work queued so far; for an adopted kBorrowed
//   communicator a timeout there leaves it to its owner, not aborted (and leaks this wrapper's
//   device buffers, which the stuck work may still use).
// - Under kHost the calling thread enforces the deadline itself as well (the first to see a
//   failure wins; the result is the same).
//
// Threading: one caller thread at a time (as NCCL); the watchdog synchronizes with it inside.
// Calls make the communicator's GPU the calling thread's current device and leave it so.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "collectives/mpi_communicator.h"

namespace dcp {

struct NcclOptions {
  double timeout_s = 60.0;        // init, each collective's deadline, host waits
  cudaStream_t stream = nullptr;  // the data plane's stream (BindStream changes it)
  Completion completion = Completion::kHost;
  double watchdog_interval_s = 0.002;  // how often the watchdog looks
  // Stream-ordered calls tracked at once; more outstanding calls merge into the newest entry
  // (still under a deadline, counted from the newest call).
  int max_tracked = 256;
};

class NcclCommunicator final : public Communicator {
 public:
  enum class Ownership { kBorrowed, kOwned };

  // Collective over the ranks of `mpi`; the current CUDA device (cudaSetDevice) is this rank's
  // GPU, which no other rank of the group may use. `mpi` must outlive the result.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(MpiCommunicator& mpi,
                                                                  double timeout_s,
                                                                  cudaStream_t stream = nullptr);
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(MpiCommunicator& mpi,
                                                                  const NcclOptions& options);
  // Wraps `comm` (initialized, or still initializing if non-blocking: waited for up to the
  // timeout). Rank, size and GPU come from NCCL. `control` (may be null) carries the control
  // plane and Abort; it must then span the same ranks in the same order and outlive the result.
  // Not collective (nothing is exchanged).
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Adopt(
      ncclComm_t comm, const NcclOptions& options, Ownership ownership,
      MpiCommunicator* control = nullptr);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  MemorySpace memory_space() const override { return MemorySpace::kDevice; }
  std::string name() const override { return "nccl"; }

  absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype) override;
  absl::Status AllGatherV(const void* send, size_t send_count, void* recv,
                          absl::Span<const size_t> counts, DType dtype) override;
  absl::Status ReduceScatterSum(const void* send, void* recv, size_t count, DType dtype) override;
  absl::Status AllToAll(const void* send, void* recv, size_t count, DType dtype) override;
  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                         absl::Span<const size_t> send_displs, void* recv,
                         absl::Span<const size_t> recv_counts, absl::Span<const size_t> recv_displs,
                         DType dtype) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Barrier() override;
  absl::Status HostAllGather(int64_t value, absl::Span<int64_t> values) override;
  absl::Status HostBroadcast(void* data, size_t bytes, int root) override;
  [[noreturn]] void Abort(int exit_code) override;

  absl::Status BindStream(StreamHandle stream, Completion completion) override;
  Completion completion() const override { return completion_; }
  absl::Status Synchronize() override;
  absl::Status WatchStream(const char* what) override;
  absl::Status ReserveReduceScatter(size_t count, DType dtype) override;

  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  // The failure that broke the communicator; OK while it works.
  absl::Status failure() const;

 private:
  using Clock = std::chrono::steady_clock;
  // A stream-ordered call under the watchdog's deadline.
  struct Tracked {
    cudaEvent_t event = nullptr;
    Clock::time_point enqueued;
    const char* what = "";
    uint64_t call = 0;
  };

  NcclCommunicator(ncclComm_t comm, Ownership ownership, MpiCommunicator* control, int device,
                   int rank, int world_size, const NcclOptions& options);
  absl::Status Init();  // events, barrier word, watchdog thread

  absl::Status CheckUsable() const;
  // Marks the communicator broken with `status` (the first failure wins) and has NCCL aborted
  // (AbortNccl). Returns the communicator's failure (the first one). Never called with
  // nccl_mutex_ or track_mutex_ held.
  absl::Status Fail(absl::Status status);
  // ncclCommAbort on the watchdog's thread (handed over), or on this one without a watchdog.
  void AbortNccl(ncclComm_t comm);
  std::string Describe(const char* what, uint64_t call) const;  // "what (call #n on rank r of W)"
  // The steps of a data-plane call: Begin (usable? count it), Enqueue (NCCL calls made by
  // `enqueue(comm)`, which returns the first NCCL result, under the NCCL lock; ncclInProgress
  // is waited out), Finish (wait on the host, or track for the watchdog, as the mode says).
  absl::Status Begin(const char* what);
  template <typename EnqueueFn>
  absl::Status Enqueue(const char* what, EnqueueFn&& enqueue);
  absl::Status Finish(const char* what);
  absl::Status FailIfError(absl::Status status);  // Fail(status) unless OK
  absl::Status Track(const char* what);
  // Records an event on the stream and waits for it on the host, against the timeout; an
  // error fails the communicator unless `fail_on_error` is false (the destructor, borrowed).
  absl::Status WaitOnHost(const char* what, bool fail_on_error = true);
  absl::Status EnsureScratch(size_t bytes, const char* what);
  absl::Status ControlBytes(size_t bytes);  // buffers of the NCCL control plane (no MPI)
  void WatchdogLoop();

  Ownership ownership_;  // kBorrowed until Adopt's Init succeeded
  MpiCommunicator* const control_;
  const int device_, rank_, world_size_;
  const double timeout_s_, interval_s_;
  cudaStream_t stream_;
  Completion completion_;
  std::atomic<uint64_t> calls_{0};          // calls made (numbers the errors)
  std::atomic<const char*> last_what_{""};  // the last call's name (async errors name it)

  std::mutex nccl_mutex_;  // every use of comm_: enqueue, async-error poll, abort
  ncclComm_t comm_;

  std::atomic<bool> broken_{false};
  mutable std::mutex failure_mutex_;
  absl::Status failure_;

  std::mutex track_mutex_;  // the ring, stop_, abort_pending_
  std::condition_variable wake_;
  ncclComm_t abort_pending_ = nullptr;  // taken out of comm_ by Fail, for the watchdog
  std::vector<Tracked> ring_;
  size_t head_ = 0, outstanding_ = 0;
  bool stop_ = false;
  std::thread watchdog_;

  cudaEvent_t host_event_ = nullptr;   // WaitOnHost
  cudaEvent_t order_event_ = nullptr;  // BindStream: new stream after the old one
  float* barrier_word_ = nullptr;      // device
  void* scratch_ = nullptr;            // device: fp32 staging of bf16 sums
  size_t scratch_bytes_ = 0;
  std::vector<void*> retired_scratch_;  // outgrown, kept for graphs and queued work
  void* control_bytes_ = nullptr;       // device: the NCCL control plane (no MPI)
  void* control_host_ = nullptr;        // pinned, same size
  size_t control_capacity_ = 0;
};

}  // namespace dcp
