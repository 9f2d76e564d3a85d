// Moving a problem file's batch from rank 0 to the group, and the results back. Rank 0 slices
// the problem per rank (its heads' queries and weights, the cached rows it owns) and scatters
// the slices; every rank receives the whole of what every rank needs (new tokens' KV, top-k).
// All transfers go through a host Communicator, so a missing peer is a timeout, not a hang.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "launch/problem.h"
#include "launch/rank_batch.h"

namespace dcp::launch {

// What every rank must know of the problem before its share arrives.
struct ProblemHeader {
  ModelDims model;
  int index_topk = 0;
  int topk_width = 0;  // 0 = no topk_indices
  std::vector<RequestShape> requests;
  std::vector<bool> topk_selects_every_causal_key;  // per request, as Problem's
  std::string input_dtype;
};

// Rank 0 passes the problem it loaded; the others pass nullptr.
absl::StatusOr<ProblemHeader> BroadcastProblemHeader(Communicator& comm, const Problem* problem);

// Every rank's weights and batch (request ids first_request_id + i). `interleave` is the KV
// interleave; the head split is even over the world.
absl::Status ScatterProblem(Communicator& comm, const Problem* problem, const ProblemHeader& header,
                            int interleave, int64_t first_request_id, RankWeights* weights,
                            RankBatch* batch);

// Gathers every rank's out [T, Hl, Dv] and lse [T, Hl] to rank 0 as out [T, H, Dv] and
// lse [T, H] (heads rank-major, as they were split). Other ranks get empty vectors.
absl::Status GatherOutputs(Communicator& comm, int64_t num_tokens, int heads_per_rank,
                           int v_head_dim, const std::vector<float>& out,
                           const std::vector<float>& lse, std::vector<float>* all_out,
                           std::vector<float>* all_lse);

}  // namespace dcp::launch
