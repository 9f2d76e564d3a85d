#include "launch/bench/bench_setup.h"

#include "core/status.h"

#if DCP_WITH_CUDA
#include "collectives/cuda/cuda_communicator_factory.h"
#include "runtime/cuda/cuda_device.h"
#endif

namespace dcp::bench {

absl::StatusOr<std::unique_ptr<Device>> MakeBenchDevice(const BenchOptions& options) {
  if (options.device == "cpu") return MakeCpuDevice(DType::kF32);
#if DCP_WITH_CUDA
  DCP_ASSIGN_OR_RETURN(const int ordinal, SelectLocalDevice());
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> device, CudaDevice::Create(ordinal));
  return std::unique_ptr<Device>(std::move(device));
#else
  return DCP_ERROR(InvalidArgument,
                   "--device cuda: this dcp_bench was built without CUDA (configure with "
                   "-DDCP_WITH_CUDA=ON on a machine with nvcc and NCCL)");
#endif
}

absl::StatusOr<std::unique_ptr<Communicator>> MakeBenchCommunicator(const BenchOptions& options,
                                                                    MpiCommunicator& bootstrap,
                                                                    Device& device) {
  if (device.memory_space() == MemorySpace::kHost) {
    DCP_CHECK_ARG(options.comm != "nccl", "--comm nccl needs --device cuda");
    DCP_ASSIGN_OR_RETURN(std::unique_ptr<MpiCommunicator> comm,
                         MpiCommunicator::Create(bootstrap.mpi_comm(), options.timeout_s));
    return std::unique_ptr<Communicator>(std::move(comm));
  }
#if DCP_WITH_CUDA
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  DCP_CHECK_ARG(cuda != nullptr, "device %s is not a CudaDevice", device.name());
  return MakeCudaCommunicator(bootstrap, options.comm, options.timeout_s, cuda->stream());
#else
  return DCP_ERROR(InvalidArgument, "device %s needs a CUDA build", device.name());
#endif
}

}  // namespace dcp::bench
