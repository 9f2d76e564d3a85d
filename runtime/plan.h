// The plan of one batch, built by the rank-0 planner and broadcast to every rank (DESIGN.md
// section 5): the route, the requests in execution order (decodes first), and the dense
// route's context chunks over the workspace. It travels as bytes with a version and a
// checksum; a rank that receives a damaged or different plan fails the batch.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/batch.h"
#include "workspace/chunk_plan.h"
#include "workspace/workspace_size.h"

namespace dcp {

struct PlannedRequest {
  int64_t request_id = 0;
  int32_t batch_index = 0;  // position in the caller's batch
  int32_t seq_len = 0;
  int32_t query_len = 0;
  int64_t token_begin = 0;         // first token in execution order (decodes first)
  int64_t caller_token_begin = 0;  // first token in the caller's order
  bool is_decode = false;
  int32_t context_len() const { return seq_len - query_len; }
};

struct Plan {
  // 2: the checksum hashes 8-byte words; 3: topk_width; 4: settings; 5: MessageHash64 checksum
  static constexpr uint32_t kVersion = 5;

  Route route = Route::kSparseMqa;
  int32_t num_decodes = 0;
  int32_t num_prefills = 0;
  int64_t num_tokens = 0;         // all query tokens
  int64_t num_decode_tokens = 0;  // tokens of the decodes (the first ones in execution order)
  int32_t topk_width = 0;         // the step's top-k width (PlannerConfig::topk_width): ranks
                                  // that disagree on it have different plans
  uint64_t settings = 0;          // SettingsFingerprint of the planning rank's options
  std::vector<PlannedRequest> requests;  // decodes, then prefills, each in caller order
  WorkspaceSize workspace;
  // Dense route only: chunks of the prefills' context; a segment's `request` indexes the
  // prefills, i.e. requests[num_decodes + request].
  std::vector<ContextChunk> chunks;
};

// Little-endian words: magic, version, payload length, FNV-1a 64 checksum, payload.
std::string SerializePlan(const Plan& plan);
// Checks magic, version, length and checksum before decoding; errors say which failed.
absl::StatusOr<Plan> DeserializePlan(std::string_view bytes);

// FORMATS.md plan dump: one line of JSON.
std::string PlanToJson(const Plan& plan, int world_size);

}  // namespace dcp
