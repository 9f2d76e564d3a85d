#include "launch/bench/engine_timing.h"

#include <chrono>

#include "absl/cleanup/cleanup.h"
#include "core/environment.h"
#include "core/status.h"

#if DCP_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/cuda_status.h"
#include "launch/bench/gpu_busy_trace.h"
#include "launch/bench/graph_node_times.h"
#endif

namespace dcp::bench {
namespace {

using Clock = std::chrono::steady_clock;

// DCP_BENCH_TIMELINE=1: keep the replayed layers' activity records (LayerTimes::graph_timeline).
[[maybe_unused]] bool TimelineWanted() { return EnvSwitch("DCP_BENCH_TIMELINE", false); }
double Since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

}  // namespace

// graph_on, watch and release serve the GPU path only (unused in builds without CUDA).
absl::StatusOr<LayerTimes> TimeLayer(
    bool on_gpu, [[maybe_unused]] bool graph_on, int warmup, int iters,
    const std::function<absl::Status(void* stream)>& run,
    [[maybe_unused]] const std::function<absl::Status()>& watch,
    [[maybe_unused]] const std::function<absl::Status()>& release) {
  LayerTimes times;
  iters = iters < 1 ? 1 : iters;
  if (!on_gpu) {
    for (int i = 0; i < warmup; ++i) DCP_RETURN_IF_ERROR(run(nullptr));
    const auto start = Clock::now();
    for (int i = 0; i < iters; ++i) DCP_RETURN_IF_ERROR(run(nullptr));
    times.eager_us = times.host_us = Since(start) / iters;
    return times;
  }
#if DCP_WITH_CUDA
  cudaStream_t stream = nullptr;
  DCP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto timed = [&]() -> absl::Status {
    for (int i = 0; i < warmup + 1; ++i) DCP_RETURN_IF_ERROR(run(stream));
    DCP_CUDA_CHECK(cudaStreamSynchronize(stream));
    double host = 0;
    auto start = Clock::now();
    for (int i = 0; i < iters; ++i) {
      const auto call = Clock::now();
      DCP_RETURN_IF_ERROR(run(stream));
      host += Since(call);
    }
    DCP_CUDA_CHECK(cudaStreamSynchronize(stream));
    times.eager_us = Since(start) / iters;
    times.host_us = host / iters;
    // The busy time comes from a traced repeat: tracing slows the launches down, so the layer
    // time above stays the untraced one.
    auto note_busy = [&](const absl::StatusOr<GpuBusy>& busy, double* busy_us) {
      if (busy.ok()) {
        *busy_us = busy->busy_us / iters;
      } else if (times.busy_note.empty()) {
        times.busy_note = std::string(busy.status().message());
      }
    };
    if (GpuBusyTraceAvailable()) {
      note_busy(TraceGpuBusy([&]() -> absl::Status {
                  for (int i = 0; i < iters; ++i) DCP_RETURN_IF_ERROR(run(stream));
                  DCP_CUDA_CHECK(cudaStreamSynchronize(stream));
                  return absl::OkStatus();
                }),
                &times.eager_busy_us);
    }
    if (!graph_on) return absl::OkStatus();

    cudaGraph_t graph = nullptr;
    DCP_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const absl::Status captured = run(stream);
    DCP_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    DCP_RETURN_IF_ERROR(captured);
    absl::StatusOr<GraphNodeTimes> nodes = TimeGraphNodes(graph, stream, iters);
    cudaGraphExec_t exec = nullptr;
    const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    DCP_CUDA_CHECK(instantiated);
    // Destroyed on every return: NCCL's abort after a failed replay waits for the graphs that
    // hold its communicator's calls.
    absl::Cleanup destroy_exec = [exec] { cudaGraphExecDestroy(exec); };
    if (nodes.ok()) {
      times.kernel_sum_us = nodes->sum_us;
      times.graph_nodes = nodes->nodes;
    } else {
      // Some graphs cannot be taken apart (cudaGraphClone refuses graphs with nodes cuDNN
      // adds): the row keeps its layer times and leaves the kernel sum out.
      times.kernel_sum_note = std::string(nodes.status().message());
    }
    for (int i = 0; i < warmup + 1; ++i) DCP_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    DCP_CUDA_CHECK(cudaStreamSynchronize(stream));
    start = Clock::now();
    for (int i = 0; i < iters; ++i) DCP_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    DCP_RETURN_IF_ERROR(watch());
    DCP_CUDA_CHECK(cudaStreamSynchronize(stream));
    times.graph_us = Since(start) / iters;
    if (GpuBusyTraceAvailable()) {
      const bool timeline = TimelineWanted();
      absl::StatusOr<GpuBusy> busy = TraceGpuBusy(
          [&]() -> absl::Status {
            for (int i = 0; i < iters; ++i) DCP_CUDA_CHECK(cudaGraphLaunch(exec, stream));
            DCP_RETURN_IF_ERROR(watch());
            DCP_CUDA_CHECK(cudaStreamSynchronize(stream));
            return absl::OkStatus();
          },
          timeline);
      if (busy.ok() && timeline && busy->records % iters == 0) {
        times.graph_timeline = FormatTimeline(*busy, busy->records / iters);
      }
      note_busy(busy, &times.graph_busy_us);
    }
    return absl::OkStatus();
  };
  absl::Status status = timed();
  cudaStreamSynchronize(stream);
  const absl::Status released = release();
  if (status.ok()) status = released;
  cudaStreamDestroy(stream);
  DCP_RETURN_IF_ERROR(status);
  return times;
#else
  return DCP_ERROR(Unimplemented, "a GPU device in a build without CUDA");
#endif
}

}  // namespace dcp::bench
