#include "runtime/cuda/pinned_staging.h"

#include <algorithm>
#include <cstring>

#include "core/cuda/copy_segments.h"
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
    if (r.owns_event) cudaEventDestroy(r.done);
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

void PinnedStaging::Release(const Region& region) {
  if (region.owns_event) spare_events_.push_back(region.done);
}

absl::Status PinnedStaging::Claim(size_t begin, size_t end) {
  size_t kept = 0;
  // A batch's regions sit next to each other and share one event: ask once for all of them.
  cudaEvent_t known_done = nullptr;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Region& r = pending_[i];
    const bool overlaps = r.begin < end && begin < r.end;
    bool done = false;
    if (r.done == known_done) {
      done = true;
    } else if (overlaps) {
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
      known_done = r.done;
      Release(r);
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
  ring_ = ring_device_ = nullptr;
  capacity_ = head_ = 0;
  void* ring = nullptr;
  DCP_CUDA_CHECK(cudaHostAlloc(&ring, capacity, cudaHostAllocMapped));
  ring_ = static_cast<char*>(ring);
  capacity_ = capacity;
  void* mapped = nullptr;
  DCP_CUDA_CHECK(cudaHostGetDevicePointer(&mapped, ring, 0));
  ring_device_ = static_cast<char*>(mapped);
  return absl::OkStatus();
}

absl::StatusOr<size_t> PinnedStaging::Place(size_t need) {
  if (need > capacity_) DCP_RETURN_IF_ERROR(Grow(need));
  size_t begin = head_;
  if (begin + need > capacity_) begin = 0;  // wrap: the tail is too short
  DCP_RETURN_IF_ERROR(Claim(begin, begin + need));
  head_ = begin + need;
  return begin;
}

absl::Status PinnedStaging::Copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return absl::OkStatus();
  DCP_CHECK_ARG(dst != nullptr && src != nullptr, "StageToDevice: null pointer");
  DCP_ASSIGN_OR_RETURN(const size_t begin, Place(RoundUp(bytes)));
  Region region{begin, begin + RoundUp(bytes), nullptr};
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
  return absl::OkStatus();
}

void PinnedStaging::BeginBatch() {
  batch_.clear();
  batching_ = true;
}

void PinnedStaging::DiscardBatch() {
  batch_.clear();  // nothing was enqueued: the regions are free again at once
  batching_ = false;
}

absl::Status PinnedStaging::Append(void* dst, const void* src, size_t bytes,
                                   cudaStream_t stream) {
  if (!batching_) return Copy(dst, src, bytes, stream);
  if (bytes == 0) return absl::OkStatus();
  DCP_CHECK_ARG(dst != nullptr && src != nullptr, "StageToDevice: null pointer");
  const size_t need = RoundUp(bytes);
  // Flush first where the new copy could collide with the batch: its ring region landing on
  // one of the batch's (they are not pending yet, so Claim cannot see them: a wrap, or a grow
  // that frees the ring), or its destination overlapping a deferred one (one launch copies its
  // segments in no order; a later copy to the same bytes must win, as outside a batch).
  auto lands_on_batch = [&] {
    if (need > capacity_) return true;
    const size_t begin = head_ + need > capacity_ ? 0 : head_;
    const auto* to = static_cast<const char*>(dst);
    for (const Deferred& d : batch_) {
      if (d.begin < begin + need && begin < d.begin + RoundUp(d.bytes)) return true;
      const auto* other = static_cast<const char*>(d.dst);
      if (other < to + bytes && to < other + d.bytes) return true;
    }
    return false;
  };
  if (!batch_.empty() && lands_on_batch()) {
    DCP_RETURN_IF_ERROR(FlushBatch(stream));
    batching_ = true;
  }
  DCP_ASSIGN_OR_RETURN(const size_t begin, Place(need));
  std::memcpy(ring_ + begin, src, bytes);
  batch_.push_back({dst, begin, bytes});
  return absl::OkStatus();
}

absl::Status PinnedStaging::FlushBatch(cudaStream_t stream) {
  batching_ = false;
  if (batch_.empty()) return absl::OkStatus();
  cudaEvent_t done = nullptr;
  absl::Status status = TakeEvent(&done);
  for (size_t first = 0; status.ok() && first < batch_.size();
       first += cuda::kMaxCopySegments) {
    cuda::CopySegments launch;
    for (size_t k = first; k < batch_.size() && launch.count < cuda::kMaxCopySegments; ++k) {
      launch.segment[launch.count++] = {batch_[k].dst, ring_device_ + batch_[k].begin,
                                        batch_[k].bytes};
    }
    status = cuda::LaunchCopySegments(launch, stream);
  }
  if (status.ok()) {
    status = CudaCodeToStatus(cudaEventRecord(done, stream), "cudaEventRecord", __FILE__,
                              __LINE__);
  }
  if (!status.ok()) {
    // A launch may have been enqueued and still read the ring: drain before reusing it.
    cudaStreamSynchronize(stream);
    if (done != nullptr) spare_events_.push_back(done);
    batch_.clear();
    return status;
  }
  for (size_t k = 0; k < batch_.size(); ++k) {
    pending_.push_back(
        {batch_[k].begin, batch_[k].begin + RoundUp(batch_[k].bytes), done, k + 1 == batch_.size()});
  }
  batch_.clear();
  return absl::OkStatus();
}

}  // namespace dcp
