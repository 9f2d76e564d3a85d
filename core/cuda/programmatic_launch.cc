#include "core/cuda/programmatic_launch.h"

#include <atomic>
#include <cstdlib>

namespace dcp::cuda {
namespace {

// The current device's compute capability major (cached per device; 0 when unknown).
int DeviceMajor() {
  static std::atomic<int> cached[64] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0) return 0;
  if (device < 64 && cached[device].load() > 0) return cached[device].load();
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    return 0;
  }
  if (device < 64) cached[device].store(major);
  return major;
}

}  // namespace

bool ProgrammaticLaunchEnabled() {
  static const bool disabled = std::getenv("DCP_NO_PDL") != nullptr;
  return !disabled && DeviceMajor() >= 9;
}

bool EarlyTriggerEnabled() {
  static const bool disabled = std::getenv("DCP_NO_EARLY_TRIGGER") != nullptr;
  return !disabled && ProgrammaticLaunchEnabled();
}

void SetProgrammaticLaunch(cudaLaunchConfig_t* config, cudaLaunchAttribute* attribute) {
  if (!ProgrammaticLaunchEnabled()) return;
  attribute->id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute->val.programmaticStreamSerializationAllowed = 1;
  config->attrs = attribute;
  config->numAttrs = 1;
}

}  // namespace dcp::cuda
