#include "runtime/cuda/pinned_staging.h"

#include <algorithm>
#include <cstring>

#include "core/cuda/cuda_status.h"
#include "core/status.h"

namespace dcp {
namespace {

constexpr size_t kAlign = 256;
size_t RoundUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

PinnedStaging::~PinnedStaging() {
  for (const Region& r : pending_) {
    cudaEventSynchronize(r.done);
    cudaEventDestroy(r.done);
  }
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  if (ring_ != nullptr) cudaFreeHost(ring_);
}

absl::Status PinnedStaging::TakeEvent(cudaEvent_t* event) {
  if (!spare_events_.empty()) {
    *event = spare_events_.back();
    spare_events_.pop_back();
    return absl::OkStatus();
  }
  DCP_CUDA_CHECK(cudaEventCreateWithFlags(event, cudaEventDisableTiming));
  return absl::OkStatus();
}

absl::Status PinnedStaging::Claim(size_t begin, size_t end) {
  size_t kept = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Region& r = pending_[i];
    const bool overlaps = r.begin < end && begin < r.end;
    bool done = false;
    if (overlaps) {
      DCP_CUDA_CHECK(cudaEventSynchronize(r.done));
      done = true;
    } else {
      const cudaError_t query = cudaEventQuery(r.done);
      if (query == cudaSuccess) {
        done = true;
      } else if (query != cudaErrorNotReady) {
        DCP_CUDA_CHECK(query);
      }
    }
    if (done) {
      spare_events_.push_back(r.done);
    } else {
      pending_[kept++] = r;
    }
  }
  pending_.resize(kept);
  return absl::OkStatus();
}

absl::Status PinnedStaging::Grow(size_t bytes) {
  size_t capacity = std::max(RoundUp(initial_), kAlign);
  while (capacity < bytes) capacity *= 2;
  // The old ring may still be the source of enqueued copies: wait for exactly those (their
  // events), not for the stream, which may hold unrelated work (the first ring waits for none).
  DCP_RETURN_IF_ERROR(Claim(0, capacity_));
  if (!pending_.empty()) {
    return DCP_ERROR(Internal, "PinnedStaging: %d copies still pending after a drain",
                     pending_.size());
  }
  if (ring_ != nullptr) DCP_CUDA_CHECK(cudaFreeHost(ring_));
  ring_ = nullptr;
  capacity_ = head_ = 0;
  void* ring = nullptr;
  DCP_CUDA_CHECK(cudaMallocHost(&ring, capacity));
  ring_ = static_cast<char*>(ring);
  capacity_ = capacity;
  return absl::OkStatus();
}

absl::Status PinnedStaging::Copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return absl::OkStatus();
  DCP_CHECK_ARG(dst != nullptr && src != nullptr, "StageToDevice: null pointer");
  const size_t need = RoundUp(bytes);
  if (need > capacity_) DCP_RETURN_IF_ERROR(Grow(need));
  size_t begin = head_;
  if (begin + need > capacity_) begin = 0;  // wrap: the tail is too short
  DCP_RETURN_IF_ERROR(Claim(begin, begin + need));
  Region region{begin, begin + need, nullptr};
  DCP_RETURN_IF_ERROR(TakeEvent(&region.done));
  std::memcpy(ring_ + begin, src, bytes);
  absl::Status copied = CudaCodeToStatus(
      cudaMemcpyAsync(dst, ring_ + begin, bytes, cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync (staged upload)", __FILE__, __LINE__);
  if (copied.ok()) {
    copied = CudaCodeToStatus(cudaEventRecord(region.done, stream), "cudaEventRecord", __FILE__,
                              __LINE__);
  }
  if (!copied.ok()) {
    // The region may still be read by a copy that was enqueued: drain before reusing it.
    cudaStreamSynchronize(stream);
    spare_events_.push_back(region.done);
    return copied;
  }
  pending_.push_back(region);
  head_ = begin + need;
  return absl::OkStatus();
}

}  // namespace dcp
