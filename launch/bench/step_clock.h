// Timestamps on a device's timeline, so that one iteration of a benchmark can be cut into
// steps (gather | all-gather | reorganize) without a host round trip between them.
//   CPU:  Record() synchronizes the device, then reads std::chrono::steady_clock.
//   CUDA: Record() enqueues a cudaEvent on the device's stream (CudaDevice::stream()), so the
//         steps are timed in stream order with the events' ~0.5 us resolution; Elapsed()
//         waits for the later event.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/device.h"

namespace dcp::bench {

class StepClock {
 public:
  virtual ~StepClock() = default;
  // Marks slot `slot` (in [0, num_slots)) at the current point of the device's work.
  virtual absl::Status Record(int slot) = 0;
  // Seconds from slot `from` to slot `to`, both recorded; waits for them to complete.
  virtual absl::StatusOr<double> Elapsed(int from, int to) = 0;
};

// num_slots: how many timestamps one run of the clock holds (iterations x (steps + 1)).
absl::StatusOr<std::unique_ptr<StepClock>> MakeStepClock(Device& device, int num_slots);

#if DCP_WITH_CUDA
// step_clock_cuda.cc: the event clock; null device when `device` is not a CudaDevice.
absl::StatusOr<std::unique_ptr<StepClock>> MakeCudaStepClock(Device& device, int num_slots);
#endif

}  // namespace dcp::bench
