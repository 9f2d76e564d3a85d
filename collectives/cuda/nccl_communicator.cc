#include "collectives/cuda/nccl_communicator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "collectives/cuda/nccl_status.h"
#include "core/cuda/convert.h"
#include "core/cuda/cuda_status.h"
#include "core/status.h"

namespace dcp {
namespace {

using Clock = std::chrono::steady_clock;

Clock::duration Seconds(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
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
    std::this_thread::sleep_for(
        std::chrono::microseconds(waited < std::chrono::milliseconds(100) ? 20 : 200));
  }
}

// Whether `stream` is being captured into a CUDA graph. When CUDA cannot say (the legacy stream
// during another thread's global capture), answer yes: then nothing is recorded or waited on.
bool Capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

// Polls `comm` until its pending operation (init, enqueue, finalize) has left ncclInProgress.
// Stops early, with Aborted, once `broken` (when given) is set: the watchdog found a failure
// and waits for the NCCL lock this poll holds.
absl::Status PollInProgress(ncclComm_t comm, Clock::time_point deadline, const std::string& what,
                            double timeout_s, const std::atomic<bool>* broken = nullptr) {
  const auto started = Clock::now();
  for (;;) {
    if (broken != nullptr && broken->load(std::memory_order_acquire)) {
      return DCP_ERROR(Aborted, "%s: the communicator failed meanwhile", what);
    }
    ncclResult_t state = ncclSuccess;
    DCP_NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclCodeToStatus(state, what.c_str(), __FILE__, __LINE__);
    if (Clock::now() > deadline) {
      return DCP_ERROR(DeadlineExceeded,
                       "%s did not complete within %.1f s: a peer rank failed or never joined",
                       what, timeout_s);
    }
    Backoff(started);
  }
}

absl::Status CheckStreamDevice(cudaStream_t stream, int device) {
  if (stream == nullptr) return absl::OkStatus();
  int stream_device = -1;
  DCP_CUDA_CHECK(cudaStreamGetDevice(stream, &stream_device));
  DCP_CHECK_ARG(stream_device == device,
                "NcclCommunicator: the stream belongs to GPU %d, the communicator to GPU %d",
                stream_device, device);
  return absl::OkStatus();
}

}  // namespace

