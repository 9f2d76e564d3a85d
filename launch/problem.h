// The problem file of `dcp_run --problem` (FORMATS.md): one batch of one attention layer with
// every input, read by rank 0, validated in full, then sliced per rank. Float inputs may be
// F32 or BF16 and are held as F32 (exact); the model dimensions are read off the shapes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "launch/batch_spec.h"
#include "launch/rank_batch.h"
#include "launch/safetensors.h"
#include "runtime/config.h"

namespace dcp::launch {

struct Problem {
  ModelDims model;     // H, R, Dn, Dr, Dv from the shapes; softmax_scale from the metadata
  int index_topk = 0;  // metadata, else the width of topk_indices, else the configured value
  std::vector<RequestShape> requests;  // file order
  std::vector<float> q_nope;           // [T, H, Dn]
  std::vector<float> q_rope;           // [T, H, Dr]
  std::vector<float> kv;               // [N, R + Dr] every request's sequence, [kv_c | k_pe]
  std::vector<float> w_uk;             // [H, Dn, R]
  std::vector<float> w_uv;             // [H, R, Dv]
  std::vector<int32_t> topk;           // [T, topk_width]; empty when the file has none
  int topk_width = 0;
  // Per request: its top-k rows select every causal position (true without topk_indices). The
  // dense route attends to every causal key of a prefill, so it computes what the rows say only
  // where this holds.
  std::vector<bool> topk_selects_every_causal_key;
  std::string input_dtype;  // "F32", "BF16" or "mixed" (for the summary)

  int64_t num_tokens() const;
  int64_t num_rows() const;
};

// Validates everything FORMATS.md requires: names, dtypes, ranks and agreeing shapes, lengths
// (seq_len >= 1, 1 <= query_len <= seq_len, T and N the sums), finite values, top-k indices
// (-1 or a causal position, no repeats) and, without top-k, seq_len <= index_topk.
// `name` is used in messages; `configured_topk` is the config's index_topk.
absl::StatusOr<Problem> ProblemFromFile(const SafetensorsFile& file, std::string_view name,
                                        int configured_topk);
absl::StatusOr<Problem> LoadProblem(const std::string& path, int configured_topk);

// Checks one batch's top-k rows ([T, width], tokens in request order) against its requests.
absl::Status ValidateTopk(const std::vector<RequestShape>& requests,
                          const std::vector<int32_t>& topk, int width, std::string_view what);

// This rank's share of the problem (request ids first_request_id + i, in file order).
RankWeights SliceWeights(const Problem& problem, const RankView& view);
RankBatch SliceBatch(const Problem& problem, const RankView& view, int64_t first_request_id);

}  // namespace dcp::launch
