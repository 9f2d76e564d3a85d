#include "runtime/planner.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "core/logging.h"
#include "core/status.h"

namespace dcp {

absl::StatusOr<bool> ResolvePrefillBackend(const AttentionConfig& attention,
                                           const absl::Status& device_support) {
  const std::string& name = attention.prefill_backend;
  if (name == "none") return false;
  if (name == "auto") {
    if (device_support.ok()) return true;
    DCP_LOG(WARNING) << "no prefill backend is available (" << device_support.message()
                     << "); every batch takes the sparse MQA route";
    return false;
  }
  if (name == "native" || name == "cudnn") {
    if (!device_support.ok()) {
      return DCP_ERROR(FailedPrecondition,
                       "attention.prefill_backend '%s' was requested but is unavailable: %s", name,
                       device_support.message());
    }
    return true;
  }
  return DCP_ERROR(InvalidArgument,
                   "attention.prefill_backend '%s' is not available (choose auto, none, native or "
                   "cudnn)",
                   name);
}

absl::Status ValidateBatch(absl::Span<const BatchRequest> batch, const SchedulerConfig& scheduler) {
  DCP_CHECK_ARG(static_cast<int64_t>(batch.size()) <= scheduler.max_num_seqs,
                "batch has %d requests, more than scheduler.max_num_seqs = %d", batch.size(),
                scheduler.max_num_seqs);
  absl::flat_hash_set<int64_t> ids;
  ids.reserve(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchRequest& r = batch[i];
    DCP_CHECK_ARG(r.seq_len >= 1, "request %d (id %d): seq_len %d must be >= 1", i, r.request_id,
                  r.seq_len);
    DCP_CHECK_ARG(r.seq_len <= scheduler.max_model_len,
                  "request %d (id %d): seq_len %d exceeds scheduler.max_model_len = %d", i,
                  r.request_id, r.seq_len, scheduler.max_model_len);
    DCP_CHECK_ARG(r.query_len >= 1 && r.query_len <= r.seq_len,
                  "request %d (id %d): query_len %d must be in [1, seq_len = %d]", i,
                  r.request_id, r.query_len, r.seq_len);
    DCP_CHECK_ARG(ids.insert(r.request_id).second, "request id %d appears twice in the batch",
                  r.request_id);
  }
  return absl::OkStatus();
}

Route ChooseRoute(const AttentionConfig& attention, bool dense_mha_available, int num_prefills,
                  int max_prefill_seq_len) {
  const bool use_mha = attention.is_sparse && dense_mha_available && num_prefills > 0 &&
                       max_prefill_seq_len <= attention.index_topk && !attention.force_mqa;
  return use_mha ? Route::kDenseMha : Route::kSparseMqa;
}

namespace {

// The batch's route by the seed's rule (ChooseRoute over its prefills); `num_decodes` gets its
// decode count. The one place BuildPlan and TopkRowsRead take the route from.
Route BatchRoute(absl::Span<const BatchRequest> batch, const PlannerConfig& config,
                 int& num_decodes) {
  int num_prefills = 0, max_prefill_seq_len = 0;
  num_decodes = 0;
  for (const BatchRequest& r : batch) {
    if (r.query_len <= config.scheduler.decode_threshold) {
      ++num_decodes;
    } else {
      ++num_prefills;
      max_prefill_seq_len = std::max(max_prefill_seq_len, r.seq_len);
    }
  }
  AttentionConfig attention = config.attention;
  if (config.topk_width > 0)
    attention.index_topk = std::min(attention.index_topk, config.topk_width);
  return ChooseRoute(attention, config.dense_mha_available, num_prefills, max_prefill_seq_len);
}

}  // namespace

TopkRows TopkRowsRead(absl::Span<const BatchRequest> batch, const PlannerConfig& config) {
  int num_decodes = 0;
  const Route route = BatchRoute(batch, config, num_decodes);
  TopkRows rows;
  int64_t token = 0;
  bool first = true;
  for (const BatchRequest& r : batch) {
    if (route == Route::kSparseMqa || r.query_len <= config.scheduler.decode_threshold) {
      if (first) rows.begin = token;
      first = false;
      rows.end = token + r.query_len;
    }
    token += r.query_len;
  }
  return rows;
}

absl::StatusOr<Plan> BuildPlan(absl::Span<const BatchRequest> batch, const PlannerConfig& config) {
  DCP_RETURN_IF_ERROR(ValidateBatch(batch, config.scheduler));
  Plan plan;
  plan.workspace = config.workspace;
  plan.topk_width = config.topk_width;
  plan.settings = config.settings;

  std::vector<int64_t> caller_begin(batch.size() + 1, 0);
  for (size_t i = 0; i < batch.size(); ++i) caller_begin[i + 1] = caller_begin[i] + batch[i].query_len;
  plan.num_tokens = caller_begin.back();

  for (int pass = 0; pass < 2; ++pass) {  // decodes, then prefills
    for (size_t i = 0; i < batch.size(); ++i) {
      const bool is_decode = batch[i].query_len <= config.scheduler.decode_threshold;
      if (is_decode != (pass == 0)) continue;
      PlannedRequest r;
      r.request_id = batch[i].request_id;
      r.batch_index = static_cast<int32_t>(i);
      r.seq_len = batch[i].seq_len;
      r.query_len = batch[i].query_len;
      r.caller_token_begin = caller_begin[i];
      r.token_begin = plan.requests.empty()
                          ? 0
                          : plan.requests.back().token_begin + plan.requests.back().query_len;
      r.is_decode = is_decode;
      if (is_decode) {
        ++plan.num_decodes;
        plan.num_decode_tokens += r.query_len;
      } else {
        ++plan.num_prefills;
      }
      plan.requests.push_back(r);
    }
  }

  int num_decodes = 0;
  plan.route = BatchRoute(batch, config, num_decodes);
  if (plan.route == Route::kDenseMha) {
    std::vector<int64_t> context_lengths;
    for (int p = 0; p < plan.num_prefills; ++p) {
      context_lengths.push_back(plan.requests[plan.num_decodes + p].context_len());
    }
    DCP_ASSIGN_OR_RETURN(plan.chunks, PlanContextChunks(context_lengths,
                                                        config.workspace.rows_per_chunk,
                                                        config.layout));
  }
  return plan;
}

absl::StatusOr<Plan> ExchangePlan(Communicator& comm, absl::Span<const BatchRequest> batch,
                                  const PlannerConfig& config, const absl::Status& local,
                                  absl::FunctionRef<absl::Status(const Plan&)> then,
                                  bool damage_for_testing) {
  // Every rank plans from its own view; rank 0's plan is the one that runs.
  absl::StatusOr<Plan> own = local.ok() ? BuildPlan(batch, config) : local;
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm, own.status()));
  // A world of one has no other view to check against: its plan is the one that runs (the
  // testing hook still sends it through the bytes, so the check is tested at any W).
  if (comm.world_size() == 1 && !damage_for_testing) {
    DCP_RETURN_IF_ERROR(then(*own));
    return own;
  }

  // One frame: the length, then the plan's first bytes; a plan longer than the frame sends the
  // rest in a second broadcast.
  constexpr size_t kHead = sizeof(int64_t), kFirst = kPlanFrameBytes - kHead;
  std::string frame(kPlanFrameBytes, '\0');
  std::string bytes;
  if (comm.rank() == 0) {
    bytes = SerializePlan(*own);
    if (damage_for_testing) bytes[bytes.size() / 2] ^= 0x5a;
    const int64_t length = static_cast<int64_t>(bytes.size());
    std::memcpy(frame.data(), &length, kHead);
    std::memcpy(frame.data() + kHead, bytes.data(), std::min(bytes.size(), kFirst));
  }
  DCP_RETURN_IF_ERROR(comm.HostBroadcast(frame.data(), frame.size(), 0));
  int64_t length = 0;
  std::memcpy(&length, frame.data(), kHead);
  absl::Status check = absl::OkStatus();
  if (length < 0 || length > (int64_t{1} << 31)) {
    // Every rank reads the same frame, so every rank stops here: no broadcast is left waiting.
    check = DCP_ERROR(DataLoss, "the plan from rank 0 claims %d bytes", length);
  } else {
    bytes.resize(static_cast<size_t>(length));
    std::memcpy(bytes.data(), frame.data() + kHead, std::min(bytes.size(), kFirst));
    if (bytes.size() > kFirst) {
      DCP_RETURN_IF_ERROR(comm.HostBroadcast(bytes.data() + kFirst, bytes.size() - kFirst, 0));
    }
  }

  absl::StatusOr<Plan> received = check.ok() ? DeserializePlan(bytes) : check;
  check = received.status();
  // The checked bytes against this rank's own plan in the same form (rank 0 sent its own;
  // DeserializePlan took every byte, so equal bytes are equal plans).
  if (check.ok() && received->settings != own->settings) {
    check = DCP_ERROR(FailedPrecondition,
                      "this rank was created with options that differ from rank 0's (model "
                      "dimensions, interleave, combine, scheduler limits, decode threshold, "
                      "attention options or KV cache format): every rank of a group needs the "
                      "same ones");
  }
  if (check.ok() && (comm.rank() != 0 || damage_for_testing) && bytes != SerializePlan(*own)) {
    check = DCP_ERROR(FailedPrecondition,
                      "the plan from rank 0 differs from this rank's view of the batch "
                      "(different requests, lengths or configuration on some rank)");
  }
  if (check.ok()) check = then(*received);
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm, check));
  return received;
}

absl::StatusOr<Plan> ExchangePlan(Communicator& comm, absl::Span<const BatchRequest> batch,
                                  const PlannerConfig& config, bool damage_for_testing) {
  return ExchangePlan(
      comm, batch, config, absl::OkStatus(), [](const Plan&) { return absl::OkStatus(); },
      damage_for_testing);
}

}  // namespace dcp
