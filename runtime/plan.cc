#include "runtime/plan.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "attention/attention_params.h"
#include "core/message_hash.h"
#include "core/status.h"

namespace dcp {
namespace {

constexpr uint64_t kMagic = 0x4e414c50504344ull;  // "DCPPLAN"

// MessageHash64 over the payload's 8-byte words (every field is one; a byte-wise hash was a
// chain of one multiply per byte, ~5 us for the plan of 64 decodes). A trailing partial word,
// which a damaged length could leave, is hashed zero-padded, with the length.
uint64_t PayloadHash(std::string_view bytes) {
  MessageHash64 hash;
  hash.AddBytes(bytes);
  return hash.value();
}

class Writer {
 public:
  void Put(int64_t value) {
    char word[8];
    std::memcpy(word, &value, 8);
    bytes_.append(word, 8);
  }
  std::string& bytes() { return bytes_; }

 private:
  std::string bytes_;
};

class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  absl::StatusOr<int64_t> Get() {
    if (bytes_.size() < 8) return DCP_ERROR(DataLoss, "plan bytes end early");
    int64_t value;
    std::memcpy(&value, bytes_.data(), 8);
    bytes_.remove_prefix(8);
    return value;
  }
  // A count that must fit what is left (guards allocations against damaged input).
  absl::StatusOr<int64_t> GetCount(int64_t words_per_item) {
    DCP_ASSIGN_OR_RETURN(int64_t count, Get());
    if (count < 0 || count * words_per_item * 8 > static_cast<int64_t>(bytes_.size())) {
      return DCP_ERROR(DataLoss, "plan count %d does not fit the bytes left", count);
    }
    return count;
  }
  bool empty() const { return bytes_.empty(); }

 private:
  std::string_view bytes_;
};

}  // namespace

std::string SerializePlan(const Plan& plan) {
  Writer payload;
  payload.Put(static_cast<int64_t>(plan.route));
  payload.Put(plan.num_decodes);
  payload.Put(plan.num_prefills);
  payload.Put(plan.num_tokens);
  payload.Put(plan.num_decode_tokens);
  payload.Put(plan.topk_width);
  payload.Put(static_cast<int64_t>(plan.settings));
  payload.Put(static_cast<int64_t>(plan.requests.size()));
  for (const PlannedRequest& r : plan.requests) {
    payload.Put(r.request_id);
    payload.Put(r.batch_index);
    payload.Put(r.seq_len);
    payload.Put(r.query_len);
    payload.Put(r.token_begin);
    payload.Put(r.caller_token_begin);
    payload.Put(r.is_decode ? 1 : 0);
  }
  payload.Put(plan.workspace.rows_per_chunk);
  payload.Put(plan.workspace.local_rows);
  payload.Put(plan.workspace.total_rows);
  payload.Put(plan.workspace.row_width);
  payload.Put(static_cast<int64_t>(plan.chunks.size()));
  for (const ContextChunk& chunk : plan.chunks) {
    payload.Put(chunk.num_keys);
    payload.Put(chunk.padded_rows);
    payload.Put(static_cast<int64_t>(chunk.segments.size()));
    for (const ChunkSegment& s : chunk.segments) {
      payload.Put(s.request);
      payload.Put(s.begin);
      payload.Put(s.end);
      payload.Put(s.padded_offset);
      payload.Put(s.key_offset);
    }
  }
  Writer header;
  header.Put(static_cast<int64_t>(kMagic));
  header.Put(Plan::kVersion);
  header.Put(static_cast<int64_t>(payload.bytes().size()));
  header.Put(static_cast<int64_t>(PayloadHash(payload.bytes())));
  return header.bytes() + payload.bytes();
}

