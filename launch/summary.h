// The run summary printed by rank 0: per batch the route, requests, tokens and chunks, the wall
// time of each phase (mean over the timed iterations of the slowest rank), the bytes each
// collective moved per rank with the effective GB/s, the attention + projection GFLOP/s of the
// group, and the --check errors. Text for people, or one JSON object (--json).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "launch/check.h"
#include "nlohmann/json.hpp"
#include "runtime/dcp.h"

namespace dcp::launch {

// Sums ForwardStats over iterations on one rank.
class StatsAccumulator {
 public:
  void Add(const ForwardStats& stats);
  int count() const { return count_; }
  ForwardStats Mean() const;  // counts and route of the last iteration, times/bytes averaged

 private:
  ForwardStats sum_;
  ForwardStats last_;
  int count_ = 0;
};

struct BatchReport {
  std::string label;  // the batch spec or the problem file
  int num_requests = 0;
  std::string route;
  int num_decodes = 0, num_prefills = 0, num_chunks = 0;
  int64_t num_tokens = 0, num_context_rows = 0;
  int iters = 0;
  // Seconds per iteration, slowest rank.
  double plan_s = 0, cache_write_s = 0, gather_s = 0, up_projection_s = 0, attention_s = 0,
         combine_s = 0, total_s = 0;
  double all_gather_bytes = 0, combine_bytes = 0;  // per rank per iteration (rank mean)
  // Both collectives' bytes over the time of the phases they run in (gather + combine):
  // ForwardStats does not time the collectives alone.
  double collective_gbps = 0;  // both collectives' bytes over their own time
  double all_gather_comm_s = 0, combine_comm_s = 0;
  double all_gather_gbps = 0, combine_gbps = 0;
  double flops = 0;  // whole group, per iteration
  double gflops_per_s = 0;
  std::optional<CheckResult> check;
};

// Collective on `comm`: every rank contributes its mean stats; rank 0's report is complete.
absl::StatusOr<BatchReport> ReduceStats(Communicator& comm, const ForwardStats& mean, int iters);

// What the run was (the header of the summary).
struct RunDescription {
  int world_size = 1;
  std::string device, comm, combine, source, input_dtype;
  ModelDims model;
  int index_topk = 0, interleave = 1, block_size = 0;
};

std::string FormatHeader(const RunDescription& run);
std::string FormatReport(const BatchReport& report, int index, int count);
nlohmann::json RunJson(const RunDescription& run, const std::vector<BatchReport>& reports,
                       bool passed);

}  // namespace dcp::launch
