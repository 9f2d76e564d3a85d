#include "launch/bench/step_clock.h"

#include <chrono>
#include <vector>

#include "core/status.h"

namespace dcp::bench {
namespace {

class HostStepClock final : public StepClock {
 public:
  HostStepClock(Device& device, int num_slots) : device_(device), stamps_(num_slots) {}

  absl::Status Record(int slot) override {
    DCP_CHECK_ARG(slot >= 0 && slot < static_cast<int>(stamps_.size()),
                  "clock slot %d outside [0, %d)", slot, stamps_.size());
    DCP_RETURN_IF_ERROR(device_.Synchronize());
    stamps_[slot] = std::chrono::steady_clock::now();
    return absl::OkStatus();
  }

  absl::StatusOr<double> Elapsed(int from, int to) override {
    DCP_CHECK_ARG(from >= 0 && to >= 0 && from < static_cast<int>(stamps_.size()) &&
                      to < static_cast<int>(stamps_.size()),
                  "clock slots %d, %d outside [0, %d)", from, to, stamps_.size());
    return std::chrono::duration<double>(stamps_[to] - stamps_[from]).count();
  }

 private:
  Device& device_;
  std::vector<std::chrono::steady_clock::time_point> stamps_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StepClock>> MakeStepClock(Device& device, int num_slots) {
  DCP_CHECK_ARG(num_slots > 0, "a clock needs at least one slot");
#if DCP_WITH_CUDA
  if (device.memory_space() == MemorySpace::kDevice) return MakeCudaStepClock(device, num_slots);
#endif
  return std::unique_ptr<StepClock>(new HostStepClock(device, num_slots));
}

}  // namespace dcp::bench
