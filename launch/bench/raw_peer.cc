#include "launch/bench/raw_peer.h"

#include "core/status.h"

#if DCP_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include "collectives/cuda/nccl_status.h"
#include "runtime/cuda/cuda_device.h"
#include "core/cuda/cuda_status.h"
#endif

namespace dcp::bench {

#if DCP_WITH_CUDA
namespace {

class RawNccl final : public RawPeer {
 public:
  RawNccl(ncclComm_t comm, cudaStream_t stream, int rank, int world)
      : comm_(comm), stream_(stream), rank_(rank), world_(world) {}
  ~RawNccl() override {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
  }
  std::string name() const override { return "nccl (raw)"; }

  absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype) override {
    DCP_NCCL_CHECK(ncclAllGather(send, recv, count, NcclType(dtype), comm_, stream_));
    return absl::OkStatus();
  }
  absl::Status ReduceScatterSum(const void* send, void* recv, size_t count, DType dtype) override {
    DCP_NCCL_CHECK(ncclReduceScatter(send, recv, count, NcclType(dtype), ncclSum, comm_, stream_));
    return absl::OkStatus();
  }
  // As nccl-tests' alltoall: one group of W sends and W receives (the own block included).
  absl::Status AllToAll(const void* send, void* recv, size_t count, DType dtype) override {
    const size_t block = count * dtype_size(dtype);
    const auto* in = static_cast<const char*>(send);
    auto* out = static_cast<char*>(recv);
    DCP_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < world_; ++r) {
      DCP_NCCL_CHECK(ncclSend(in + r * block, count, NcclType(dtype), r, comm_, stream_));
      DCP_NCCL_CHECK(ncclRecv(out + r * block, count, NcclType(dtype), r, comm_, stream_));
    }
    DCP_NCCL_CHECK(ncclGroupEnd());
    return absl::OkStatus();
  }

 private:
  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_, world_;
};

}  // namespace
#endif

StreamHandle DeviceStream(BenchEnv& env) {
#if DCP_WITH_CUDA
  if (auto* cuda = dynamic_cast<CudaDevice*>(env.device)) return cuda->stream();
#endif
  (void)env;
  return nullptr;
}

absl::StatusOr<std::unique_ptr<RawPeer>> MakeRawPeer(BenchEnv& env) {
#if DCP_WITH_CUDA
  if (env.comm->name() != "nccl" || dynamic_cast<CudaDevice*>(env.device) == nullptr) {
    return std::unique_ptr<RawPeer>();
  }
  MpiCommunicator& mpi = *env.bootstrap;
  ncclUniqueId id{};
  absl::Status local = absl::OkStatus();
  if (mpi.rank() == 0) {
    local = NcclCodeToStatus(ncclGetUniqueId(&id), "ncclGetUniqueId", __FILE__, __LINE__);
  }
  DCP_RETURN_IF_ERROR(AgreeOnStatus(mpi, local));
  DCP_RETURN_IF_ERROR(mpi.HostBroadcast(&id, sizeof(id), 0));
  ncclComm_t comm = nullptr;
  local = NcclCodeToStatus(ncclCommInitRank(&comm, mpi.world_size(), id, mpi.rank()),
                           "ncclCommInitRank (raw peer)", __FILE__, __LINE__);
  DCP_RETURN_IF_ERROR(AgreeOnStatus(mpi, local));
  return std::unique_ptr<RawPeer>(std::make_unique<RawNccl>(
      comm, static_cast<cudaStream_t>(DeviceStream(env)), mpi.rank(), mpi.world_size()));
#else
  (void)env;
  return std::unique_ptr<RawPeer>();
#endif
}

}  // namespace dcp::bench
