// GPU row gather/scatter (workspace_params.h): the paged gather of a rank's local cache rows,
// the reorganization of all-gathered rows into per-request order, and the cache write of the
// new tokens a rank owns. Same contract as workspace/cpu/rows_cpu.h; pointers are device memory
// (index too). Rows move in 16-byte vectors when the row width, the strides and the base
// pointers allow it, else in the widest unit that divides them all.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "workspace/workspace_params.h"

namespace dcp::cuda {

absl::Status GatherRows(const GatherRowsParams& params, cudaStream_t stream);
absl::Status ScatterRows(const ScatterRowsParams& params, cudaStream_t stream);
// Every copy of `params` in one launch (16-byte units when all widths, strides and pointers
// allow, else the widest unit dividing them all).
absl::Status CopyRows(const CopyRowsParams& params, cudaStream_t stream);

}  // namespace dcp::cuda
