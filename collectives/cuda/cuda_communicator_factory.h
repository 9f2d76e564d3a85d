// The data-plane communicator of a CUDA rank, chosen from --comm:
//   "nccl": NcclCommunicator; an error when two ranks of the group share a GPU (NCCL refuses).
//   "mpi":  HostStagedCommunicator over `mpi` (device buffers staged through pinned memory).
//   "auto": NCCL when every rank has its own GPU, else MPI with host staging, said in one log
//           line (rank 0, INFO).
// GPUs are compared by UUID (all-gathered over MPI), so ranks on different hosts never look
// shared. Collective: every rank calls it with the same arguments, after binding its GPU
// (cudaSetDevice, e.g. CudaDevice::Create). `mpi` must outlive the result (it carries the
// control plane and NCCL's bootstrap). `stream`: the stream the data plane runs on; pass
// CudaDevice::stream(), or leave null for the legacy default stream (also ordered with it).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "collectives/mpi_communicator.h"

namespace dcp {

absl::StatusOr<std::unique_ptr<Communicator>> MakeCudaCommunicator(MpiCommunicator& mpi,
                                                                   const std::string& comm,
                                                                   double timeout_s,
                                                                   cudaStream_t stream = nullptr);

// Collective: whether any two ranks of `mpi` use the same GPU (by UUID of the current device).
// `description` (may be null) receives e.g. "ranks 0 and 1 share GPU-5f3e..." when true.
absl::StatusOr<bool> RanksShareGpu(MpiCommunicator& mpi, std::string* description = nullptr);

}  // namespace dcp
