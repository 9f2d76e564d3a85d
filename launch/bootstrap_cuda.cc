// The CUDA halves of bootstrap.h (built only with DCP_WITH_CUDA).
#include <cuda_runtime.h>

#include "collectives/cuda/cuda_communicator_factory.h"
#include "launch/bootstrap.h"
#include "runtime/cuda/cuda_device.h"
#include "core/status.h"

namespace dcp::launch {

absl::StatusOr<std::unique_ptr<Device>> MakeCudaRankDevice(const ProcessInfo& process) {
  (void)process;  // SelectLocalDevice reads the local rank from the launcher's environment
  DCP_ASSIGN_OR_RETURN(int ordinal, SelectLocalDevice());
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> device, CudaDevice::Create(ordinal));
  return std::unique_ptr<Device>(std::move(device));
}

absl::StatusOr<std::unique_ptr<Communicator>> MakeCudaRankCommunicator(const std::string& kind,
                                                                       MpiCommunicator& bootstrap,
                                                                       Device& device,
                                                                       double timeout_s) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  if (cuda == nullptr) {
    return DCP_ERROR(InvalidArgument, "--comm %s with a CUDA communicator needs --device cuda",
                     kind);
  }
  return MakeCudaCommunicator(bootstrap, kind, timeout_s, cuda->stream());
}

}  // namespace dcp::launch
