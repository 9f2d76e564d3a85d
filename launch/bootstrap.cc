#include "launch/bootstrap.h"

#include <mpi.h>

#include <vector>

#include "collectives/mpi_status.h"
#include "core/message_hash.h"
#include "core/status.h"

namespace dcp::launch {

absl::StatusOr<ProcessInfo> InitMpi(int* argc, char*** argv) {
  int initialized = 0;
  DCP_MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    int provided = 0;
    DCP_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  }
  // Errors come back as codes (and then Statuses), never as an abort inside MPI.
  DCP_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  ProcessInfo info;
  DCP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &info.rank));
  DCP_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &info.world_size));
  set_current_rank(info.rank);
  MPI_Comm node = MPI_COMM_NULL;
  DCP_MPI_CHECK(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, info.rank, MPI_INFO_NULL, &node));
  DCP_MPI_CHECK(MPI_Comm_rank(node, &info.local_rank));
  DCP_MPI_CHECK(MPI_Comm_size(node, &info.local_size));
  DCP_MPI_CHECK(MPI_Comm_free(&node));
  return info;
}

void FinalizeMpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

absl::Status SameCommandLineOnEveryRank(Communicator& comm, int argc, char** argv,
                                        const char* tool) {
  MessageHash64 hash;  // the arguments, each followed by a separator no byte equals
  for (int i = 1; i < argc; ++i) {
    for (const char* c = argv[i]; *c != '\0'; ++c) hash.AddWord(static_cast<unsigned char>(*c));
    hash.AddWord(0x100u);
  }
  std::vector<int64_t> hashes(size_t(comm.world_size()));
  DCP_RETURN_IF_ERROR(
      comm.HostAllGather(static_cast<int64_t>(hash.value()), absl::MakeSpan(hashes)));
  DCP_CHECK_ARG(hashes[size_t(comm.rank())] == hashes[0],
                "this rank was started with other arguments than rank 0: every rank of %s needs "
                "the same command line",
                tool);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Device>> MakeRankDevice(const std::string& kind,
                                                       const ProcessInfo& process) {
  if (kind == "cpu") return MakeCpuDevice(DType::kF32);
  if (kind == "cuda") {
#if DCP_WITH_CUDA
    return MakeCudaRankDevice(process);
#else
    (void)process;
    return DCP_ERROR(InvalidArgument,
                     "--device cuda: this dcp_run was built without CUDA (configure with "
                     "-DDCP_WITH_CUDA=ON on a machine with nvcc and NCCL)");
#endif
  }
  return DCP_ERROR(InvalidArgument, "--device must be cpu or cuda, got '%s'", kind);
}

absl::StatusOr<std::unique_ptr<Communicator>> MakeRankCommunicator(const std::string& kind,
                                                                   MpiCommunicator& bootstrap,
                                                                   Device& device,
                                                                   double timeout_s) {
  if (kind != "mpi" && kind != "nccl" && kind != "auto") {
    return DCP_ERROR(InvalidArgument, "--comm must be mpi, nccl or auto, got '%s'", kind);
  }
  if (device.memory_space() == MemorySpace::kDevice) {
#if DCP_WITH_CUDA
    return MakeCudaRankCommunicator(kind, bootstrap, device, timeout_s);
#endif
  }
  if (kind == "nccl") {
    return DCP_ERROR(InvalidArgument,
                     "--comm nccl needs --device cuda (NCCL moves device "
                     "buffers; device '%s' keeps host memory)",
                     device.name());
  }
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<MpiCommunicator> comm,
                       MpiCommunicator::Create(bootstrap.mpi_comm(), timeout_s));
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace dcp::launch
