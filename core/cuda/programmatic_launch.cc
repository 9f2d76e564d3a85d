#include "core/cuda/programmatic_launch.h"

#include <cstdlib>

#include "core/cuda/device_info.h"

namespace dcp::cuda {

bool ProgrammaticLaunchEnabled() {
  static const bool disabled = std::getenv("DCP_NO_PDL") != nullptr;
  return !disabled && CurrentDeviceComputeMajor() >= 9;
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
