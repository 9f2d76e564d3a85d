// The CUDA half of step_clock.h: one cudaEvent per slot, recorded on the device's stream.
#include <cuda_runtime.h>

#include <vector>

#include "launch/bench/step_clock.h"
#include "runtime/cuda/cuda_device.h"
#include "core/cuda/cuda_status.h"

namespace dcp::bench {
namespace {

class CudaStepClock final : public StepClock {
 public:
  CudaStepClock(cudaStream_t stream, std::vector<cudaEvent_t> events)
      : stream_(stream), events_(std::move(events)) {}
  ~CudaStepClock() override {
    for (cudaEvent_t event : events_) cudaEventDestroy(event);
  }

  absl::Status Record(int slot) override {
    DCP_CHECK_ARG(slot >= 0 && slot < static_cast<int>(events_.size()),
                  "clock slot %d outside [0, %d)", slot, events_.size());
    DCP_CUDA_CHECK(cudaEventRecord(events_[slot], stream_));
    return absl::OkStatus();
  }

  absl::StatusOr<double> Elapsed(int from, int to) override {
    DCP_CHECK_ARG(from >= 0 && to >= 0 && from < static_cast<int>(events_.size()) &&
                      to < static_cast<int>(events_.size()),
                  "clock slots %d, %d outside [0, %d)", from, to, events_.size());
    DCP_CUDA_CHECK(cudaEventSynchronize(events_[to]));
    float milliseconds = 0;
    DCP_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, events_[from], events_[to]));
    return milliseconds * 1e-3;
  }

 private:
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StepClock>> MakeCudaStepClock(Device& device, int num_slots) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  DCP_CHECK_ARG(cuda != nullptr, "device %s is not a CUDA device", device.name());
  std::vector<cudaEvent_t> events;
  events.reserve(num_slots);
  for (int i = 0; i < num_slots; ++i) {
    cudaEvent_t event = nullptr;
    const absl::Status status =
        CudaCodeToStatus(cudaEventCreate(&event), "cudaEventCreate", __FILE__, __LINE__);
    if (!status.ok()) {
      for (cudaEvent_t created : events) cudaEventDestroy(created);
      return status;
    }
    events.push_back(event);
  }
  return std::unique_ptr<StepClock>(new CudaStepClock(cuda->stream(), std::move(events)));
}

}  // namespace dcp::bench
