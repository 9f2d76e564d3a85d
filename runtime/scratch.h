// Device scratch: named buffers that grow on demand and are reused across batches, and the
// two ways inputs reach them (host vectors uploaded, caller tensors staged and converted).
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "runtime/device.h"

namespace dcp {

// One device allocation that is only ever grown (never shrunk) to the largest request. Sized
// when a step is planned (Reserve, which may allocate); used while a layer runs (Get, which
// never allocates: a buffer the plan did not size is an error, not a hidden cudaMalloc).
class ScratchBuffer {
 public:
  // At least `bytes` bytes on `device` (contents undefined after a grow).
  absl::StatusOr<void*> Reserve(Device& device, size_t bytes);
  // The buffer, which must hold `bytes` already.
  absl::StatusOr<void*> Get(size_t bytes) const;
  size_t capacity() const { return buffer_.bytes(); }
  void* data() const { return buffer_.data(); }
  template <typename T>
  T* as() const { return buffer_.as<T>(); }

 private:
  Buffer buffer_;
};

// Copies `values` into `buffer` on the device (asynchronously on CUDA ranks: the host vector
// must outlive the copy, i.e. the next Synchronize).
template <typename T>
absl::StatusOr<T*> Upload(Device& device, ScratchBuffer& buffer, const std::vector<T>& values) {
  const size_t bytes = values.size() * sizeof(T);
  DCP_ASSIGN_OR_RETURN(void* data, buffer.Reserve(device, bytes));
  DCP_RETURN_IF_ERROR(device.StageToDevice(data, values.data(), bytes));
  return static_cast<T*>(data);
}

// The uploads of one step as one batch (Device::BeginStagingBatch): Flush enqueues them; a
// batch left without a Flush (an error path) is discarded.
class StagingBatch {
 public:
  explicit StagingBatch(Device& device) : device_(device) { device_.BeginStagingBatch(); }
  ~StagingBatch() {
    if (open_) device_.DiscardStagingBatch();
  }
  StagingBatch(const StagingBatch&) = delete;
  StagingBatch& operator=(const StagingBatch&) = delete;
  absl::Status Flush() {
    open_ = false;
    return device_.FlushStagingBatch();
  }

 private:
  Device& device_;
  bool open_ = true;
};

// A device copy of `view` converted to `dtype` (host views are copied, then converted).
absl::StatusOr<void*> Stage(Device& device, ScratchBuffer& buffer, const TensorView& view,
                            DType dtype);

}  // namespace dcp
