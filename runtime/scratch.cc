#include "runtime/scratch.h"

#include <algorithm>

#include "core/status.h"

namespace dcp {

absl::StatusOr<void*> ScratchBuffer::Reserve(Device& device, size_t bytes) {
  if (buffer_.data() == nullptr || buffer_.bytes() < bytes) {
    buffer_.reset();
    DCP_ASSIGN_OR_RETURN(buffer_, device.Allocate(std::max<size_t>(bytes, 64)));
  }
  return buffer_.data();
}

absl::StatusOr<void*> ScratchBuffer::Get(size_t bytes) const {
  if (buffer_.data() == nullptr || buffer_.bytes() < bytes) {
    return DCP_ERROR(FailedPrecondition,
                     "scratch buffer of %d bytes used for %d: the step's plan did not size it "
                     "(plan the step before running its layers)",
                     buffer_.bytes(), bytes);
  }
  return buffer_.data();
}

absl::StatusOr<void*> Stage(Device& device, ScratchBuffer& buffer, const TensorView& view,
                            DType dtype) {
  const size_t count = static_cast<size_t>(view.num_elements());
  DCP_ASSIGN_OR_RETURN(void* data, buffer.Reserve(device, count * dtype_size(dtype)));
  if (count == 0) return data;
  if (view.memory == device.memory_space()) {
    DCP_RETURN_IF_ERROR(device.Convert(data, dtype, view.data, view.dtype, count));
    return data;
  }
  // Host input on a device rank: copy as is, then convert on the device.
  DCP_ASSIGN_OR_RETURN(Buffer staging, device.Allocate(count * dtype_size(view.dtype)));
  DCP_RETURN_IF_ERROR(device.CopyFromHost(staging.data(), view.data, staging.bytes()));
  DCP_RETURN_IF_ERROR(device.Convert(data, dtype, staging.data(), view.dtype, count));
  DCP_RETURN_IF_ERROR(device.Synchronize());
  return data;
}

}  // namespace dcp
