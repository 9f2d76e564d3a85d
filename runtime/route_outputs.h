// Where a route writes its tokens' results (device memory, contiguous): out [T, Hl, Dv] of
// out_dtype, F32 or BF16 (each value rounded once from the fp32 result), and lse [T, Hl] F32,
// natural log, -inf where a token selected no key.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace dcp {

struct RouteOutputs {
  void* out = nullptr;
  DType out_dtype = DType::kF32;
  float* lse = nullptr;

  // The same buffers from token `first` on; `row` = Hl * Dv values per token of out, `heads`
  // = Hl values per token of lse.
  RouteOutputs From(int64_t first, int64_t row, int64_t heads) const {
    return {static_cast<std::byte*>(out) + size_t(first * row) * dtype_size(out_dtype), out_dtype,
            lse + first * heads};
  }
};

}  // namespace dcp
