// Everything one `dcp_run` needs: the four config structs of the runtime plus the `run`
// section. Built from defaults, then the YAML file (sections model, scheduler, dcp, attention,
// run; an unknown section or key is an error), then the command-line flags (launch/flags.h),
// which override the file. `explicit_keys` remembers what the file or a flag set, so that a
// limit the user left at its default may grow to fit a batch.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "runtime/config.h"
#include "runtime/dcp.h"

namespace dcp::launch {

struct RunSection {
  std::vector<std::string> batches;  // batch specs, run one after the other
  std::string problem;               // problem file (exclusive with batches)
  std::string output;                // result file
  std::string device = "cpu";        // cpu | cuda
  std::string comm = "auto";         // auto | mpi | nccl (auto: nccl when every CUDA rank has a GPU)
  uint64_t seed = 0;
  int iters = 1;           // Forward calls per batch (timed: all of them)
  int warmup = 0;          // untimed Forward calls before them
  bool check = false;      // compare with the single-rank reference on rank 0
  double tolerance = 0.0;  // max relative error for --check; 0 = by storage dtype
  bool print_plan = false;
  bool json = false;
};

struct RunConfig {
  std::string model_preset = "small";  // small | deepseek_v32 | glm5 (explicit dims override)
  ModelDims model;
  DcpConfig dcp;
  SchedulerConfig scheduler;
  AttentionConfig attention;
  int64_t workspace_rows = 0;  // scheduler.workspace_rows: DcpOptions::workspace_rows_override
  RunSection run;
  std::set<std::string> explicit_keys;  // "section.key" set by the file or a flag

  bool is_explicit(std::string_view key) const { return explicit_keys.contains(std::string(key)); }
  DcpOptions options() const {
    DcpOptions options{model, dcp, scheduler, attention};
    options.workspace_rows_override = workspace_rows;
    return options;
  }
};

// Applies a model preset by name: "small" (the scaled-down CPU dims, ModelDims{}) or
// "deepseek_v32" (DeepSeek-V3.2) or "glm5" (GLM-5). Dims set explicitly later override it.
absl::Status ApplyModelPreset(std::string_view name, RunConfig* config);

// Applies YAML text (`source` names it in messages) on top of *config.
absl::Status ApplyYamlConfig(std::string_view text, std::string_view source, RunConfig* config);

// The checks that need no MPI world: option values (device, comm, ...), one of batches or
// problem, and what --output and --print-plan allow. The configs' own Validate is separate.
absl::Status ValidateRunSection(const RunConfig& config);

}  // namespace dcp::launch
