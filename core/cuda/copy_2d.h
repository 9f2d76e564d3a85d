// A pitched device-to-device copy as a kernel: rows of `row_bytes` from `src` (row r at
// src + r * src_pitch) to `dst` (dst + r * dst_pitch). Device::Copy2D on CUDA ranks and the
// side copy of the GEMM paths whose kernel does not take it (cuBLAS, the tensor-core small-M
// kernel) use it instead of cudaMemcpy2DAsync: the copy engine moves short rows at a fraction
// of the bandwidth (the decode's q_pe, 128 bytes a head: 6.1 us for 64 tokens x 128 heads on
// the H200, ~1.5 us as this kernel), and a kernel joins the chain of programmatic launches
// where a copy-engine node breaks it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "absl/status/status.h"

namespace dcp::cuda {

// Enqueues the copy on `stream`. 16-byte units where both pointers, both pitches and the row
// allow it, else 4-byte, else bytes. On sm_90 it is a programmatic dependent launch: it waits
// for the previous grid (griddepcontrol.wait) before it reads or writes. Zero rows or bytes:
// nothing to do. A null pointer or a pitch below the row: InvalidArgument naming `what`. The
// rows must not overlap between src and dst.
absl::Status Copy2D(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                    size_t row_bytes, size_t rows, cudaStream_t stream,
                    const char* what = "Copy2D");

}  // namespace dcp::cuda