absl::StatusOr<Plan> DeserializePlan(std::string_view bytes) {
  Reader header(bytes.substr(0, std::min<size_t>(bytes.size(), 32)));
  DCP_ASSIGN_OR_RETURN(int64_t magic, header.Get());
  DCP_CHECK_ARG(static_cast<uint64_t>(magic) == kMagic, "plan bytes do not start with the plan magic");
  DCP_ASSIGN_OR_RETURN(int64_t version, header.Get());
  DCP_CHECK_ARG(version == Plan::kVersion, "plan version %d, this rank speaks version %d",
                version, Plan::kVersion);
  DCP_ASSIGN_OR_RETURN(int64_t length, header.Get());
  DCP_ASSIGN_OR_RETURN(int64_t checksum, header.Get());
  std::string_view payload = bytes.substr(32);
  DCP_CHECK_ARG(length == static_cast<int64_t>(payload.size()),
                "plan payload is %d bytes, its header says %d", payload.size(), length);
  if (static_cast<uint64_t>(checksum) != PayloadHash(payload)) {
    return DCP_ERROR(DataLoss, "plan checksum mismatch: the broadcast plan was damaged");
  }

  Reader in(payload);
  Plan plan;
  DCP_ASSIGN_OR_RETURN(int64_t route, in.Get());
  DCP_CHECK_ARG(route == 0 || route == 1, "plan route %d unknown", route);
  plan.route = static_cast<Route>(route);
  DCP_ASSIGN_OR_RETURN(int64_t num_decodes, in.Get());
  DCP_ASSIGN_OR_RETURN(int64_t num_prefills, in.Get());
  plan.num_decodes = static_cast<int32_t>(num_decodes);
  plan.num_prefills = static_cast<int32_t>(num_prefills);
  DCP_ASSIGN_OR_RETURN(plan.num_tokens, in.Get());
  DCP_ASSIGN_OR_RETURN(plan.num_decode_tokens, in.Get());
  DCP_ASSIGN_OR_RETURN(int64_t topk_width, in.Get());
  DCP_CHECK_ARG(topk_width >= 0 && topk_width <= kMaxTopkWidth, "plan top-k width %d out of range",
                topk_width);
  plan.topk_width = static_cast<int32_t>(topk_width);
  DCP_ASSIGN_OR_RETURN(int64_t settings, in.Get());
  plan.settings = static_cast<uint64_t>(settings);
  DCP_ASSIGN_OR_RETURN(int64_t num_requests, in.GetCount(7));
  plan.requests.resize(num_requests);
  for (PlannedRequest& r : plan.requests) {
    int64_t word;
    DCP_ASSIGN_OR_RETURN(r.request_id, in.Get());
    DCP_ASSIGN_OR_RETURN(word, in.Get());
    r.batch_index = static_cast<int32_t>(word);
    DCP_ASSIGN_OR_RETURN(word, in.Get());
    r.seq_len = static_cast<int32_t>(word);
    DCP_ASSIGN_OR_RETURN(word, in.Get());
    r.query_len = static_cast<int32_t>(word);
    DCP_ASSIGN_OR_RETURN(r.token_begin, in.Get());
    DCP_ASSIGN_OR_RETURN(r.caller_token_begin, in.Get());
    DCP_ASSIGN_OR_RETURN(word, in.Get());
    r.is_decode = word != 0;
  }
  DCP_ASSIGN_OR_RETURN(plan.workspace.rows_per_chunk, in.Get());
  DCP_ASSIGN_OR_RETURN(plan.workspace.local_rows, in.Get());
  DCP_ASSIGN_OR_RETURN(plan.workspace.total_rows, in.Get());
  DCP_ASSIGN_OR_RETURN(int64_t width, in.Get());
  plan.workspace.row_width = static_cast<int>(width);
  DCP_ASSIGN_OR_RETURN(int64_t num_chunks, in.GetCount(3));
  plan.chunks.resize(num_chunks);
  for (ContextChunk& chunk : plan.chunks) {
    DCP_ASSIGN_OR_RETURN(chunk.num_keys, in.Get());
    DCP_ASSIGN_OR_RETURN(chunk.padded_rows, in.Get());
    DCP_ASSIGN_OR_RETURN(int64_t num_segments, in.GetCount(5));
    chunk.segments.resize(num_segments);
    for (ChunkSegment& s : chunk.segments) {
      DCP_ASSIGN_OR_RETURN(int64_t request, in.Get());
      s.request = static_cast<int32_t>(request);
      DCP_ASSIGN_OR_RETURN(s.begin, in.Get());
      DCP_ASSIGN_OR_RETURN(s.end, in.Get());
      DCP_ASSIGN_OR_RETURN(s.padded_offset, in.Get());
      DCP_ASSIGN_OR_RETURN(s.key_offset, in.Get());
    }
  }
  DCP_CHECK_ARG(in.empty(), "plan has trailing bytes");
  return plan;
}

std::string PlanToJson(const Plan& plan, int world_size) {
  return absl::StrFormat(
      "{\"route\": \"%s\", \"num_decodes\": %d, \"num_prefills\": %d, \"workspace\": "
      "{\"rows_S\": %d, \"total_rows\": %d, \"row_width\": %d}, \"chunks\": %d}",
      route_name(plan.route), plan.num_decodes, plan.num_prefills,
      plan.workspace.rows_per_chunk,
      world_size > 1 ? plan.workspace.rows_per_chunk + plan.workspace.rows_per_chunk / world_size
                     : plan.workspace.rows_per_chunk,
      plan.workspace.row_width, plan.chunks.size());
}

}  // namespace dcp
