#include "collectives/cuda/cuda_communicator_factory.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
#include "collectives/cuda/host_staged_communicator.h"
#include "collectives/cuda/nccl_communicator.h"
#include "core/cuda/cuda_status.h"
#include "core/logging.h"
#include "core/status.h"

namespace dcp {
namespace {

std::string UuidText(int64_t high, int64_t low) {
  return absl::StrFormat("GPU-%016x%016x", static_cast<uint64_t>(high), static_cast<uint64_t>(low));
}

}  // namespace

absl::StatusOr<bool> RanksShareGpu(MpiCommunicator& mpi, std::string* description) {
  int device = -1;
  DCP_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp properties{};
  DCP_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  int64_t halves[2];
  static_assert(sizeof(properties.uuid.bytes) == sizeof(halves));
  std::memcpy(halves, properties.uuid.bytes, sizeof(halves));
  const int world = mpi.world_size();
  std::vector<int64_t> high(world), low(world);
  DCP_RETURN_IF_ERROR(mpi.HostAllGather(halves[0], absl::MakeSpan(high)));
  DCP_RETURN_IF_ERROR(mpi.HostAllGather(halves[1], absl::MakeSpan(low)));
  for (int a = 0; a < world; ++a) {
    for (int b = a + 1; b < world; ++b) {
      if (high[a] == high[b] && low[a] == low[b]) {
        if (description != nullptr) {
          *description =
              absl::StrFormat("ranks %d and %d share %s", a, b, UuidText(high[a], low[a]));
        }
        return true;
      }
    }
  }
  return false;
}

absl::StatusOr<std::unique_ptr<Communicator>> MakeCudaCommunicator(MpiCommunicator& mpi,
                                                                   const std::string& comm,
                                                                   double timeout_s,
                                                                   cudaStream_t stream) {
  DCP_CHECK_ARG(comm == "auto" || comm == "nccl" || comm == "mpi",
                "--comm must be auto, nccl or mpi, got '%s'", comm);
  if (comm == "mpi") {
    DCP_ASSIGN_OR_RETURN(auto staged, HostStagedCommunicator::Create(mpi, stream));
    return std::unique_ptr<Communicator>(std::move(staged));
  }
  std::string shared;
  DCP_ASSIGN_OR_RETURN(const bool share, RanksShareGpu(mpi, &shared));
  if (share) {
    if (comm == "nccl") {
      return DCP_ERROR(FailedPrecondition,
                       "--comm nccl needs one GPU per rank, but %s (NCCL refuses two ranks on one "
                       "device); use --comm mpi or auto, or start fewer ranks per GPU",
                       shared);
    }
    if (mpi.rank() == 0) {
      DCP_LOG(INFO) << "comm auto: " << shared
                    << "; collectives use MPI with host staging instead of NCCL";
    }
    DCP_ASSIGN_OR_RETURN(auto staged, HostStagedCommunicator::Create(mpi, stream));
    return std::unique_ptr<Communicator>(std::move(staged));
  }
  DCP_ASSIGN_OR_RETURN(auto nccl, NcclCommunicator::Create(mpi, timeout_s, stream));
  return std::unique_ptr<Communicator>(std::move(nccl));
}

}  // namespace dcp
