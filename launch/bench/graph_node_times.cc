#include "launch/bench/graph_node_times.h"

#include <algorithm>
#include <vector>

#include "core/cuda/cuda_status.h"
#include "core/status.h"

namespace dcp::bench {
namespace {

bool Timed(cudaGraphNodeType type) {
  return type == cudaGraphNodeTypeKernel || type == cudaGraphNodeTypeMemcpy ||
         type == cudaGraphNodeTypeMemset;
}

// Owns the CUDA objects of one node's timing; destroys them on every path.
struct NodeTiming {
  cudaGraph_t alone = nullptr, chain = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  ~NodeTiming() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (chain != nullptr) cudaGraphDestroy(chain);
    if (alone != nullptr) cudaGraphDestroy(alone);
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
  }
};

// GPU time of node `index` of `graph`, alone, in microseconds.
absl::StatusOr<double> TimeNode(cudaGraph_t graph, size_t index, cudaStream_t stream,
                                int repeats) {
  NodeTiming t;
  // A clone of the graph with every other node removed (removing a node drops its edges).
  DCP_CUDA_CHECK(cudaGraphClone(&t.alone, graph));
  size_t count = 0;
  DCP_CUDA_CHECK(cudaGraphGetNodes(t.alone, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  DCP_CUDA_CHECK(cudaGraphGetNodes(t.alone, nodes.data(), &count));
  for (size_t i = 0; i < count; ++i) {
    if (i != index) DCP_CUDA_CHECK(cudaGraphDestroyNode(nodes[i]));
  }
  // `repeats` child-graph copies of it in a chain.
  DCP_CUDA_CHECK(cudaGraphCreate(&t.chain, 0));
  cudaGraphNode_t previous = nullptr;
  for (int r = 0; r < repeats; ++r) {
    cudaGraphNode_t child = nullptr;
    DCP_CUDA_CHECK(cudaGraphAddChildGraphNode(&child, t.chain, previous == nullptr ? nullptr
                                                                                   : &previous,
                                              previous == nullptr ? 0 : 1, t.alone));
    previous = child;
  }
  DCP_CUDA_CHECK(cudaGraphInstantiate(&t.exec, t.chain, 0));
  DCP_CUDA_CHECK(cudaEventCreate(&t.start));
  DCP_CUDA_CHECK(cudaEventCreate(&t.stop));
  DCP_CUDA_CHECK(cudaGraphLaunch(t.exec, stream));  // warm-up
  DCP_CUDA_CHECK(cudaEventRecord(t.start, stream));
  DCP_CUDA_CHECK(cudaGraphLaunch(t.exec, stream));
  DCP_CUDA_CHECK(cudaEventRecord(t.stop, stream));
  DCP_CUDA_CHECK(cudaEventSynchronize(t.stop));
  float ms = 0;
  DCP_CUDA_CHECK(cudaEventElapsedTime(&ms, t.start, t.stop));
  return 1000.0 * ms / repeats;
}

absl::StatusOr<GraphNodeTimes> TimeEachNode(cudaGraph_t graph, cudaStream_t stream,
                                            int repeats) {
  repeats = std::clamp(repeats, 1, 100);
  size_t count = 0;
  DCP_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  DCP_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  GraphNodeTimes times;
  for (size_t i = 0; i < count; ++i) {
    cudaGraphNodeType type;
    DCP_CUDA_CHECK(cudaGraphNodeGetType(nodes[i], &type));
    if (!Timed(type)) {
      ++times.skipped;
      continue;
    }
    DCP_ASSIGN_OR_RETURN(const double us, TimeNode(graph, i, stream, repeats));
    times.sum_us += us;
    ++times.nodes;
  }
  return times;
}

}  // namespace

absl::StatusOr<GraphNodeTimes> TimeGraphNodes(cudaGraph_t graph, cudaStream_t stream,
                                              int repeats) {
  absl::StatusOr<GraphNodeTimes> times = TimeEachNode(graph, stream, repeats);
  // A refused call (cudaGraphClone of a graph holding cuDNN's nodes: cudaErrorNotSupported)
  // also sets the thread's last error, which the next kernel launch's check would report as
  // its own failure: clear it here, where it is reported.
  if (!times.ok()) cudaGetLastError();
  return times;
}

}  // namespace dcp::bench
