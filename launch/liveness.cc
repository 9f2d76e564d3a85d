#include "launch/liveness.h"

#include <chrono>
#include <thread>

#include "collectives/mpi_status.h"
#include "core/status.h"

namespace dcp::launch {
namespace {
constexpr int kTag = 7301;
}  // namespace

absl::StatusOr<std::unique_ptr<LivenessProbe>> LivenessProbe::Create(MPI_Comm world) {
  MPI_Comm comm;
  DCP_MPI_CHECK(MPI_Comm_dup(world, &comm));
  DCP_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  int rank = 0, size = 0;
  DCP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  DCP_MPI_CHECK(MPI_Comm_size(comm, &size));
  std::unique_ptr<LivenessProbe> probe(new LivenessProbe(comm, rank, size));
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    DCP_MPI_CHECK(MPI_Irecv(&probe->inbox_[peer], 1, MPI_CHAR, peer, kTag, comm,
                            &probe->receives_[peer]));
  }
  return probe;
}

LivenessProbe::LivenessProbe(MPI_Comm comm, int rank, int world_size)
    : comm_(comm),
      rank_(rank),
      world_size_(world_size),
      receives_(size_t(world_size), MPI_REQUEST_NULL),
      inbox_(size_t(world_size), 0) {}

LivenessProbe::~LivenessProbe() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Request& request : receives_) {
    if (request == MPI_REQUEST_NULL) continue;
    int done = 0;
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);  // a probe that came in: nothing to cancel
    if (!done) {
      MPI_Cancel(&request);
      MPI_Wait(&request, MPI_STATUS_IGNORE);
    }
  }
  MPI_Comm_free(&comm_);
}

std::vector<int> LivenessProbe::Silent(double wait_s) {
  static const char kPing = 1;
  std::vector<MPI_Request> sends(size_t(world_size_), MPI_REQUEST_NULL);
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    if (MPI_Issend(&kPing, 1, MPI_CHAR, peer, kTag, comm_, &sends[peer]) != MPI_SUCCESS) {
      sends[peer] = MPI_REQUEST_NULL;
    }
  }
  std::vector<bool> answered(size_t(world_size_), false);
  answered[size_t(rank_)] = true;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  for (;;) {
    bool all = true;
    for (int peer = 0; peer < world_size_; ++peer) {
      if (answered[size_t(peer)] || sends[peer] == MPI_REQUEST_NULL) continue;
      int done = 0;
      if (MPI_Test(&sends[peer], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
        answered[size_t(peer)] = true;
      } else {
        all = false;
      }
    }
    // Keep answering peers that probe this rank too (the posted receives match on progress).
    for (MPI_Request& request : receives_) {
      int done = 0;
      if (request != MPI_REQUEST_NULL) MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    }
    if (all || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<int> silent;
  for (int peer = 0; peer < world_size_; ++peer) {
    if (!answered[size_t(peer)]) silent.push_back(peer);
  }
  return silent;  // the unanswered sends are abandoned: the job ends right after
}

}  // namespace dcp::launch
