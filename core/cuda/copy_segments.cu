#include "core/cuda/copy_segments.h"

#include <algorithm>
#include <cstdint>

#include "core/cuda/cuda_status.h"
#include "core/status.h"

namespace dcp::cuda {
namespace {

constexpr int kThreads = 256;
// Bytes a block moves: one 16-byte unit a thread, twice. Reads of mapped host memory take a bus
// round trip each, so a large segment is cut into many blocks that all have loads in flight.
constexpr uint64_t kSliceBytes = 2 * kThreads * 16;

// The grid's y dimension holds at most this many slices; a larger segment's blocks take every
// kMaxSlicesY-th slice (a step's largest array, a causal top-k of tens of thousands of prefill
// tokens, can pass the 512 MiB that one slice a block would allow).
constexpr uint64_t kMaxSlicesY = 65535;

// Thread mapping: blockIdx.x is the segment, blockIdx.y its first slice of kSliceBytes (then
// every gridDim.y-th); consecutive threads on consecutive 16-byte units (or bytes) of a slice.
__global__ void __launch_bounds__(kThreads) CopySegmentsKernel(const CopySegments segments) {
  const CopySegment s = segments.segment[blockIdx.x];
  auto* dst = static_cast<unsigned char*>(s.dst);
  const auto* src = static_cast<const unsigned char*>(s.src);
  const bool vector = reinterpret_cast<uintptr_t>(dst) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(src) % 16 == 0;
  for (uint64_t begin = uint64_t(blockIdx.y) * kSliceBytes; begin < s.bytes;
       begin += uint64_t(gridDim.y) * kSliceBytes) {
    const uint64_t end = std::min(s.bytes, begin + kSliceBytes);
    uint64_t i = begin;
    if (vector) {  // the slice's whole units (begin is a multiple of 16)
      const uint64_t units_end = begin + (end - begin) / 16 * 16;
      for (uint64_t u = begin + 16 * threadIdx.x; u < units_end; u += 16 * kThreads) {
        *reinterpret_cast<uint4*>(dst + u) = *reinterpret_cast<const uint4*>(src + u);
      }
      i = units_end;
    }
    for (uint64_t b = i + threadIdx.x; b < end; b += kThreads) dst[b] = src[b];
  }
}

}  // namespace

absl::Status LaunchCopySegments(const CopySegments& segments, cudaStream_t stream) {
  DCP_CHECK_ARG(segments.count >= 0 && segments.count <= kMaxCopySegments,
                "CopySegments: %d segments, at most %d a launch", segments.count,
                kMaxCopySegments);
  uint64_t most = 0;
  for (int k = 0; k < segments.count; ++k) {
    const CopySegment& s = segments.segment[k];
    DCP_CHECK_ARG(s.bytes == 0 || (s.dst != nullptr && s.src != nullptr),
                  "CopySegments: segment %d of %d bytes has a null pointer", k, s.bytes);
    most = std::max(most, s.bytes);
  }
  if (most == 0) return absl::OkStatus();
  const uint64_t slices = std::min((most + kSliceBytes - 1) / kSliceBytes, kMaxSlicesY);
  CopySegmentsKernel<<<dim3(segments.count, static_cast<unsigned>(slices)), kThreads, 0,
                       stream>>>(segments);
  DCP_CUDA_LAUNCH_CHECK("CopySegmentsKernel");
  return absl::OkStatus();
}

}  // namespace dcp::cuda
