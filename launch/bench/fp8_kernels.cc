#include "launch/bench/fp8_kernels.h"

#include "core/status.h"
#include "workspace/cpu/fp8_rows_cpu.h"
#if DCP_WITH_CUDA
#include "runtime/cuda/cuda_device.h"
#include "workspace/cuda/fp8_rows_cuda.h"
#endif

namespace dcp::bench {

absl::Status WriteFp8DsMlaRowsOn(Device& device, const Fp8DsMlaWriteParams& params) {
#if DCP_WITH_CUDA
  if (auto* cuda_device = dynamic_cast<CudaDevice*>(&device)) {
    return cuda::WriteFp8DsMlaRows(params, cuda_device->stream());
  }
#endif
  DCP_CHECK_ARG(device.memory_space() == MemorySpace::kHost,
                "Fp8DsMlaWrite: device %s has no fp8_ds_mla kernels", device.name());
  return cpu::WriteFp8DsMlaRows(params);
}

absl::Status GatherFp8DsMlaRowsOn(Device& device, const Fp8DsMlaGatherParams& params) {
#if DCP_WITH_CUDA
  if (auto* cuda_device = dynamic_cast<CudaDevice*>(&device)) {
    return cuda::GatherFp8DsMlaRows(params, cuda_device->stream());
  }
#endif
  DCP_CHECK_ARG(device.memory_space() == MemorySpace::kHost,
                "Fp8DsMlaGather: device %s has no fp8_ds_mla kernels", device.name());
  return cpu::GatherFp8DsMlaRows(params);
}

}  // namespace dcp::bench
