// The GPU's busy time while a piece of work runs, from CUPTI's activity records: the union of
// the [start, end) intervals of every kernel, copy and memset the device ran. A layer's time
// minus this is the time the GPU sat idle inside the layer: launch gaps, host work the device
// waited for, dependency waits - the "host-side overhead" of issue 11, measured on the work as
// it ran in sequence (caches, overlap of programmatic launches and all), not node by node.
// CUDA builds with CUPTI only (DCP_WITH_CUPTI); tracing adds host cost per launch, so time
// the layer in an untraced run and take only the busy time from the traced one.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dcp::bench {

// One activity record: a kernel (its name, demangled, without template arguments or
// parameters), a copy ("memcpy") or a memset ("memset"); times in ns on the GPU's clock.
struct GpuActivity {
  std::string name;
  uint64_t start_ns = 0, end_ns = 0;
};

struct GpuBusy {
  double busy_us = 0;  // union of the activity intervals
  double span_us = 0;  // first start to last end
  int records = 0;     // kernels, copies and memsets seen
  std::vector<GpuActivity> activities;  // sorted by start; kept only when asked for
};

// Whether this build can trace (CUPTI found at configure time) and DCP_BENCH_NO_CUPTI=1 is not set.
bool GpuBusyTraceAvailable();

// Runs `body` with kernel, memcpy and memset activity recording on, drains the device, and
// returns what the device ran meanwhile. `body` must leave the device idle on return (it syncs
// its streams). One trace at a time per process. `keep_activities`: GpuBusy::activities holds
// every record (the timeline of what ran).
absl::StatusOr<GpuBusy> TraceGpuBusy(const std::function<absl::Status()>& body,
                                     bool keep_activities = false);

// The last `count` activities of `busy` (a timeline of the last piece of work, e.g. one layer
// of a repeat) as text: per record its name, start and end in us from the first one's start,
// and its duration; one line each.
std::string FormatTimeline(const GpuBusy& busy, int count);

}  // namespace dcp::bench
