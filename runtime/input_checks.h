// The checks a layer's inputs pass before anything runs: shapes and dtypes of every tensor
// against the model and the batch, and the batch against the cached lengths. Each returns
// InvalidArgument naming the tensor or request at fault.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "runtime/batch.h"
#include "runtime/config.h"
#include "runtime/layer_io.h"

namespace dcp {

// "[2, 3]".
std::string ShapeString(const std::vector<int64_t>& shape);

// One caller tensor: exactly `expected` shape, F32/BF16 (float_dtype) or I32, in host memory or
// in `device_memory`, and a data pointer unless empty.
absl::Status CheckView(const char* name, const void* data, DType dtype, MemorySpace memory,
                       const std::vector<int64_t>& shape, const std::vector<int64_t>& expected,
                       bool float_dtype, MemorySpace device_memory);
inline absl::Status CheckView(const char* name, const TensorView& view,
                              const std::vector<int64_t>& expected, bool float_dtype,
                              MemorySpace device_memory) {
  return CheckView(name, view.data, view.dtype, view.memory, view.shape, expected, float_dtype,
                   device_memory);
}

// Without top-k indices every causal key is selected, which the contract allows only when
// every seq_len <= index_topk (FORMATS.md).
absl::Status CheckLengthsWithoutTopk(absl::Span<const BatchRequest> batch, int index_topk);

// What the layer's inputs must look like for `batch` on a rank with `heads` heads.
struct LayerInputShape {
  const ModelDims* model;
  int64_t heads;            // H/W
  MemorySpace device_memory;
  int index_topk;
};
absl::Status CheckLayerInputs(const LayerInputShape& shape, absl::Span<const BatchRequest> batch,
                              const BatchInputs& inputs, const BatchOutputs& outputs);

}  // namespace dcp
