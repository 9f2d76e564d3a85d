// The rank's device and data-plane communicator for dcp_bench, from --device and --comm:
//   cpu:  CpuDevice (F32 storage) and MpiCommunicator (host buffers); --comm auto|mpi.
//   cuda: CudaDevice on the local rank's GPU and MakeCudaCommunicator(--comm auto|nccl|mpi),
//         on the device's stream (CUDA builds only; an error elsewhere).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "collectives/mpi_communicator.h"
#include "launch/bench/bench_options.h"
#include "runtime/device.h"

namespace dcp::bench {

absl::StatusOr<std::unique_ptr<Device>> MakeBenchDevice(const BenchOptions& options);

// Collective over `bootstrap`, which must outlive the result.
absl::StatusOr<std::unique_ptr<Communicator>> MakeBenchCommunicator(const BenchOptions& options,
                                                                    MpiCommunicator& bootstrap,
                                                                    Device& device);

}  // namespace dcp::bench
