// GPU fp8_ds_mla cache write and gather (workspace/fp8_rows_params.h); same contract as
// workspace/cpu/fp8_rows_cpu.h, pointers in device memory (index arrays too). CUDA ranks store
// bf16: the write reads BF16 kv_c / k_pe and the gather writes BF16 (other dtypes are
// InvalidArgument). Rows move in 16-byte vectors: the cache, kv_c, k_pe and dst must be 16-byte
// aligned and their row strides multiples of 8 elements (a clear error otherwise).
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "workspace/fp8_rows_params.h"

namespace dcp::cuda {

absl::Status WriteFp8DsMlaRows(const Fp8DsMlaWriteParams& params, cudaStream_t stream);
absl::Status GatherFp8DsMlaRows(const Fp8DsMlaGatherParams& params, cudaStream_t stream);

}  // namespace dcp::cuda
