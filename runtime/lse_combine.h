// The cross-rank LSE combine of the sparse route (DESIGN.md section 7): every rank holds
// partials of every rank's heads over its own keys; afterwards each holds its heads' merged
// output. Two backends (DcpConfig::combine):
//   ag_rs: all-gather the LSEs, scale the own partials (DcpCorrect), reduce-scatter (sum);
//   a2a:   all-to-all the partials and LSEs by head group, merge locally (DcpCombine).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "collectives/communicator.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "runtime/forward_stats.h"
#include "runtime/scratch.h"

namespace dcp {

class LseCombine {
 public:
  LseCombine(Device& device, Communicator& comm, CombineBackend backend)
      : device_(device), comm_(comm), backend_(backend) {}

  // At plan time: sizes the buffers for num_tokens tokens.
  absl::Status Prepare(int64_t num_tokens, int heads, int dim);
  // W > 1 (one rank's kernel output is the result). partial [W, T, Hl, R] F32 and lse_partial [W, T, Hl] (block q: rank q's heads, over this
  // rank's keys) -> combined [T, Hl, R], lse [T, Hl] of this rank's heads. `partial` is
  // overwritten (ag_rs scales it in place). Adds its times and bytes to *stats (may be null).
  absl::Status Run(float* partial, const float* lse_partial, int64_t num_tokens, int heads,
                   int dim, float* combined, float* lse, StepStats* stats);

 private:
  Device& device_;
  Communicator& comm_;
  CombineBackend backend_;
  ScratchBuffer lse_all_, lse_total_, received_, lse_received_;
};

}  // namespace dcp
