#include "runtime/forward_stats.h"

namespace dcp {

int StepStats::Mark() {
  if (!status_.ok()) return -1;
  const int slot = next_++;
  status_ = device_.RecordMark(slot);
  return status_.ok() ? slot : -1;
}

void StepStats::EndPhase(int begin, double ForwardStats::*phase) {
  const int end = Mark();
  if (begin >= 0 && end >= 0) phases_.push_back({begin, end, phase});
}

absl::Status StepStats::Finish() {
  for (const Phase& p : phases_) {
    if (!status_.ok()) break;
    absl::StatusOr<double> seconds = device_.MarkSeconds(p.begin, p.end);
    if (!seconds.ok()) {
      status_ = seconds.status();
      break;
    }
    this->*(p.field) += *seconds;
  }
  phases_.clear();
  next_ = 0;
  return status_;
}

}  // namespace dcp
