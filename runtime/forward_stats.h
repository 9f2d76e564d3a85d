// What the last Forward did and how long each phase took, and the clock that times phases.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

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

// The host's own clock, for work that happens on the host (planning, a whole Forward).
class HostTimer {
 public:
  using Clock = std::chrono::steady_clock;
  HostTimer() : start_(Clock::now()) {}
  void Restart() { start_ = Clock::now(); }
  double Elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  Clock::time_point start_;
};

// The stats of one layer being collected: the counters, and each phase as a pair of
// stream-ordered marks on the device (Device::RecordMark), read once when the layer is done
// (Finish). No phase boundary waits for the device.
class StepStats : public ForwardStats {
 public:
  explicit StepStats(Device& device) : device_(device) {}
  // Records a mark after the work enqueued so far; its slot (-1 after an error).
  int Mark();
  // The phase from mark `begin` to a new mark adds to *phase when Finish reads the marks.
  void EndPhase(int begin, double ForwardStats::*phase);
  // Waits for the last mark, adds every phase's seconds; the first error of any mark.
  absl::Status Finish();

 private:
  struct Phase {
    int begin, end;
    double ForwardStats::*field;
  };
  Device& device_;
  int next_ = 0;
  std::vector<Phase> phases_;
  absl::Status status_;
};

// One phase of a layer: begins at construction (or Restart), ends at End. Does nothing when
// stats are off (null).
class PhaseTimer {
 public:
  explicit PhaseTimer(StepStats* stats) : stats_(stats) { Restart(); }
  void Restart() { begin_ = stats_ != nullptr ? stats_->Mark() : -1; }
  void End(double ForwardStats::*phase) const {
    if (stats_ != nullptr) stats_->EndPhase(begin_, phase);
  }

 private:
  StepStats* stats_;
  int begin_ = -1;
};

}  // namespace dcp
