// PinnedStaging: host-to-device copies in stream order whose source may be reused as soon as
// the call returns, without waiting for the stream (Device::StageToDevice on CUDA ranks).
//
// Each copy first lands in a ring of page-locked host memory, then a cudaMemcpyAsync moves it
// from there; an event recorded after the copy guards its region of the ring. A later copy that
// needs the region waits for that event only (in steady state long since complete: the ring
// holds several steps' worth of metadata). A copy larger than the ring grows it: the copies
// still reading the old ring are waited for first, so growth happens once, at the first large
// step, never in the steady state (and the first ring waits for nothing).
//
// A batch (Device::BeginStagingBatch: a step's Plan) defers the device side: Append copies the
// source into the ring at once and records the destination; FlushBatch moves every appended
// array with one kernel that reads the ring directly (it is mapped into the device's address
// space; core/cuda/copy_segments.h) and guards all of the batch's regions with one event. One
// launch and one event a step instead of a cudaMemcpyAsync and an event an array (~3-5 us of
// host time each). A batch that would wrap onto its own unflushed regions, or outgrow the ring,
// is flushed early (its copies land sooner; still in stream order).
//
// Not thread-safe (one per device, like the device). Not for use during stream capture: the
// source would be captured as the ring's address and replayed from whatever it then holds.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dcp {

class PinnedStaging {
 public:
  // `initial_bytes` of ring (rounded up to 256); 0 allocates on first use.
  explicit PinnedStaging(size_t initial_bytes = size_t{1} << 20) : initial_(initial_bytes) {}
  ~PinnedStaging();
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  // Copies `bytes` from host `src` to device `dst` in `stream` order; `src` may be reused when
  // this returns. The calling thread's current device must be the stream's.
  absl::Status Copy(void* dst, const void* src, size_t bytes, cudaStream_t stream);

  // Batch mode: between BeginBatch and FlushBatch / DiscardBatch, Append defers the device
  // copy (the source may still be reused when Append returns). Outside a batch Append is Copy.
  // Nothing that reads a destination may be enqueued before the flush. DiscardBatch forgets
  // the copies still deferred (their destinations keep what they held; copies of the batch
  // that an early flush enqueued land).
  void BeginBatch();
  absl::Status Append(void* dst, const void* src, size_t bytes, cudaStream_t stream);
  absl::Status FlushBatch(cudaStream_t stream);
  void DiscardBatch();
  bool batching() const { return batching_; }
  // Copies appended and not yet flushed (for tests).
  size_t deferred() const { return batch_.size(); }

  size_t capacity() const { return capacity_; }
  // Copies whose region is still guarded by an event (for tests).
  size_t pending() const { return pending_.size(); }

 private:
  struct Region {
    size_t begin = 0, end = 0;
    cudaEvent_t done = nullptr;
    // A batch's regions share one event; only its last region returns it to the spares (they
    // all complete together, so Claim releases them in the same pass).
    bool owns_event = true;
  };
  struct Deferred {
    void* dst = nullptr;
    size_t begin = 0, bytes = 0;  // the source's place in the ring
  };
  absl::Status Grow(size_t bytes);
  // Waits for and releases every pending region that overlaps [begin, end); releases the
  // completed ones on the way.
  absl::Status Claim(size_t begin, size_t end);
  absl::Status TakeEvent(cudaEvent_t* event);
  // A ring region of `need` bytes at the head (wrapping), claimed: no copy in flight reads it.
  absl::StatusOr<size_t> Place(size_t need);
  void Release(const Region& region);

  size_t initial_;
  char* ring_ = nullptr;
  char* ring_device_ = nullptr;  // the ring in the device's address space (mapped)
  size_t capacity_ = 0;
  size_t head_ = 0;  // next free offset
  std::vector<Region> pending_;
  std::vector<cudaEvent_t> spare_events_;
  bool batching_ = false;
  std::vector<Deferred> batch_;  // appended, not yet flushed
};

}  // namespace dcp
