#include "launch/bench/gpu_busy_trace.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

#include "core/status.h"

#if DCP_WITH_CUPTI
#include <cuda_runtime.h>
#include <cupti.h>

#include "core/cuda/cuda_status.h"
#endif

namespace dcp::bench {

#if DCP_WITH_CUPTI
namespace {

constexpr size_t kBufferBytes = 8 << 20;
constexpr size_t kAlign = 8;

// CUPTI hands records back on its own thread: the intervals are collected under a lock.
std::mutex intervals_mutex;
std::vector<std::pair<uint64_t, uint64_t>>* intervals = nullptr;
int dropped_records = 0;

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kAlign, kBufferBytes));
  *size = *buffer == nullptr ? 0 : kBufferBytes;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t stream_id, uint8_t* buffer, size_t,
                              size_t valid) {
  (void)stream_id;
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(intervals_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    uint64_t start = 0, end = 0;
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        start = kernel->start;
        end = kernel->end;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* copy = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        start = copy->start;
        end = copy->end;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* set = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        start = set->start;
        end = set->end;
        break;
      }
      default:
        continue;
    }
    if (intervals != nullptr && end > start) intervals->emplace_back(start, end);
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(nullptr, stream_id, &dropped) == CUPTI_SUCCESS) {
    dropped_records += static_cast<int>(dropped);
  }
  std::free(buffer);
}

absl::Status CuptiStatus(CUptiResult result, const char* what) {
  if (result == CUPTI_SUCCESS) return absl::OkStatus();
  const char* text = nullptr;
  cuptiGetResultString(result, &text);
  return DCP_ERROR(Internal, what, ": ", text == nullptr ? "unknown CUPTI error" : text);
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

}  // namespace

bool GpuBusyTraceAvailable() {
  const char* off = std::getenv("DCP_BENCH_NO_CUPTI");  // to compare timings without CUPTI loaded
  return off == nullptr || off[0] == '\0' || off[0] == '0';
}

absl::StatusOr<GpuBusy> TraceGpuBusy(const std::function<absl::Status()>& body) {
  std::vector<std::pair<uint64_t, uint64_t>> seen;
  {
    std::lock_guard<std::mutex> lock(intervals_mutex);
    intervals = &seen;
    dropped_records = 0;
  }
  DCP_CUDA_CHECK(cudaDeviceSynchronize());
  absl::Status status =
      CuptiStatus(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted),
                  "cuptiActivityRegisterCallbacks");
  for (CUpti_ActivityKind kind : kKinds) {
    if (status.ok()) status = CuptiStatus(cuptiActivityEnable(kind), "cuptiActivityEnable");
  }
  if (status.ok()) status = body();
  if (status.ok()) {
    status = CudaCodeToStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize", __FILE__, __LINE__);
  }
  for (CUpti_ActivityKind kind : kKinds) cuptiActivityDisable(kind);
  const absl::Status flushed =
      CuptiStatus(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  if (status.ok()) status = flushed;
  int dropped = 0;
  {
    std::lock_guard<std::mutex> lock(intervals_mutex);
    intervals = nullptr;
    dropped = dropped_records;
  }
  DCP_RETURN_IF_ERROR(status);
  if (dropped > 0) return DCP_ERROR(Internal, "CUPTI dropped ", dropped, " activity records");

  GpuBusy busy;
  busy.records = static_cast<int>(seen.size());
  if (seen.empty()) return busy;
  std::sort(seen.begin(), seen.end());
  uint64_t total = 0, open_start = seen[0].first, open_end = seen[0].second;
  for (size_t i = 1; i < seen.size(); ++i) {
    if (seen[i].first > open_end) {
      total += open_end - open_start;
      open_start = seen[i].first;
    }
    open_end = std::max(open_end, seen[i].second);
  }
  total += open_end - open_start;
  busy.busy_us = static_cast<double>(total) * 1e-3;
  busy.span_us = static_cast<double>(open_end - seen[0].first) * 1e-3;
  return busy;
}

#else

bool GpuBusyTraceAvailable() { return false; }

absl::StatusOr<GpuBusy> TraceGpuBusy(const std::function<absl::Status()>&) {
  return DCP_ERROR(Unimplemented, "this build has no CUPTI (GPU busy time not traced)");
}

#endif

}  // namespace dcp::bench
