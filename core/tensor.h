// Caller-owned tensors as the module's interfaces pass them: pointer, dtype, row-major
// contiguous shape, and the memory space the pointer lives in. Views never own memory.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace dcp {

// Where a buffer lives: host memory, or the memory of the rank's device (its GPU).
enum class MemorySpace { kHost, kDevice };

struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  MemorySpace memory = MemorySpace::kHost;
  int64_t num_elements() const;
};

struct MutableTensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  MemorySpace memory = MemorySpace::kHost;
  int64_t num_elements() const;
};

}  // namespace dcp
