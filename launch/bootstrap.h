// Process start-up of a DCP rank under mpirun: MPI, the rank's place in the world and on its
// node, its device and its communicators. The DCP group is the whole MPI world.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "collectives/mpi_communicator.h"
#include "runtime/device.h"

namespace dcp::launch {

struct ProcessInfo {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_size = 1;  // among the ranks of this node
};

// MPI_Init_thread (funneled: only the main thread calls MPI) unless already initialized, then
// the rank of this process is set for error messages and logs.
absl::StatusOr<ProcessInfo> InitMpi(int* argc, char*** argv);
// MPI_Finalize unless already finalized.
void FinalizeMpi();

// Whether every rank was started with rank 0's arguments (argv[1..]): flags are read on every
// rank from its own command line, so ranks started MPMD (mpirun's "a : b" form) with other
// flags would plan, scatter or measure with other settings. An error naming the cause on the
// ranks whose arguments differ, OK on the others: callers agree on it (AgreeOnStatus) before
// reading a flag. Every rank must call it (one host all-gather on `comm`).
absl::Status SameCommandLineOnEveryRank(Communicator& comm, int argc, char** argv,
                                        const char* tool);

// The rank's device: "cpu" (host memory, F32 storage) or "cuda" (GPU local_rank % count, on
// builds with CUDA; an error elsewhere).
absl::StatusOr<std::unique_ptr<Device>> MakeRankDevice(const std::string& kind,
                                                       const ProcessInfo& process);

// The communicator DcpContext runs on, matching the device's memory. CPU device: "mpi" (or
// "auto"): a duplicate of `bootstrap`'s group with the given timeout. CUDA device (CUDA builds):
// "nccl", "mpi" (staged through host memory) or "auto", from the CUDA communicator factory,
// bootstrapped over `bootstrap`, which must outlive the result.
absl::StatusOr<std::unique_ptr<Communicator>> MakeRankCommunicator(const std::string& kind,
                                                                   MpiCommunicator& bootstrap,
                                                                   Device& device,
                                                                   double timeout_s);

#if DCP_WITH_CUDA
// bootstrap_cuda.cc: the CUDA halves of the two functions above.
absl::StatusOr<std::unique_ptr<Device>> MakeCudaRankDevice(const ProcessInfo& process);
absl::StatusOr<std::unique_ptr<Communicator>> MakeCudaRankCommunicator(const std::string& kind,
                                                                       MpiCommunicator& bootstrap,
                                                                       Device& device,
                                                                       double timeout_s);
#endif

}  // namespace dcp::launch
