// Attributes of the calling thread's current CUDA device that launchers consult on every call,
// read once per device and cached (0 when the device cannot be queried).
#pragma once

namespace dcp::cuda {

int CurrentDeviceSmCount();
int CurrentDeviceComputeMajor();

}  // namespace dcp::cuda
