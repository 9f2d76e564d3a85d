// The harness every mode of dcp_bench binds into (nccl-tests' common.cu in spirit): the ranks'
// environment, the timing loop (warm-up, per-iteration timestamps, slowest rank, median), the
// size sweep, reductions over ranks, and what a mode hands back (tables and #wrong).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "collectives/mpi_communicator.h"
#include "launch/bench/bench_options.h"
#include "launch/bench/result_table.h"
#include "runtime/config.h"
#include "runtime/device.h"

namespace dcp::bench {

// What a mode runs on. Owned by main; every pointer outlives the mode.
struct BenchEnv {
  BenchOptions options;
  int rank = 0, world_size = 1;
  MpiCommunicator* bootstrap = nullptr;  // host control plane: agreement, timing reductions
  Device* device = nullptr;
  Communicator* comm = nullptr;  // the data plane the layer runs on
  ModelDims dims;                // --model; num_heads is set per run from --heads
  std::string started_at;        // UTC timestamp of the run's start (rank 0's), in every CSV row

  bool root() const { return rank == 0; }
  bool on_gpu() const { return device->memory_space() == MemorySpace::kDevice; }
  // The CSV metadata columns every mode starts with, and their values.
  std::vector<Column> MetaColumns() const;
  std::vector<std::string> MetaCells() const;
  // On rank 0: rows of `table` are printed to stderr as they come and streamed to the CSV of
  // `suffix` (csv_path), so a run cut short keeps what it measured. Elsewhere nothing.
  absl::Status Stream(ResultTable* table, const std::string& suffix) const;
};

// The CSV of a table: --csv FILE for the main table (suffix ""), else FILE's stem + "_" +
// suffix + ".csv" ("out/routes.csv" + "crossover" -> "out/routes_crossover.csv").
std::string CsvPath(const std::string& csv, const std::string& suffix);

// The model dimensions named by --model.
absl::StatusOr<ModelDims> DimsByName(const std::string& name);

// One result table of a mode; `suffix` names its CSV (FILE, or FILE's stem + "_suffix.csv").
struct NamedTable {
  std::string suffix;
  ResultTable table;
};

struct ModeResult {
  std::vector<NamedTable> tables;
  int64_t num_wrong = 0;   // summed over ranks and rows; > 0 fails the run
  int64_t num_failed = 0;  // rows whose measurement failed; > 0 fails the run
};

// Median over iterations of the slowest rank's time, per step and for the whole iteration.
struct StepTimes {
  std::vector<double> step_s;  // [num_steps]
  double total_s = 0;
  double min_total_s = 0;  // fastest iteration (of the slowest rank)
};

// Calls the steps of one iteration; `mark()` must be called once after each step.
using Mark = std::function<absl::Status()>;

// Runs warmup_iters + iters iterations. Each: setup() (untimed; may be null), device
// synchronize, then an agreement over the bootstrap communicator that doubles as a barrier
// (a failure on any rank ends the loop on every rank with that error), then the body timed on
// the device's clock (step_clock.h). Every rank must call this with the same num_steps.
absl::StatusOr<StepTimes> TimeSteps(BenchEnv& env, int num_steps,
                                    const std::function<absl::Status()>& setup,
                                    const std::function<absl::Status(const Mark&)>& body);

// Element-wise maximum / sum over the ranks (bootstrap communicator), in place.
absl::Status MaxOverRanks(BenchEnv& env, std::vector<double>* values);
absl::StatusOr<int64_t> SumOverRanks(BenchEnv& env, int64_t value);

double Median(std::vector<double> values);
// The sizes of the -b/-e/-f sweep, each a multiple of `granule` (at least one granule).
std::vector<int64_t> SweepSizes(const BenchOptions& options, int64_t granule);

}  // namespace dcp::bench
