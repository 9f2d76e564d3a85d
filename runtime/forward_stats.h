// What the last Forward did and how long each phase took, and the clock that times phases.
#pragma once

#include <chrono>
#include <cstdint>

#include "absl/status/status.h"
#include "runtime/batch.h"
#include "runtime/device.h"

namespace dcp {

// Wall time of each phase of the last Forward, seconds, and the bytes each collective moved.
struct ForwardStats {
  Route route = Route::kSparseMqa;
  int num_decodes = 0, num_prefills = 0, num_chunks = 0;
  int64_t num_tokens = 0, num_context_rows = 0;
  double plan_s = 0, cache_write_s = 0, gather_s = 0, up_projection_s = 0, attention_s = 0,
         combine_s = 0, total_s = 0;
  // Time inside the collectives alone (within gather_s / combine_s), and the bytes they moved
  // through this rank (sent + received): the all-gathers of q' and of the workspace, and the
  // combine's all-gather/reduce-scatter or all-to-alls.
  double all_gather_comm_s = 0, combine_comm_s = 0;
  int64_t all_gather_bytes = 0, combine_bytes = 0;
  double flops = 0;  // attention + projection FLOPs of this rank
};

// Times one phase on the host: Stop() waits for the device's queued work, so the time includes
// the phase's kernels (the cost of a device synchronisation per phase boundary). Stats are
// opt-in: with `stats` null, EndPhase neither waits nor records.
class PhaseTimer {
 public:
  using Clock = std::chrono::steady_clock;
  PhaseTimer() : start_(Clock::now()) {}
  void Restart() { start_ = Clock::now(); }
  double Elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  // Synchronizes `device` and adds the elapsed seconds to *total.
  absl::Status Stop(Device& device, double* total) const {
    absl::Status status = device.Synchronize();
    *total += Elapsed();
    return status;
  }

 private:
  Clock::time_point start_;
};

// Ends a phase begun at `timer`: with stats on, waits for the device and adds the phase's
// seconds to stats->*phase; with stats null, does nothing.
inline absl::Status EndPhase(Device& device, ForwardStats* stats, const PhaseTimer& timer,
                             double ForwardStats::*phase) {
  return stats == nullptr ? absl::OkStatus() : timer.Stop(device, &(stats->*phase));
}

}  // namespace dcp
