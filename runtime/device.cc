#include "runtime/device.h"

#include <algorithm>
#include <chrono>

#include "core/status.h"

namespace dcp {

absl::Status Device::SelectPrefillBackend(const std::string& backend, int num_heads, int qk_dim,
                                          int v_dim) {
  (void)num_heads;
  if (backend == "none") return absl::OkStatus();
  if (backend == "auto" || backend == "native") return DenseMhaSupport(qk_dim, v_dim);
  if (backend == "cudnn") {
    return DCP_ERROR(FailedPrecondition,
                     "prefill backend 'cudnn' needs a CUDA rank with cuDNN; this rank's device "
                     "is %s",
                     this->name());
  }
  return DCP_ERROR(InvalidArgument, "unknown prefill backend '%s'", backend);
}

absl::Status Device::WriteFp8DsMlaRows(const Fp8DsMlaWriteParams& params) {
  (void)params;
  return DCP_ERROR(Unimplemented, "device %s has no fp8_ds_mla cache write", this->name());
}

absl::Status Device::GatherFp8DsMlaRows(const Fp8DsMlaGatherParams& params) {
  (void)params;
  return DCP_ERROR(Unimplemented, "device %s has no fp8_ds_mla cache gather", this->name());
}

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

absl::Status Device::RecordMark(int slot) {
  DCP_CHECK_ARG(slot >= 0, "mark slot %d", slot);
  if (static_cast<size_t>(slot) >= host_marks_.size()) host_marks_.resize(slot + 1, 0.0);
  host_marks_[slot] = std::chrono::duration<double>(
                          std::chrono::steady_clock::now().time_since_epoch()).count();
  return absl::OkStatus();
}

absl::StatusOr<double> Device::MarkSeconds(int from, int to) {
  DCP_CHECK_ARG(from >= 0 && to >= 0 && static_cast<size_t>(std::max(from, to)) < host_marks_.size(),
                "marks %d and %d were not recorded", from, to);
  return host_marks_[to] - host_marks_[from];
}

}  // namespace dcp
