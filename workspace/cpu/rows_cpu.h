// CPU row gather/scatter (workspace_params.h): the paged gather, the reorganization after the
// all-gather and the cache write on CPU ranks.
#pragma once

#include "absl/status/status.h"
#include "workspace/workspace_params.h"

namespace dcp::cpu {

absl::Status GatherRows(const GatherRowsParams& params);
absl::Status ScatterRows(const ScatterRowsParams& params);
absl::Status CopyRows(const CopyRowsParams& params);

}  // namespace dcp::cpu
