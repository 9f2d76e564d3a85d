// Several device copies in one launch: a step's metadata (Plan's arrays, a few bytes to a few
// hundred KiB each) is staged in one region of page-locked host memory and this kernel moves
// every array to its own device buffer, reading the host memory directly (it is mapped into the
// device's address space): one launch where one cudaMemcpyAsync per array cost the host ~3-5 us
// each (runtime/cuda/pinned_staging.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace dcp::cuda {

struct CopySegment {
  void* dst = nullptr;        // [bytes] device memory
  const void* src = nullptr;  // [bytes] device-accessible (device or mapped host memory)
  uint64_t bytes = 0;
};

// What one launch carries (by value, in its parameters: no table to fetch first).
inline constexpr int kMaxCopySegments = 32;

struct CopySegments {
  CopySegment segment[kMaxCopySegments];
  int count = 0;
};

// Enqueues every copy of `segments` on `stream` (a plain launch, not a programmatic dependent:
// later work waits for all of it). 16-byte units where a segment's dst, src and size allow it,
// bytes otherwise. Segments must not overlap one another (they are copied in no order).
// count 0: nothing to do; count outside [0, kMaxCopySegments] or a null pointer with bytes > 0:
// InvalidArgument.
absl::Status LaunchCopySegments(const CopySegments& segments, cudaStream_t stream);

}  // namespace dcp::cuda
