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
// Not thread-safe (one per device, like the device). Not for use during stream capture: the
// source would be captured as the ring's address and replayed from whatever it then holds.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "absl/status/status.h"

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

  size_t capacity() const { return capacity_; }
  // Copies whose region is still guarded by an event (for tests).
  size_t pending() const { return pending_.size(); }

 private:
  struct Region {
    size_t begin = 0, end = 0;
    cudaEvent_t done = nullptr;
  };
  absl::Status Grow(size_t bytes);
  // Waits for and releases every pending region that overlaps [begin, end); releases the
  // completed ones on the way.
  absl::Status Claim(size_t begin, size_t end);
  absl::Status TakeEvent(cudaEvent_t* event);

  size_t initial_;
  char* ring_ = nullptr;
  size_t capacity_ = 0;
  size_t head_ = 0;  // next free offset
  std::vector<Region> pending_;
  std::vector<cudaEvent_t> spare_events_;
};

}  // namespace dcp
