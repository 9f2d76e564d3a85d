// The memory-bound kernels of the kernels mode, one size of the -b/-e/-f sweep at a time:
// Copy, GatherRows, ScatterRows (rows of R + Dr in the storage dtype), the fp8_ds_mla gathers
// (DeepSeek dims: dequantizing, and the raw 656-byte rows), MergeStates, DcpCorrect,
// DcpCombine (fp32 partials) and TopkToSlots. The size is the bytes of the kernel's main
// output; `bytes` counts everything one run reads and writes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "launch/bench/bench_harness.h"

namespace dcp::bench {

using Step = std::function<absl::Status()>;
using Check = std::function<absl::StatusOr<int64_t>()>;

struct KernelCase {
  std::string kernel;
  int64_t size_bytes = 0;
  double bytes = 0;       // read + written by one run
  absl::Status prepared;  // this rank's status of building the inputs
  Step setup;             // untimed, before each run; may be null
  Step run;
  Check check;  // wrong elements on this rank after setup + run; may be null
};

// Builds each kernel at `size` in turn and hands it to `measure` while its buffers live.
// Every rank calls this with the same size (measure is collective).
absl::Status ForEachSweepKernel(BenchEnv& env, int64_t size,
                                const std::function<absl::Status(const KernelCase&)>& measure);

}  // namespace dcp::bench