// A step of a call after Begin (a device copy, a conversion, scratch, the control buffers):
// its failure breaks the communicator as a failed NCCL call does, since this rank's part of the
// collective is missing while its peers' is enqueued (its next call would pair with theirs).
#define DCP_NCCL_LOCAL(expr) DCP_RETURN_IF_ERROR(FailIfError(expr))
#define DCP_NCCL_LOCAL_CUDA(call) \
  DCP_NCCL_LOCAL(::dcp::CudaCodeToStatus((call), #call, __FILE__, __LINE__))

// ---- construction -------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(MpiCommunicator& mpi,
                                                                           double timeout_s,
                                                                           cudaStream_t stream) {
  NcclOptions options;
  options.timeout_s = timeout_s;
  options.stream = stream;
  return Create(mpi, options);
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    MpiCommunicator& mpi, const NcclOptions& options) {
  DCP_CHECK_ARG(options.timeout_s > 0, "NcclCommunicator: timeout must be positive, got %g",
                options.timeout_s);
  int device = -1;
  DCP_CUDA_CHECK(cudaGetDevice(&device));
  ncclUniqueId id{};
  absl::Status local = absl::OkStatus();
  if (mpi.rank() == 0) {
    local = NcclCodeToStatus(ncclGetUniqueId(&id), "ncclGetUniqueId", __FILE__, __LINE__);
  }
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
    local = PollInProgress(comm, Clock::now() + Seconds(options.timeout_s),
                           "ncclCommInitRankConfig", options.timeout_s);
  }
  // Every rank learns whether every rank got a communicator; on failure none keeps one.
  absl::Status agreed = AgreeOnStatus(mpi, local);
  if (!agreed.ok()) {
    if (comm != nullptr) ncclCommAbort(comm);
    return agreed;
  }
  std::unique_ptr<NcclCommunicator> self(new NcclCommunicator(
      comm, Ownership::kOwned, &mpi, device, mpi.rank(), mpi.world_size(), options));
  agreed = AgreeOnStatus(mpi, self->Init());
  if (!agreed.ok()) {
    (void)self->Fail(agreed);  // aborts: no rank keeps a communicator its peers gave up
    return agreed;
  }
  return self;
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Adopt(
    ncclComm_t comm, const NcclOptions& options, Ownership ownership, MpiCommunicator* control) {
  DCP_CHECK_ARG(comm != nullptr, "NcclCommunicator::Adopt: null ncclComm_t");
  DCP_CHECK_ARG(options.timeout_s > 0, "NcclCommunicator: timeout must be positive, got %g",
                options.timeout_s);
  // A non-blocking communicator may still be initializing.
  DCP_RETURN_IF_ERROR(PollInProgress(comm, Clock::now() + Seconds(options.timeout_s),
                                     "adopted NCCL communicator (initialization)",
                                     options.timeout_s));
  int device = -1, rank = -1, world = 0;
  DCP_NCCL_CHECK(ncclCommCuDevice(comm, &device));
  DCP_NCCL_CHECK(ncclCommUserRank(comm, &rank));
  DCP_NCCL_CHECK(ncclCommCount(comm, &world));
  if (control != nullptr) {
    DCP_CHECK_ARG(control->world_size() == world && control->rank() == rank,
                  "NcclCommunicator::Adopt: the control communicator is rank %d of %d, the NCCL "
                  "communicator rank %d of %d",
                  control->rank(), control->world_size(), rank, world);
  }
  DCP_CUDA_CHECK(cudaSetDevice(device));
  // Borrowed until Init succeeds: on any error the caller keeps its communicator, untouched.
  std::unique_ptr<NcclCommunicator> self(
      new NcclCommunicator(comm, Ownership::kBorrowed, control, device, rank, world, options));
  DCP_RETURN_IF_ERROR(self->Init());
  self->ownership_ = ownership;
  return self;
}

NcclCommunicator::NcclCommunicator(ncclComm_t comm, Ownership ownership, MpiCommunicator* control,
                                   int device, int rank, int world_size, const NcclOptions& options)
    : ownership_(ownership),
      control_(control),
      device_(device),
      rank_(rank),
      world_size_(world_size),
      timeout_s_(options.timeout_s),
      interval_s_(options.watchdog_interval_s > 0 ? options.watchdog_interval_s : 0.002),
      stream_(options.stream),
      completion_(options.completion),
      comm_(comm),
      ring_(size_t(std::max(1, options.max_tracked))) {}

absl::Status NcclCommunicator::Init() {
  DCP_CUDA_CHECK(cudaSetDevice(device_));
  DCP_RETURN_IF_ERROR(CheckStreamDevice(stream_, device_));
  DCP_CHECK_ARG(completion_ == Completion::kHost || completion_ == Completion::kStream,
                "NcclCommunicator: unknown completion mode %d", static_cast<int>(completion_));
  DCP_CUDA_CHECK(cudaEventCreateWithFlags(&host_event_, cudaEventDisableTiming));
  DCP_CUDA_CHECK(cudaEventCreateWithFlags(&order_event_, cudaEventDisableTiming));
  for (Tracked& tracked : ring_) {
    DCP_CUDA_CHECK(cudaEventCreateWithFlags(&tracked.event, cudaEventDisableTiming));
  }
  DCP_CUDA_CHECK(cudaMalloc(&barrier_word_, sizeof(float)));
  DCP_CUDA_CHECK(cudaMemset(barrier_word_, 0, sizeof(float)));
  watchdog_ = std::thread(&NcclCommunicator::WatchdogLoop, this);
  return absl::OkStatus();
}

NcclCommunicator::~NcclCommunicator() {
  {
    std::lock_guard<std::mutex> lock(track_mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();  // after any abort it was handed
  cudaSetDevice(device_);
  // Let queued work finish, bounded. Ours (kOwned): a stuck collective fails and aborts. The
  // engine's (kBorrowed) is not ours to abort: on a timeout it is left to its owner, and so are
  // our buffers (work still queued may use them; cudaFree would wait for it).
  bool drained = true;
  if (!broken_.load() && host_event_ != nullptr && !Capturing(stream_)) {
    const bool owned = ownership_ == Ownership::kOwned;
    const absl::Status waited = WaitOnHost("destruction of the NCCL communicator", owned);
    if (!waited.ok() && !owned) {
      drained = false;
      std::fprintf(stderr,
                   "[rank %d] ~NcclCommunicator: %s; the adopted NCCL communicator is left to "
                   "its owner (not aborted) and this wrapper's device buffers are not freed\n",
                   rank_, std::string(waited.message()).c_str());
    }
  }
  {
    std::lock_guard<std::mutex> lock(nccl_mutex_);
    if (comm_ != nullptr && ownership_ == Ownership::kOwned) {
      // A non-blocking communicator finalizes asynchronously: poll, then destroy; abort rather
      // than hang in a destructor.
      ncclResult_t code = ncclCommFinalize(comm_);
      if (code == ncclInProgress) {
        code = PollInProgress(comm_, Clock::now() + Seconds(timeout_s_), "ncclCommFinalize",
                              timeout_s_)
                       .ok()
                   ? ncclSuccess
                   : ncclInternalError;
      }
      if (code == ncclSuccess) code = ncclCommDestroy(comm_);
      if (code != ncclSuccess) ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }
  if (!drained) return;
  for (Tracked& tracked : ring_) {
    if (tracked.event != nullptr) cudaEventDestroy(tracked.event);
  }
  if (host_event_ != nullptr) cudaEventDestroy(host_event_);
  if (order_event_ != nullptr) cudaEventDestroy(order_event_);
  if (barrier_word_ != nullptr) cudaFree(barrier_word_);
  if (scratch_ != nullptr) cudaFree(scratch_);
  for (void* retired : retired_scratch_) cudaFree(retired);
  if (control_bytes_ != nullptr) cudaFree(control_bytes_);
  if (control_host_ != nullptr) cudaFreeHost(control_host_);
}

// ---- failure state -------------------------------------------------------------------------

absl::Status NcclCommunicator::failure() const {
  if (!broken_.load(std::memory_order_acquire)) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return failure_;
}

absl::Status NcclCommunicator::CheckUsable() const { return failure(); }

absl::Status NcclCommunicator::Fail(absl::Status status) {
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (!broken_.load(std::memory_order_relaxed)) {
      failure_ = std::move(status);
      broken_.store(true, std::memory_order_release);
    }
    status = failure_;
  }
  ncclComm_t doomed = nullptr;
  {
    std::lock_guard<std::mutex> lock(nccl_mutex_);
    std::swap(doomed, comm_);  // no call reaches NCCL through it from now on
  }
  if (doomed != nullptr) AbortNccl(doomed);
  return status;
}

void NcclCommunicator::AbortNccl(ncclComm_t comm) {
  // ncclCommAbort makes NCCL's kernels stuck on peers exit (the stream drains), then waits
  // until every CUDA graph that captured this communicator's calls is destroyed. The caller's
  // thread may own such graphs, so the watchdog's thread aborts, and the caller returns the
  // error at once. Only without a watchdog (before Init started it, or after the destructor
  // stopped it) does the calling thread abort.
  {
    std::lock_guard<std::mutex> lock(track_mutex_);
    if (!stop_ && watchdog_.joinable() && std::this_thread::get_id() != watchdog_.get_id()) {
      abort_pending_ = comm;
      wake_.notify_all();
      return;
    }
  }
  ncclCommAbort(comm);
}

std::string NcclCommunicator::Describe(const char* what, uint64_t call) const {
  return absl::StrFormat("%s (call #%d on rank %d of %d)", what, call, rank_, world_size_);
}

// ---- the mechanics of one call -------------------------------------------------------------

absl::Status NcclCommunicator::Begin(const char* what) {
  DCP_RETURN_IF_ERROR(CheckUsable());
  DCP_CUDA_CHECK(cudaSetDevice(device_));
  calls_.fetch_add(1, std::memory_order_relaxed);
  last_what_.store(what, std::memory_order_relaxed);
  return absl::OkStatus();
}

template <typename EnqueueFn>
absl::Status NcclCommunicator::Enqueue(const char* what, EnqueueFn&& enqueue) {
  absl::Status enqueued;
  {
    std::lock_guard<std::mutex> lock(nccl_mutex_);
    if (comm_ == nullptr) {
      enqueued = DCP_ERROR(FailedPrecondition, "%s: the NCCL communicator was aborted", what);
    } else {
      const ncclResult_t result = enqueue(comm_);
      if (result == ncclInProgress) {
        // Peers are being connected (first use of a pattern): wait until NCCL has enqueued.
        enqueued = PollInProgress(comm_, Clock::now() + Seconds(timeout_s_),
                                  Describe(what, calls_.load()), timeout_s_, &broken_);
      } else if (result != ncclSuccess) {
        enqueued =
            NcclCodeToStatus(result, Describe(what, calls_.load()).c_str(), __FILE__, __LINE__);
      }
    }
  }
  if (!enqueued.ok()) return Fail(enqueued);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::FailIfError(absl::Status status) {
  return status.ok() ? status : Fail(std::move(status));
}

absl::Status NcclCommunicator::Finish(const char* what) {
  if (completion_ == Completion::kHost) return WaitOnHost(what);
  return Track(what);
}

absl::Status NcclCommunicator::Track(const char* what) {
  if (Capturing(stream_)) return absl::OkStatus();  // a replay is watched through WatchStream
  cudaError_t recorded = cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(track_mutex_);
    size_t slot;
    if (outstanding_ == ring_.size()) {
      slot = (head_ + outstanding_ - 1) % ring_.size();  // full: the newest entry covers us too
    } else {
      slot = (head_ + outstanding_) % ring_.size();
      ++outstanding_;
    }
    Tracked& tracked = ring_[slot];
    recorded = cudaEventRecord(tracked.event, stream_);
    tracked.enqueued = Clock::now();
    tracked.what = what;
    tracked.call = calls_.load(std::memory_order_relaxed);
  }
  if (recorded != cudaSuccess) {
    return Fail(
        CudaCodeToStatus(recorded, Describe(what, calls_.load()).c_str(), __FILE__, __LINE__));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::WaitOnHost(const char* what, bool fail_on_error) {
  const auto fail = [&](absl::Status status) {
    return fail_on_error ? Fail(std::move(status)) : status;
  };
  if (Capturing(stream_)) {
    return DCP_ERROR(FailedPrecondition,
                     "%s waits on the host, which a CUDA graph capture forbids: bind the "
                     "communicator with Completion::kStream before capturing",
                     what);
  }
  if (const cudaError_t recorded = cudaEventRecord(host_event_, stream_); recorded != cudaSuccess) {
    return fail(
        CudaCodeToStatus(recorded, Describe(what, calls_.load()).c_str(), __FILE__, __LINE__));
  }
  const auto started = Clock::now();
  const auto deadline = started + Seconds(timeout_s_);
  for (int polls = 0;; ++polls) {
    const cudaError_t done = cudaEventQuery(host_event_);
    if (done == cudaSuccess) return CheckUsable();  // the watchdog may have seen an error
    if (done != cudaErrorNotReady) {
      return fail(
          CudaCodeToStatus(done, Describe(what, calls_.load()).c_str(), __FILE__, __LINE__));
    }
    if (broken_.load(std::memory_order_acquire)) return failure();
    if (polls % 32 == 31) {  // the event is cheap to poll; NCCL's async state less so
      absl::Status async_error;
      {
        std::lock_guard<std::mutex> lock(nccl_mutex_);
        ncclResult_t state = ncclSuccess;
        if (comm_ != nullptr && ncclCommGetAsyncError(comm_, &state) == ncclSuccess &&
            state != ncclSuccess && state != ncclInProgress) {
          async_error =
              NcclCodeToStatus(state, Describe(what, calls_.load()).c_str(), __FILE__, __LINE__);
        }
      }
      if (!async_error.ok()) return fail(async_error);
      if (Clock::now() > deadline) {
        return fail(DCP_ERROR(DeadlineExceeded,
                              "%s did not complete within %.1f s: a peer rank failed or never "
                              "joined%s",
                              Describe(what, calls_.load()), timeout_s_,
                              fail_on_error ? "; NCCL communicator aborted" : ""));
      }
    }
    Backoff(started);
  }
}

void NcclCommunicator::WatchdogLoop() {
  // Our event queries must not break a graph capture that the caller runs in global mode.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaSetDevice(device_);
  const auto interval = Seconds(interval_s_);
  const auto timeout = Seconds(timeout_s_);
  std::unique_lock<std::mutex> lock(track_mutex_);
  for (;;) {
    wake_.wait_for(lock, interval, [&] { return stop_ || abort_pending_ != nullptr; });
    if (abort_pending_ != nullptr) {  // handed over by Fail on the caller's thread
      ncclComm_t doomed = std::exchange(abort_pending_, nullptr);
      lock.unlock();
      ncclCommAbort(doomed);
      lock.lock();
      continue;
    }
    if (stop_) break;
    if (broken_.load(std::memory_order_acquire)) continue;
    absl::Status found;
    const char* oldest_what = nullptr;
    uint64_t oldest_call = 0;
    // Retire completed calls in order; the oldest one left is checked against its deadline.
    while (outstanding_ > 0) {
      const Tracked& oldest = ring_[head_];
      const cudaError_t done = cudaEventQuery(oldest.event);
      if (done == cudaSuccess) {
        head_ = (head_ + 1) % ring_.size();
        --outstanding_;
        continue;
      }
      oldest_what = oldest.what;
      oldest_call = oldest.call;
      if (done != cudaErrorNotReady) {
        found =
            CudaCodeToStatus(done, Describe(oldest.what, oldest.call).c_str(), __FILE__, __LINE__);
      } else if (Clock::now() - oldest.enqueued > timeout) {
        found = DCP_ERROR(DeadlineExceeded,
                          "%s did not complete within %.1f s of being enqueued: a peer rank "
                          "failed or never joined, or its stream is blocked; NCCL communicator "
                          "aborted by the watchdog",
                          Describe(oldest.what, oldest.call), timeout_s_);
      }
      break;
    }
    lock.unlock();
    if (found.ok()) {
      std::lock_guard<std::mutex> nccl_lock(nccl_mutex_);
      ncclResult_t state = ncclSuccess;
      if (comm_ != nullptr && ncclCommGetAsyncError(comm_, &state) == ncclSuccess &&
          state != ncclSuccess && state != ncclInProgress) {
        const char* what = oldest_what != nullptr ? oldest_what : last_what_.load();
        const uint64_t call = oldest_what != nullptr ? oldest_call : calls_.load();
        found = NcclCodeToStatus(
            state, absl::StrCat(Describe(what, call), " (asynchronous NCCL error)").c_str(),
            __FILE__, __LINE__);
      }
    }
    if (!found.ok()) (void)Fail(found);
    lock.lock();
  }
}

absl::Status NcclCommunicator::EnsureScratch(size_t bytes, const char* what) {
  if (bytes <= scratch_bytes_) return absl::OkStatus();
  DCP_CUDA_CHECK(cudaSetDevice(device_));
  if (Capturing(stream_)) {
    return DCP_ERROR(FailedPrecondition,
                     "%s needs %d bytes of scratch (%d reserved) and cannot allocate during a "
                     "CUDA graph capture: call ReserveReduceScatter first",
                     what, bytes, scratch_bytes_);
  }
  // The smaller buffer is kept until destruction, not freed: queued sums and CUDA graphs
  // captured before this growth still use its address. Growth at least doubles, so what is
  // kept stays below the live buffer's size.
  const size_t grown = std::max(bytes, 2 * scratch_bytes_);
  void* fresh = nullptr;
  DCP_CUDA_CHECK(cudaMalloc(&fresh, grown));
  if (scratch_ != nullptr) retired_scratch_.push_back(scratch_);
  scratch_ = fresh;
  scratch_bytes_ = grown;
  return absl::OkStatus();
}

// ---- stream order --------------------------------------------------------------------------

absl::Status NcclCommunicator::BindStream(StreamHandle stream, Completion completion) {
  DCP_RETURN_IF_ERROR(CheckUsable());
  DCP_CHECK_ARG(completion == Completion::kHost || completion == Completion::kStream,
                "NcclCommunicator: unknown completion mode %d", static_cast<int>(completion));
  auto* next = static_cast<cudaStream_t>(stream);
  DCP_CUDA_CHECK(cudaSetDevice(device_));
  DCP_RETURN_IF_ERROR(CheckStreamDevice(next, device_));
  DCP_CHECK_ARG(!Capturing(stream_) && !Capturing(next),
                "NcclCommunicator::BindStream during a CUDA graph capture");
  if (next != stream_) {
    // Work of ours still queued on the old stream (scratch, buffers) comes first.
    DCP_CUDA_CHECK(cudaEventRecord(order_event_, stream_));
    DCP_CUDA_CHECK(cudaStreamWaitEvent(next, order_event_, 0));
  }
  stream_ = next;
  completion_ = completion;
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Synchronize() {
  DCP_RETURN_IF_ERROR(CheckUsable());
  DCP_CUDA_CHECK(cudaSetDevice(device_));
  return WaitOnHost("Synchronize");
}

absl::Status NcclCommunicator::WatchStream(const char* what) {
  DCP_RETURN_IF_ERROR(CheckUsable());
  if (completion_ == Completion::kHost) return absl::OkStatus();
  DCP_CUDA_CHECK(cudaSetDevice(device_));
  return Track(what);
}

absl::Status NcclCommunicator::ReserveReduceScatter(size_t count, DType dtype) {
  DCP_RETURN_IF_ERROR(CheckUsable());
  if (dtype != DType::kBF16 || count == 0) return absl::OkStatus();
  return EnsureScratch((count * size_t(world_size_) + count) * sizeof(float),
                       "ReserveReduceScatter");
}

// ---- data plane ----------------------------------------------------------------------------

absl::Status NcclCommunicator::AllGather(const void* send, void* recv, size_t count, DType dtype) {
  DCP_RETURN_IF_ERROR(CheckUsable());
  if (count == 0) return absl::OkStatus();
  constexpr const char* kWhat = "ncclAllGather";
  DCP_RETURN_IF_ERROR(Begin(kWhat));
  DCP_RETURN_IF_ERROR(Enqueue(kWhat, [&](ncclComm_t comm) {
    return ncclAllGather(send, recv, count, NcclType(dtype), comm, stream_);
  }));
  return Finish(kWhat);
}

absl::Status NcclCommunicator::AllGatherV(const void* send, size_t send_count, void* recv,
                                          absl::Span<const size_t> counts, DType dtype) {
  DCP_RETURN_IF_ERROR(CheckUsable());
  DCP_CHECK_ARG(counts.size() == size_t(world_size_), "AllGatherV: counts has %d entries, not %d",
                counts.size(), world_size_);
  DCP_CHECK_ARG(counts[rank_] == send_count, "AllGatherV: send_count %d != counts[%d] = %d",
                send_count, rank_, counts[rank_]);
  constexpr const char* kWhat = "ncclSend/ncclRecv group (AllGatherV)";
  DCP_RETURN_IF_ERROR(Begin(kWhat));
  const size_t element = dtype_size(dtype);
  auto* out = static_cast<char*>(recv);
  size_t own_offset = 0;
  for (int r = 0; r < rank_; ++r) own_offset += counts[r];
  if (send_count > 0) {
    DCP_NCCL_LOCAL_CUDA(cudaMemcpyAsync(out + own_offset * element, send, send_count * element,
                                        cudaMemcpyDeviceToDevice, stream_));
  }
  if (world_size_ > 1) {
    DCP_RETURN_IF_ERROR(Enqueue(kWhat, [&](ncclComm_t comm) {
      ncclResult_t first = ncclGroupStart();
      if (first != ncclSuccess) return first;
      size_t offset = 0;
      for (int r = 0; r < world_size_; ++r) {
        if (r != rank_) {
          if (send_count > 0) {
            KeepFirstError(ncclSend(send, send_count, NcclType(dtype), r, comm, stream_), &first);
          }
          if (counts[r] > 0) {
            KeepFirstError(
                ncclRecv(out + offset * element, counts[r], NcclType(dtype), r, comm, stream_),
                &first);
          }
        }
        offset += counts[r];
      }
      KeepFirstError(ncclGroupEnd(), &first);
      return first;
    }));
  }
  return Finish(kWhat);
}

absl::Status NcclCommunicator::ReduceScatterSum(const void* send, void* recv, size_t count,
                                                DType dtype) {
  DCP_RETURN_IF_ERROR(CheckUsable());
  if (count == 0) return absl::OkStatus();
  if (dtype != DType::kBF16) {
    constexpr const char* kWhat = "ncclReduceScatter";
    DCP_RETURN_IF_ERROR(Begin(kWhat));
    DCP_RETURN_IF_ERROR(Enqueue(kWhat, [&](ncclComm_t comm) {
      return ncclReduceScatter(send, recv, count, NcclType(dtype), ncclSum, comm, stream_);
    }));
    return Finish(kWhat);
  }
  // bf16: sum in fp32, round once (NCCL's own bf16 sum rounds at every hop).
  constexpr const char* kWhat = "ncclReduceScatter(bf16 summed as fp32)";
  const size_t total = count * size_t(world_size_);
  // Scratch before the call begins: refused inside a capture, or out of memory, it fails this
  // call alone (nothing of it was enqueued on any rank's behalf) and the communicator stays.
  DCP_RETURN_IF_ERROR(EnsureScratch((total + count) * sizeof(float), kWhat));
  DCP_RETURN_IF_ERROR(Begin(kWhat));
  float* send_f32 = static_cast<float*>(scratch_);
  float* recv_f32 = send_f32 + total;
  DCP_NCCL_LOCAL(cuda::Convert(send_f32, DType::kF32, send, DType::kBF16, total, stream_));
  DCP_RETURN_IF_ERROR(Enqueue(kWhat, [&](ncclComm_t comm) {
    return ncclReduceScatter(send_f32, recv_f32, count, ncclFloat32, ncclSum, comm, stream_);
  }));
  DCP_NCCL_LOCAL(cuda::Convert(recv, DType::kBF16, recv_f32, DType::kF32, count, stream_));
  return Finish(kWhat);
}

absl::Status NcclCommunicator::AllToAll(const void* send, void* recv, size_t count, DType dtype) {
  DCP_RETURN_IF_ERROR(CheckUsable());
  if (count == 0) return absl::OkStatus();
  constexpr const char* kWhat = "ncclSend/ncclRecv group (AllToAll)";
  DCP_RETURN_IF_ERROR(Begin(kWhat));
  const size_t block = count * dtype_size(dtype);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  DCP_NCCL_LOCAL_CUDA(cudaMemcpyAsync(out + rank_ * block, in + rank_ * block, block,
                                      cudaMemcpyDeviceToDevice, stream_));
  if (world_size_ > 1) {
    DCP_RETURN_IF_ERROR(Enqueue(kWhat, [&](ncclComm_t comm) {
      ncclResult_t first = ncclGroupStart();
      if (first != ncclSuccess) return first;
      for (int r = 0; r < world_size_; ++r) {
        if (r == rank_) continue;
        KeepFirstError(ncclSend(in + r * block, count, NcclType(dtype), r, comm, stream_), &first);
        KeepFirstError(ncclRecv(out + r * block, count, NcclType(dtype), r, comm, stream_), &first);
      }
      KeepFirstError(ncclGroupEnd(), &first);
      return first;
    }));
  }
  return Finish(kWhat);
}

absl::Status NcclCommunicator::AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                                         absl::Span<const size_t> send_displs, void* recv,
                                         absl::Span<const size_t> recv_counts,
                                         absl::Span<const size_t> recv_displs, DType dtype) {
  DCP_RETURN_IF_ERROR(CheckUsable());
  DCP_RETURN_IF_ERROR(
      CheckAllToAllVArgs(world_size_, send_counts, send_displs, recv_counts, recv_displs));
  DCP_CHECK_ARG(send_counts[rank_] == recv_counts[rank_],
                "AllToAllV: own block sizes differ (send %d, recv %d)", send_counts[rank_],
                recv_counts[rank_]);
  constexpr const char* kWhat = "ncclSend/ncclRecv group (AllToAllV)";
  DCP_RETURN_IF_ERROR(Begin(kWhat));
  const size_t element = dtype_size(dtype);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  if (send_counts[rank_] > 0) {
    DCP_NCCL_LOCAL_CUDA(
        cudaMemcpyAsync(out + recv_displs[rank_] * element, in + send_displs[rank_] * element,
                        send_counts[rank_] * element, cudaMemcpyDeviceToDevice, stream_));
  }
  if (world_size_ > 1) {
    DCP_RETURN_IF_ERROR(Enqueue(kWhat, [&](ncclComm_t comm) {
      ncclResult_t first = ncclGroupStart();
      if (first != ncclSuccess) return first;
      for (int r = 0; r < world_size_; ++r) {
        if (r == rank_) continue;
        if (send_counts[r] > 0) {
          KeepFirstError(ncclSend(in + send_displs[r] * element, send_counts[r], NcclType(dtype), r,
                                  comm, stream_),
                         &first);
        }
        if (recv_counts[r] > 0) {
          KeepFirstError(ncclRecv(out + recv_displs[r] * element, recv_counts[r], NcclType(dtype),
                                  r, comm, stream_),
                         &first);
        }
      }
      KeepFirstError(ncclGroupEnd(), &first);
      return first;
    }));
  }
  return Finish(kWhat);
}

absl::Status NcclCommunicator::Broadcast(void* data, size_t bytes, int root) {
  DCP_RETURN_IF_ERROR(CheckUsable());
  DCP_CHECK_ARG(root >= 0 && root < world_size_, "Broadcast: root %d outside [0, %d)", root,
                world_size_);
  if (bytes == 0) return absl::OkStatus();
  constexpr const char* kWhat = "ncclBroadcast";
  DCP_RETURN_IF_ERROR(Begin(kWhat));
  DCP_RETURN_IF_ERROR(Enqueue(kWhat, [&](ncclComm_t comm) {
    return ncclBroadcast(data, data, bytes, ncclUint8, root, comm, stream_);
  }));
  return Finish(kWhat);
}

absl::Status NcclCommunicator::Barrier() {
  constexpr const char* kWhat = "ncclAllReduce(barrier)";
  DCP_RETURN_IF_ERROR(Begin(kWhat));
  DCP_RETURN_IF_ERROR(Enqueue(kWhat, [&](ncclComm_t comm) {
    return ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat32, ncclSum, comm, stream_);
  }));
  return Finish(kWhat);
}

// ---- control plane -------------------------------------------------------------------------

absl::Status NcclCommunicator::ControlBytes(size_t bytes) {
  if (bytes <= control_capacity_) return absl::OkStatus();
  DCP_CUDA_CHECK(cudaSetDevice(device_));
  const size_t grown = std::max<size_t>(bytes, 256);
  if (control_bytes_ != nullptr) {
    DCP_CUDA_CHECK(cudaFree(control_bytes_));  // control calls complete before they return
    control_bytes_ = nullptr;
  }
  if (control_host_ != nullptr) {
    DCP_CUDA_CHECK(cudaFreeHost(control_host_));
    control_host_ = nullptr;
  }
  control_capacity_ = 0;
  DCP_CUDA_CHECK(cudaMalloc(&control_bytes_, grown));
  DCP_CUDA_CHECK(cudaHostAlloc(&control_host_, grown, cudaHostAllocDefault));
  control_capacity_ = grown;
  return absl::OkStatus();
}

absl::Status NcclCommunicator::HostAllGather(int64_t value, absl::Span<int64_t> values) {
  DCP_RETURN_IF_ERROR(CheckUsable());
  DCP_CHECK_ARG(values.size() == size_t(world_size_),
                "HostAllGather: values has %d entries, not %d", values.size(), world_size_);
  if (control_ != nullptr) return control_->HostAllGather(value, values);
  // Over NCCL: [W] gathered values, then this rank's value, in device memory.
  constexpr const char* kWhat = "ncclAllGather(HostAllGather)";
  const size_t gathered = size_t(world_size_) * sizeof(int64_t);
  DCP_RETURN_IF_ERROR(ControlBytes(gathered + sizeof(int64_t)));  // before: fails this call only
  DCP_RETURN_IF_ERROR(Begin(kWhat));
  auto* device_values = static_cast<char*>(control_bytes_);
  auto* host = static_cast<char*>(control_host_);
  std::memcpy(host + gathered, &value, sizeof(value));
  DCP_NCCL_LOCAL_CUDA(cudaMemcpyAsync(device_values + gathered, host + gathered, sizeof(value),
                                      cudaMemcpyHostToDevice, stream_));
  DCP_RETURN_IF_ERROR(Enqueue(kWhat, [&](ncclComm_t comm) {
    return ncclAllGather(device_values + gathered, device_values, 1, ncclInt64, comm, stream_);
  }));
  DCP_NCCL_LOCAL_CUDA(
      cudaMemcpyAsync(host, device_values, gathered, cudaMemcpyDeviceToHost, stream_));
  DCP_RETURN_IF_ERROR(WaitOnHost(kWhat));
  std::memcpy(values.data(), host, gathered);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::HostBroadcast(void* data, size_t bytes, int root) {
  DCP_RETURN_IF_ERROR(CheckUsable());
  DCP_CHECK_ARG(root >= 0 && root < world_size_, "HostBroadcast: root %d outside [0, %d)", root,
                world_size_);
  if (control_ != nullptr) return control_->HostBroadcast(data, bytes, root);
  if (bytes == 0) return absl::OkStatus();
  constexpr const char* kWhat = "ncclBroadcast(HostBroadcast)";
  DCP_RETURN_IF_ERROR(ControlBytes(bytes));  // before the call begins: fails this call only
  DCP_RETURN_IF_ERROR(Begin(kWhat));
  if (rank_ == root) {
    std::memcpy(control_host_, data, bytes);
    DCP_NCCL_LOCAL_CUDA(
        cudaMemcpyAsync(control_bytes_, control_host_, bytes, cudaMemcpyHostToDevice, stream_));
  }
  DCP_RETURN_IF_ERROR(Enqueue(kWhat, [&](ncclComm_t comm) {
    return ncclBroadcast(control_bytes_, control_bytes_, bytes, ncclUint8, root, comm, stream_);
  }));
  DCP_NCCL_LOCAL_CUDA(
      cudaMemcpyAsync(control_host_, control_bytes_, bytes, cudaMemcpyDeviceToHost, stream_));
  DCP_RETURN_IF_ERROR(WaitOnHost(kWhat));
  std::memcpy(data, control_host_, bytes);
  return absl::OkStatus();
}

void NcclCommunicator::Abort(int exit_code) {
  // The processes end, and NCCL's state with them: no ncclCommAbort here, which would wait for
  // every CUDA graph holding this communicator's calls (or for an abort already under way).
  if (control_ != nullptr) control_->Abort(exit_code);
  std::fprintf(stderr,
               "[rank %d] NcclCommunicator::Abort(%d): no MPI communicator to end the group; "
               "ending this process (peers fail at their deadline)\n",
               rank_, exit_code);
  std::_Exit(exit_code);
}

}  // namespace dcp
