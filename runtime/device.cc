#include "runtime/device.h"

#include "core/status.h"

namespace dcp {

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = other.device_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.device_ = nullptr;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void Buffer::reset() {
  if (device_ != nullptr && data_ != nullptr) device_->Free(data_);
  device_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

absl::Status Device::SetStream(void* stream) {
  DCP_CHECK_ARG(stream == nullptr, "device %s runs in order and takes no stream", name());
  return absl::OkStatus();
}

}  // namespace dcp
