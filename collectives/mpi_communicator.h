// Communicator over Open MPI on host buffers. Every collective is issued non-blocking and
// polled against a deadline, so a peer that never arrives turns into DeadlineExceeded here
// instead of a hang. The group is a duplicate of the given MPI communicator (errors returned,
// not fatal). BF16 sums use a user-defined MPI op that adds in fp32.
// Caveats for a program that embeds it:
//   - Open MPI 4.1 reports some errors of a non-blocking collective (MPI_ERR_TRUNCATE from
//     unequal sizes) through MPI_COMM_WORLD's error handler, not the duplicate's: set
//     MPI_ERRORS_RETURN on MPI_COMM_WORLD (dcp_run's bootstrap does), or they abort the job.
//   - Sizes are the callers' to agree on: a rank that passes another count or dtype than its
//     peers is not detected by this layer (dcp's own callers derive every size from the
//     agreed plan). A count past MPI's int limit is InvalidArgument.
//   - A Broadcast small enough to be sent eagerly completes on its root even when a peer
//     never calls; the next collective that needs that peer times out instead.
#pragma once

#include <mpi.h>

#include <climits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"

namespace dcp {

class MpiCommunicator final : public Communicator {
 public:
  // `comm` must be a valid intra-communicator (usually MPI_COMM_WORLD); MPI must be initialized.
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Create(MPI_Comm comm,
                                                                  double timeout_s);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  std::string name() const override { return "mpi"; }
  uint64_t max_count() const override { return INT_MAX; }  // MPI counts are int
  MPI_Comm mpi_comm() const { return comm_; }
  // The deadline of every later call (a launcher waits longer for work one rank does alone).
  double timeout_s() const { return timeout_s_; }
  void set_timeout_s(double timeout_s) { timeout_s_ = timeout_s; }

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
  absl::Status Barrier() override;
  absl::Status HostAllGather(int64_t value, absl::Span<int64_t> values) override;
  absl::Status HostBroadcast(void* data, size_t bytes, int root) override;
  [[noreturn]] void Abort(int exit_code) override;

 private:
  MpiCommunicator(MPI_Comm comm, int rank, int world_size, double timeout_s);
  // Waits for `request` until the deadline; `what` names the operation in errors.
  absl::Status Wait(MPI_Request* request, const char* what);
  absl::Status CheckUsable(const char* what) const;

  MPI_Comm comm_;
  int rank_;
  int world_size_;
  double timeout_s_;
  bool broken_ = false;
  std::vector<MPI_Request> abandoned_;  // timed-out requests, completed if peers arrive late
  std::string broken_reason_;
};

}  // namespace dcp
