// The GPU time of each node of a captured CUDA graph, each node timed on its own: the
// "sum of the kernel times" that a layer's time is compared against (issue: the host-side and
// launch overhead of a layer = layer time - sum of its kernels). CUDA builds only.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/statusor.h"

namespace dcp::bench {

struct GraphNodeTimes {
  double sum_us = 0;  // sum over timed nodes of the per-node GPU time
  int nodes = 0;      // nodes timed (kernels, copies, memsets)
  int skipped = 0;    // nodes of other types (empty, event, host): not timed, not summed
};

// For each timed node of `graph`: a graph of `repeats` copies of that node alone, chained, is
// replayed on `stream` between two events; the node's time is the elapsed time / repeats (so
// the launch of the timing graph is amortised and back-to-back copies of one node measure the
// node, not the launch). `graph` is not modified. The node's inputs are whatever the captured
// buffers hold; the nodes run again, so they must be safe to repeat (a layer's are: every
// node rewrites its outputs from its inputs). A graph the runtime cannot clone (cuDNN's nodes)
// is an error, and the thread's last CUDA error is cleared before it returns.
absl::StatusOr<GraphNodeTimes> TimeGraphNodes(cudaGraph_t graph, cudaStream_t stream,
                                              int repeats);

}  // namespace dcp::bench
