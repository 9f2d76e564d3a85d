// Timing of one DcpEngine layer the way an engine runs it (launch/bench/engine_mode.cc): eager
// Runs back to back on a stream, and the same layer captured once in a CUDA graph and replayed.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dcp::bench {

struct LayerTimes {
  double plan_us = -1;  // DcpEngine::Plan of the step on the host (warm: a re-plan), per step
  double host_us = 0;   // time inside Run on the host (enqueue), per layer
  double eager_us = 0;  // wall time per layer, eager Runs back to back, device drained at the end
  double graph_us = -1; // wall time per layer, graph replays back to back; -1 where not run
  // Sum over the layer's graph nodes (kernels, copies, memsets) of each node's own GPU time,
  // each timed alone (GraphNodeTimes); -1 where the graph was not run. graph_us minus this is
  // the layer's overhead on the device: launch gaps and dependency waits.
  double kernel_sum_us = -1;
  int graph_nodes = 0;
  std::string kernel_sum_note;  // why kernel_sum_us is -1 when the graph ran
  // GPU busy time per layer (gpu_busy_trace.h: the union of the kernels', copies' and memsets'
  // intervals as they ran in sequence), from a traced repeat of the eager Runs and of the graph
  // replays; -1 where not traced. Layer time minus this is the time the GPU sat idle: the
  // host-side overhead.
  double eager_busy_us = -1;
  double graph_busy_us = -1;
  std::string busy_note;  // why a busy time is -1 where a trace was possible
  // DCP_BENCH_TIMELINE=1 (CUPTI builds): the last replayed layer's kernels, copies and memsets
  // as they ran (FormatTimeline: name, start and end from the layer's first start).
  std::string graph_timeline;
};

// `run(stream)` enqueues one layer on `stream`; `watch()` puts replayed work under the
// communicator's deadline; `release()` rebinds what `run` bound away from the stream before it
// is destroyed. CUDA builds make a stream of their own (nullptr on CPU ranks, which time eager
// Runs only). `graph` false, or a layer that cannot be captured (collectives that complete on
// the host), leaves graph_us at -1.
absl::StatusOr<LayerTimes> TimeLayer(bool on_gpu, bool graph, int warmup, int iters,
                                     const std::function<absl::Status(void* stream)>& run,
                                     const std::function<absl::Status()>& watch,
                                     const std::function<absl::Status()>& release);

}  // namespace dcp::bench
