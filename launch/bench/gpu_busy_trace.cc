#include "launch/bench/gpu_busy_trace.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/environment.h"
#include "core/status.h"

#if DCP_WITH_CUPTI
#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>

#include "core/cuda/cuda_status.h"
#endif

namespace dcp::bench {

#if DCP_WITH_CUPTI
namespace {

constexpr size_t kBufferBytes = 8 << 20;
constexpr size_t kAlign = 8;

// CUPTI hands records back on its own thread: the intervals are collected under a lock.
std::mutex intervals_mutex;
std::vector<GpuActivity>* intervals = nullptr;
bool keep_names = false;
int dropped_records = 0;

// "dcp::cuda::Kernel<576, 512>(Args)" -> "Kernel" (the mangled name where it does not demangle).
std::string ShortKernelName(const char* mangled) {
  if (mangled == nullptr) return "kernel";
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled != nullptr ? demangled : mangled;
  std::free(demangled);
  for (const std::string anonymous = "(anonymous namespace)::";;) {
    const size_t at = name.find(anonymous);
    if (at == std::string::npos) break;
    name.erase(at, anonymous.size());
  }
  name = name.substr(0, std::min(name.find('('), name.find('<')));
  const size_t scope = name.rfind("::");
  if (scope != std::string::npos) name = name.substr(scope + 2);
  const size_t space = name.rfind(' ');  // a return type ("void ")
  if (space != std::string::npos) name = name.substr(space + 1);
  return name;
}

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
    const char* name = nullptr;
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        start = kernel->start;
        end = kernel->end;
        name = kernel->name;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* copy = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        start = copy->start;
        end = copy->end;
        name = "memcpy";
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* set = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        start = set->start;
        end = set->end;
        name = "memset";
        break;
      }
      default:
        continue;
    }
    if (intervals != nullptr && end > start) {
      GpuActivity activity;
      activity.start_ns = start;
      activity.end_ns = end;
      if (keep_names) {
        activity.name = record->kind == CUPTI_ACTIVITY_KIND_MEMCPY ||
                                record->kind == CUPTI_ACTIVITY_KIND_MEMSET
                            ? std::string(name)
                            : ShortKernelName(name);
      }
      intervals->push_back(std::move(activity));
    }
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
  // DCP_BENCH_NO_CUPTI=1: to compare timings without CUPTI loaded.
  return !EnvSwitch("DCP_BENCH_NO_CUPTI", false);
}

absl::StatusOr<GpuBusy> TraceGpuBusy(const std::function<absl::Status()>& body,
                                     bool keep_activities) {
  std::vector<GpuActivity> seen;
  {
    std::lock_guard<std::mutex> lock(intervals_mutex);
    intervals = &seen;
    keep_names = keep_activities;
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
  std::sort(seen.begin(), seen.end(), [](const GpuActivity& a, const GpuActivity& b) {
    return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.end_ns < b.end_ns;
  });
  uint64_t total = 0, open_start = seen[0].start_ns, open_end = seen[0].end_ns;
  for (size_t i = 1; i < seen.size(); ++i) {
    if (seen[i].start_ns > open_end) {
      total += open_end - open_start;
      open_start = seen[i].start_ns;
    }
    open_end = std::max(open_end, seen[i].end_ns);
  }
  total += open_end - open_start;
  busy.busy_us = static_cast<double>(total) * 1e-3;
  busy.span_us = static_cast<double>(open_end - seen[0].start_ns) * 1e-3;
  if (keep_activities) busy.activities = std::move(seen);
  return busy;
}

#else

bool GpuBusyTraceAvailable() { return false; }

absl::StatusOr<GpuBusy> TraceGpuBusy(const std::function<absl::Status()>&, bool) {
  return DCP_ERROR(Unimplemented, "this build has no CUPTI (GPU busy time not traced)");
}

#endif

std::string FormatTimeline(const GpuBusy& busy, int count) {
  const std::vector<GpuActivity>& all = busy.activities;
  const size_t first = all.size() > size_t(count) ? all.size() - size_t(count) : 0;
  std::string text;
  if (first >= all.size()) return text;
  const uint64_t origin = all[first].start_ns;
  char line[256];
  for (size_t i = first; i < all.size(); ++i) {
    const GpuActivity& a = all[i];
    std::snprintf(line, sizeof(line), "  %-36s start %7.2f  end %7.2f  (%6.2f us)\n",
                  a.name.c_str(), (a.start_ns - origin) * 1e-3, (a.end_ns - origin) * 1e-3,
                  (a.end_ns - a.start_ns) * 1e-3);
    text += line;
  }
  return text;
}

}  // namespace dcp::bench
