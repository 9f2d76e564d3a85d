#include "launch/bench/bench_harness.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "collectives/mpi_status.h"
#include "launch/bench/step_clock.h"
#include "collectives/mpi_status.h"
#include "core/status.h"
#include "launch/version.h"

namespace dcp::bench {

std::vector<Column> BenchEnv::MetaColumns() const {
  return {{"format_version", ""}, {"commit", ""}, {"timestamp", ""}, {"mode", ""},
          {"device", ""},         {"comm", ""},   {"world", ""},     {"dims", ""}};
}

std::vector<std::string> BenchEnv::MetaCells() const {
  return {FormatInt(launch::kOutputFormatVersion),
          launch::GitCommit(),
          started_at,
          mode_name(options.mode),
          device->name(),
          comm->name(),
          FormatInt(world_size),
          options.dims};
}

absl::Status BenchEnv::Stream(ResultTable* table, const std::string& suffix) const {
  if (!root()) return absl::OkStatus();
  const std::string path = options.csv.empty() ? "" : CsvPath(options.csv, suffix);
  return table->StreamTo(stderr, path, suffix.empty() ? mode_name(options.mode) : suffix);
}

std::string CsvPath(const std::string& csv, const std::string& suffix) {
  if (suffix.empty()) return csv;
  const bool has_extension = csv.size() > 4 && csv.compare(csv.size() - 4, 4, ".csv") == 0;
  const std::string stem = has_extension ? csv.substr(0, csv.size() - 4) : csv;
  return stem + "_" + suffix + ".csv";
}

absl::StatusOr<ModelDims> DimsByName(const std::string& name) {
  if (name == "deepseek_v32") return ModelDims::DeepSeekV32();
  if (name == "glm5") return ModelDims::Glm5();
  if (name == "small") return ModelDims{};
  return DCP_ERROR(InvalidArgument, "--model must be deepseek_v32, glm5 or small, got '%s'",
                   name);
}

absl::StatusOr<StepTimes> TimeSteps(BenchEnv& env, int num_steps,
                                    const std::function<absl::Status()>& setup,
                                    const std::function<absl::Status(const Mark&)>& body) {
  const int warmup = env.options.warmup_iters, iters = env.options.iters;
  const int slots_per_iteration = num_steps + 1;
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<StepClock> clock,
                       MakeStepClock(*env.device, iters * slots_per_iteration));
  absl::Status status;  // of the previous iteration, agreed at the top of the next
  for (int it = 0; it < warmup + iters; ++it) {
    if (status.ok() && setup) status = setup();
    if (status.ok()) status = env.device->Synchronize();
    DCP_RETURN_IF_ERROR(AgreeOnStatus(*env.bootstrap, status));
    const bool timed = it >= warmup;
    const int base = timed ? (it - warmup) * slots_per_iteration : 0;
    int marks = 0;
    const Mark mark = [&]() -> absl::Status {
      ++marks;
      DCP_CHECK_ARG(marks <= num_steps, "a benchmark body marked more than %d steps", num_steps);
      return timed ? clock->Record(base + marks) : absl::OkStatus();
    };
    status = timed ? clock->Record(base) : absl::OkStatus();
    if (status.ok()) status = body(mark);
    if (status.ok() && marks != num_steps) {
      status = DCP_ERROR(Internal, "a benchmark body marked %d of its %d steps", marks, num_steps);
    }
  }
  if (status.ok()) status = env.device->Synchronize();
  DCP_RETURN_IF_ERROR(AgreeOnStatus(*env.bootstrap, status));

  // [iters][num_steps + 1]: the steps, then the whole iteration.
  std::vector<double> seconds(size_t(iters) * slots_per_iteration);
  for (int it = 0; it < iters; ++it) {
    const int base = it * slots_per_iteration;
    for (int s = 0; s < num_steps; ++s) {
      DCP_ASSIGN_OR_RETURN(seconds[base + s], clock->Elapsed(base + s, base + s + 1));
    }
    DCP_ASSIGN_OR_RETURN(seconds[base + num_steps], clock->Elapsed(base, base + num_steps));
  }
  DCP_RETURN_IF_ERROR(MaxOverRanks(env, &seconds));
  StepTimes times;
  times.step_s.resize(num_steps);
  std::vector<double> column(iters);
  for (int s = 0; s <= num_steps; ++s) {
    for (int it = 0; it < iters; ++it) column[it] = seconds[size_t(it) * slots_per_iteration + s];
    if (s < num_steps) {
      times.step_s[s] = Median(column);
    } else {
      times.total_s = Median(column);
      times.min_total_s = *std::min_element(column.begin(), column.end());
    }
  }
  return times;
}

absl::Status MaxOverRanks(BenchEnv& env, std::vector<double>* values) {
  if (values->empty()) return absl::OkStatus();
  DCP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values->data(), static_cast<int>(values->size()),
                              MPI_DOUBLE, MPI_MAX, env.bootstrap->mpi_comm()));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> SumOverRanks(BenchEnv& env, int64_t value) {
  int64_t sum = 0;
  DCP_MPI_CHECK(MPI_Allreduce(&value, &sum, 1, MPI_INT64_T, MPI_SUM, env.bootstrap->mpi_comm()));
  return sum;
}

double Median(std::vector<double> values) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  const size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + middle, values.end());
  if (values.size() % 2 == 1) return values[middle];
  const double upper = values[middle];
  const double lower = *std::max_element(values.begin(), values.begin() + middle);
  return 0.5 * (lower + upper);
}

std::vector<int64_t> SweepSizes(const BenchOptions& options, int64_t granule) {
  // As nccl-tests: min, min*f, min*f^2, ... while <= max.
  std::vector<int64_t> sizes;
  for (double size = static_cast<double>(options.min_bytes);
       size <= static_cast<double>(options.max_bytes); size *= options.step_factor) {
    const int64_t rounded =
        std::max<int64_t>(granule, static_cast<int64_t>(size) / granule * granule);
    if (sizes.empty() || rounded != sizes.back()) sizes.push_back(rounded);
  }
  return sizes;
}

}  // namespace dcp::bench
