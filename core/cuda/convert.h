// Element type conversion on the GPU (Device::Convert, the NCCL communicator's fp32 staging of
// bf16 sums): dst[i] = src[i] converted, i in [0, count). F32 -> BF16 rounds to nearest even
// (NaN stays NaN), bit for bit as dtype.h's float_to_bf16; BF16 -> F32 is exact; same-type pairs (I32 too) are a device copy. Other
// pairs are InvalidArgument. dst and src are device memory and must not overlap.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "absl/status/status.h"
#include "core/dtype.h"

namespace dcp::cuda {

absl::Status Convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t count,
                     cudaStream_t stream);

}  // namespace dcp::cuda
