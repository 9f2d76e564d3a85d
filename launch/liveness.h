// Which peers still answer, once a collective has timed out: the message that ends the job
// names the rank that stalled it where that can be known. Every rank keeps one receive posted
// for each peer on a private duplicate of the world; a rank that gives up sends each peer a
// synchronous message, which completes only when the peer's MPI progress engine matches it.
// A stopped (SIGSTOP), hung or dead peer never does, nor does one busy outside MPI for the
// whole wait; every peer waiting in a collective (the launcher polls its requests) answers.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace dcp::launch {

class LivenessProbe {
 public:
  // Collective over `world` (MPI_Comm_dup).
  static absl::StatusOr<std::unique_ptr<LivenessProbe>> Create(MPI_Comm world);
  // Cancels the posted receives (before MPI_Finalize).
  ~LivenessProbe();

  // The peers that did not answer within wait_s seconds, in rank order.
  std::vector<int> Silent(double wait_s);

 private:
  LivenessProbe(MPI_Comm comm, int rank, int world_size);
  MPI_Comm comm_;
  int rank_, world_size_;
  std::vector<MPI_Request> receives_;  // [W]: from each peer (null for this rank)
  std::vector<char> inbox_;            // [W] one byte each
};

}  // namespace dcp::launch
