// A group of one rank on host memory: every collective is a copy. It runs the same worker code
// as a real group, which gives each process a single-rank reference of any batch.
#pragma once

#include <string>

#include "collectives/communicator.h"

namespace dcp {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  std::string name() const override { return "local"; }

  absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype) override;
  absl::Status AllGatherV(const void* send, size_t send_count, void* recv,
                          absl::Span<const size_t> counts, DType dtype) override;
  absl::Status ReduceScatterSum(const void* send, void* recv, size_t count,
                                DType dtype) override;
  absl::Status AllToAll(const void* send, void* recv, size_t count, DType dtype) override;
  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                         absl::Span<const size_t> send_displs, void* recv,
                         absl::Span<const size_t> recv_counts,
                         absl::Span<const size_t> recv_displs, DType dtype) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Barrier() override { return absl::OkStatus(); }
  absl::Status HostAllGather(int64_t value, absl::Span<int64_t> values) override;
  absl::Status HostBroadcast(void* data, size_t bytes, int root) override;
  [[noreturn]] void Abort(int exit_code) override;
};

}  // namespace dcp
