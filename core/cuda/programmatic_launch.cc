#include "core/cuda/programmatic_launch.h"

#include "core/cuda/device_info.h"
#include "core/environment.h"

namespace dcp::cuda {

bool ProgrammaticLaunchEnabled() {
  static const bool disabled = EnvSwitch("DCP_NO_PDL", false);
  return !disabled && CurrentDeviceComputeMajor() >= 9;
}

bool EarlyTriggerEnabled() {
  static const bool disabled = EnvSwitch("DCP_NO_EARLY_TRIGGER", false);
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
