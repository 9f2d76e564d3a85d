#include "launch/distribute.h"

#include <algorithm>

#include "nlohmann/json.hpp"
#include "core/status.h"

namespace dcp::launch {
namespace {

// Scatter from rank 0: parts[r] (rank 0 only) goes to rank r, which expects `count` elements.
template <typename T>
absl::Status Scatter(Communicator& comm, const std::vector<std::vector<T>>* parts, size_t count,
                     std::vector<T>* received) {
  const int world = comm.world_size();
  std::vector<size_t> send_counts(world, 0), send_displs(world, 0);
  std::vector<size_t> recv_counts(world, 0), recv_displs(world, 0);
  std::vector<T> send;
  if (comm.rank() == 0) {
    size_t total = 0;
    for (int r = 0; r < world; ++r) {
      send_displs[r] = total;
      send_counts[r] = (*parts)[r].size();
      total += send_counts[r];
    }
    send.reserve(total);
    for (int r = 0; r < world; ++r) send.insert(send.end(), (*parts)[r].begin(), (*parts)[r].end());
  }
  recv_counts[0] = count;
  received->assign(count, T{});
  return comm.AllToAllV(send.data(), send_counts, send_displs, received->data(), recv_counts,
                        recv_displs, dtype_of<T>());
}

template <typename T>
absl::Status BroadcastVector(Communicator& comm, std::vector<T>* values) {
  int64_t size = static_cast<int64_t>(values->size());
  DCP_RETURN_IF_ERROR(comm.HostBroadcast(&size, sizeof(size), 0));
  values->resize(size_t(size));
  // MPI counts are ints: move at most 1 GiB per call.
  constexpr size_t kChunk = size_t{1} << 30;
  char* bytes = reinterpret_cast<char*>(values->data());
  const size_t total = values->size() * sizeof(T);
  for (size_t offset = 0; offset < total; offset += kChunk) {
    DCP_RETURN_IF_ERROR(comm.Broadcast(bytes + offset, std::min(kChunk, total - offset), 0));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ProblemHeader> BroadcastProblemHeader(Communicator& comm, const Problem* problem) {
  std::string text;
  if (comm.rank() == 0) {
    const ModelDims& m = problem->model;
    nlohmann::json header = {{"num_heads", m.num_heads},
                             {"kv_lora_rank", m.kv_lora_rank},
                             {"qk_nope_head_dim", m.qk_nope_head_dim},
                             {"qk_rope_head_dim", m.qk_rope_head_dim},
                             {"v_head_dim", m.v_head_dim},
                             {"softmax_scale", m.softmax_scale},
                             {"index_topk", problem->index_topk},
                             {"topk_width", problem->topk_width},
                             {"input_dtype", problem->input_dtype}};
    nlohmann::json requests = nlohmann::json::array();
    for (const RequestShape& r : problem->requests) requests.push_back({r.seq_len, r.query_len});
    header["requests"] = requests;
    header["topk_selects_every_causal_key"] = problem->topk_selects_every_causal_key;
    text = header.dump();
  }
  int64_t length = static_cast<int64_t>(text.size());
  DCP_RETURN_IF_ERROR(comm.HostBroadcast(&length, sizeof(length), 0));
  text.resize(size_t(length));
  DCP_RETURN_IF_ERROR(comm.HostBroadcast(text.data(), text.size(), 0));

  const nlohmann::json header = nlohmann::json::parse(text);
  ProblemHeader result;
  result.model.num_heads = header["num_heads"];
  result.model.kv_lora_rank = header["kv_lora_rank"];
  result.model.qk_nope_head_dim = header["qk_nope_head_dim"];
  result.model.qk_rope_head_dim = header["qk_rope_head_dim"];
  result.model.v_head_dim = header["v_head_dim"];
  result.model.softmax_scale = header["softmax_scale"];
  result.index_topk = header["index_topk"];
  result.topk_width = header["topk_width"];
  result.input_dtype = header["input_dtype"];
  for (const nlohmann::json& r : header["requests"]) {
    result.requests.push_back({r[0].get<int32_t>(), r[1].get<int32_t>()});
  }
  result.topk_selects_every_causal_key =
      header["topk_selects_every_causal_key"].get<std::vector<bool>>();
  return result;
}

absl::Status ScatterProblem(Communicator& comm, const Problem* problem, const ProblemHeader& header,
                            int interleave, int64_t first_request_id, RankWeights* weights,
                            RankBatch* batch) {
  const int world = comm.world_size(), rank = comm.rank();
  const ModelDims& m = header.model;
  const RankView view = RankView::Of(m, world, interleave, rank);
  const int64_t heads = view.num_heads(), width = m.latent_width();
  int64_t tokens = 0;
  for (const RequestShape& r : header.requests) tokens += r.query_len;

  // Rank 0 slices for everyone: weights, queries and each rank's cached rows (flattened).
  std::vector<RankWeights> weight_parts;
  std::vector<RankBatch> batch_parts;
  std::vector<std::vector<float>> w_uk, w_uv, q_nope, q_rope, cached;
  if (rank == 0) {
    for (int r = 0; r < world; ++r) {
      const RankView target = RankView::Of(m, world, interleave, r);
      RankWeights slice_weights = SliceWeights(*problem, target);
      RankBatch slice = SliceBatch(*problem, target, first_request_id);
      w_uk.push_back(std::move(slice_weights.w_uk));
      w_uv.push_back(std::move(slice_weights.w_uv));
      q_nope.push_back(std::move(slice.q_nope));
      q_rope.push_back(std::move(slice.q_rope));
      std::vector<float> rows;
      for (const std::vector<float>& request_rows : slice.cached_rows) {
        rows.insert(rows.end(), request_rows.begin(), request_rows.end());
      }
      cached.push_back(std::move(rows));
      if (r == 0) {
        batch->kv_new = std::move(slice.kv_new);
        batch->topk = std::move(slice.topk);
      }
    }
  }
  const int64_t uk = int64_t(m.qk_nope_head_dim) * m.kv_lora_rank;
  const int64_t uv = int64_t(m.kv_lora_rank) * m.v_head_dim;
  DCP_RETURN_IF_ERROR(Scatter(comm, &w_uk, size_t(heads * uk), &weights->w_uk));
  DCP_RETURN_IF_ERROR(Scatter(comm, &w_uv, size_t(heads * uv), &weights->w_uv));
  DCP_RETURN_IF_ERROR(
      Scatter(comm, &q_nope, size_t(tokens * heads * m.qk_nope_head_dim), &batch->q_nope));
  DCP_RETURN_IF_ERROR(
      Scatter(comm, &q_rope, size_t(tokens * heads * m.qk_rope_head_dim), &batch->q_rope));

  batch->requests.clear();
  int64_t local_rows = 0;
  for (size_t i = 0; i < header.requests.size(); ++i) {
    const RequestShape& r = header.requests[i];
    batch->requests.push_back(BatchRequest{first_request_id + int64_t(i), r.seq_len, r.query_len});
    local_rows += view.layout.local_length(r.seq_len - r.query_len, rank);
  }
  std::vector<float> rows;
  DCP_RETURN_IF_ERROR(Scatter(comm, &cached, size_t(local_rows * width), &rows));
  batch->cached_rows.assign(header.requests.size(), {});
  int64_t offset = 0;
  for (size_t i = 0; i < header.requests.size(); ++i) {
    const RequestShape& r = header.requests[i];
    const int64_t count = view.layout.local_length(r.seq_len - r.query_len, rank) * width;
    batch->cached_rows[i].assign(rows.begin() + offset, rows.begin() + offset + count);
    offset += count;
  }

  DCP_RETURN_IF_ERROR(BroadcastVector(comm, &batch->kv_new));
  DCP_RETURN_IF_ERROR(BroadcastVector(comm, &batch->topk));
  batch->topk_width = header.topk_width;
  DCP_CHECK_ARG(int64_t(batch->kv_new.size()) == tokens * width &&
                    int64_t(batch->topk.size()) == tokens * header.topk_width,
                "problem broadcast delivered %d KV and %d top-k values, expected %d and %d",
                batch->kv_new.size(), batch->topk.size(), tokens * width,
                tokens * header.topk_width);
  return absl::OkStatus();
}

absl::Status GatherOutputs(Communicator& comm, int64_t num_tokens, int heads_per_rank,
                           int v_head_dim, const std::vector<float>& out,
                           const std::vector<float>& lse, std::vector<float>* all_out,
                           std::vector<float>* all_lse) {
  const int world = comm.world_size(), rank = comm.rank();
  const int64_t heads = int64_t(heads_per_rank) * world;
  // Gather to rank 0: every rank sends its block to 0 only.
  const auto gather = [&](const std::vector<float>& mine, std::vector<float>* all) {
    std::vector<size_t> send_counts(world, 0), send_displs(world, 0);
    std::vector<size_t> recv_counts(world, 0), recv_displs(world, 0);
    send_counts[0] = mine.size();
    if (rank == 0) {
      for (int r = 0; r < world; ++r) {
        recv_counts[r] = mine.size();
        recv_displs[r] = r * mine.size();
      }
      all->assign(mine.size() * world, 0.0f);
    } else {
      all->clear();
    }
    return comm.AllToAllV(mine.data(), send_counts, send_displs, all->data(), recv_counts,
                          recv_displs, DType::kF32);
  };
  std::vector<float> blocks_out, blocks_lse;
  DCP_RETURN_IF_ERROR(gather(out, &blocks_out));
  DCP_RETURN_IF_ERROR(gather(lse, &blocks_lse));
  all_out->clear();
  all_lse->clear();
  if (rank != 0) return absl::OkStatus();
  // Block r is [T, Hl, Dv] of heads [r*Hl, (r+1)*Hl).
  all_out->resize(size_t(num_tokens * heads * v_head_dim));
  all_lse->resize(size_t(num_tokens * heads));
  const int64_t hl = heads_per_rank;
  for (int r = 0; r < world; ++r) {
    for (int64_t t = 0; t < num_tokens; ++t) {
      std::copy_n(&blocks_out[size_t(r) * out.size() + t * hl * v_head_dim], hl * v_head_dim,
                  &(*all_out)[(t * heads + r * hl) * v_head_dim]);
      std::copy_n(&blocks_lse[size_t(r) * lse.size() + t * hl], hl,
                  &(*all_lse)[t * heads + r * hl]);
    }
  }
  return absl::OkStatus();
}

}  // namespace dcp::launch
