#include "launch/problem.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "core/logging.h"
#include "core/status.h"
#include "launch/limits.h"

namespace dcp::launch {
namespace {

constexpr const char* kFloatTensors[] = {"q_nope", "q_rope", "kv_c", "k_pe", "w_uk", "w_uv"};
constexpr const char* kIntTensors[] = {"seq_lens", "query_lens", "topk_indices"};

// The tensor `tensor_name` of the file, checked for rank and dtype class.
absl::StatusOr<const Tensor*> Get(const SafetensorsFile& file, std::string_view file_name,
                                  const std::string& tensor_name, size_t rank, bool is_float,
                                  bool optional = false) {
  auto it = file.tensors.find(tensor_name);
  if (it == file.tensors.end()) {
    if (optional) return nullptr;
    return DCP_ERROR(InvalidArgument, "%s: missing tensor '%s'", file_name, tensor_name);
  }
  const Tensor& tensor = it->second;
  if (is_float && tensor.dtype == DType::kI32) {
    return DCP_ERROR(InvalidArgument, "%s: tensor '%s' must be F32 or BF16, got I32", file_name,
                     tensor_name);
  }
  if (!is_float && tensor.dtype != DType::kI32) {
    return DCP_ERROR(InvalidArgument, "%s: tensor '%s' must be I32, got %s", file_name, tensor_name,
                     dtype_name(tensor.dtype));
  }
  if (tensor.shape.size() != rank) {
    return DCP_ERROR(InvalidArgument, "%s: tensor '%s' must have %d dimensions, got shape %s",
                     file_name, tensor_name, rank, tensor.shape_string());
  }
  return &tensor;
}

// Names a shape mismatch: "tensor 'x' has shape [..], expected [..] (...)".
absl::Status ExpectShape(std::string_view file_name, const std::string& tensor_name,
                         const Tensor& tensor, const std::vector<int64_t>& expected,
                         std::string_view why) {
  if (tensor.shape == expected) return absl::OkStatus();
  return DCP_ERROR(InvalidArgument, "%s: tensor '%s' has shape %s, expected [%s] (%s)", file_name,
                   tensor_name, tensor.shape_string(), absl::StrJoin(expected, ", "), why);
}

// The float tensor as F32, rejecting NaN and infinities.
absl::StatusOr<std::vector<float>> ToFloats(std::string_view file_name, const std::string& name,
                                            const Tensor& tensor) {
  const int64_t count = tensor.num_elements();
  std::vector<float> values(size_t(count), 0.0f);
  if (tensor.dtype == DType::kF32) {
    if (count > 0) std::memcpy(values.data(), tensor.data.data(), size_t(count) * 4);
  } else {
    const bf16* source = tensor.as<bf16>();
    for (int64_t i = 0; i < count; ++i) values[i] = bf16_to_float(source[i]);
  }
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(values[i])) {
      return DCP_ERROR(InvalidArgument,
                       "%s: tensor '%s' holds a non-finite value (%g) at flat "
                       "index %d",
                       file_name, name, values[i], i);
    }
  }
  return values;
}

// The value of an optional metadata key; nullopt when absent (an empty value is present, and
// malformed).
std::optional<std::string> MetadataValue(const SafetensorsFile& file, const std::string& key) {
  auto it = file.metadata.find(key);
  if (it == file.metadata.end()) return std::nullopt;
  return it->second;
}

}  // namespace

int64_t Problem::num_tokens() const {
  int64_t tokens = 0;
  for (const RequestShape& r : requests) tokens += r.query_len;
  return tokens;
}

int64_t Problem::num_rows() const {
  int64_t rows = 0;
  for (const RequestShape& r : requests) rows += r.seq_len;
  return rows;
}

absl::Status ValidateTopk(const std::vector<RequestShape>& requests,
                          const std::vector<int32_t>& topk, int width, std::string_view what) {
  int32_t max_seq_len = 0;
  for (const RequestShape& r : requests) max_seq_len = std::max(max_seq_len, r.seq_len);
  // seen[j] == t + 1 when token t already selected position j.
  std::vector<int64_t> seen(size_t(max_seq_len), 0);
  int64_t t = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const int64_t context = requests[i].seq_len - requests[i].query_len;
    for (int64_t k = 0; k < requests[i].query_len; ++k, ++t) {
      const int64_t position = context + k;
      const int32_t* row = &topk[size_t(t * width)];
      for (int c = 0; c < width; ++c) {
        const int32_t j = row[c];
        if (j == -1) continue;
        if (j < 0 || j > position) {
          return DCP_ERROR(InvalidArgument,
                           "%s: topk_indices[%d][%d] = %d is not a causal position of request "
                           "%d (token %d sits at position %d; entries must be -1 or in [0, %d])",
                           what, t, c, j, i, t, position, position);
        }
        if (seen[size_t(j)] == t + 1) {
          return DCP_ERROR(InvalidArgument,
                           "%s: topk_indices[%d] selects position %d more than once (column %d)",
                           what, t, j, c);
        }
        seen[size_t(j)] = t + 1;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Problem> ProblemFromFile(const SafetensorsFile& file, std::string_view name,
                                        int configured_topk) {
  std::set<std::string> known;
  for (const char* n : kFloatTensors) known.insert(n);
  for (const char* n : kIntTensors) known.insert(n);
  for (const auto& [tensor_name, tensor] : file.tensors) {
    if (!known.contains(tensor_name)) {
      return DCP_ERROR(InvalidArgument,
                       "%s: unexpected tensor '%s' (a problem file holds q_nope, q_rope, kv_c, "
                       "k_pe, w_uk, w_uv, seq_lens, query_lens and optionally topk_indices)",
                       name, tensor_name);
    }
  }
  DCP_ASSIGN_OR_RETURN(const Tensor* q_nope, Get(file, name, "q_nope", 3, true));
  DCP_ASSIGN_OR_RETURN(const Tensor* q_rope, Get(file, name, "q_rope", 3, true));
  DCP_ASSIGN_OR_RETURN(const Tensor* kv_c, Get(file, name, "kv_c", 2, true));
  DCP_ASSIGN_OR_RETURN(const Tensor* k_pe, Get(file, name, "k_pe", 2, true));
  DCP_ASSIGN_OR_RETURN(const Tensor* w_uk, Get(file, name, "w_uk", 3, true));
  DCP_ASSIGN_OR_RETURN(const Tensor* w_uv, Get(file, name, "w_uv", 3, true));
  DCP_ASSIGN_OR_RETURN(const Tensor* seq_lens, Get(file, name, "seq_lens", 1, false));
  DCP_ASSIGN_OR_RETURN(const Tensor* query_lens, Get(file, name, "query_lens", 1, false));
  DCP_ASSIGN_OR_RETURN(const Tensor* topk, Get(file, name, "topk_indices", 2, false, true));

  // Requests.
  const int64_t num_requests = seq_lens->shape[0];
  if (num_requests < 1) {
    return DCP_ERROR(InvalidArgument, "%s: seq_lens is empty: a batch needs a request", name);
  }
  DCP_RETURN_IF_ERROR(ExpectShape(name, "query_lens", *query_lens, {num_requests},
                                  "one per request, like seq_lens"));
  Problem problem;
  int64_t tokens = 0, rows = 0;
  for (int64_t i = 0; i < num_requests; ++i) {
    const int32_t seq_len = seq_lens->as<int32_t>()[i];
    const int32_t query_len = query_lens->as<int32_t>()[i];
    if (seq_len < 1) {
      return DCP_ERROR(InvalidArgument, "%s: seq_lens[%d] = %d, must be >= 1", name, i, seq_len);
    }
    if (query_len < 1 || query_len > seq_len) {
      return DCP_ERROR(InvalidArgument,
                       "%s: query_lens[%d] = %d, must be in [1, seq_lens[%d] = %d]", name, i,
                       query_len, i, seq_len);
    }
    problem.requests.push_back({seq_len, query_len});
    tokens += query_len;
    rows += seq_len;
  }

  // Dimensions, read off the shapes, then every shape checked against them.
  ModelDims& model = problem.model;
  model.num_heads = int(q_nope->shape[1]);
  model.qk_nope_head_dim = int(q_nope->shape[2]);
  model.qk_rope_head_dim = int(q_rope->shape[2]);
  model.kv_lora_rank = int(kv_c->shape[1]);
  model.v_head_dim = int(w_uv->shape[2]);
  const int64_t h = model.num_heads, dn = model.qk_nope_head_dim, dr = model.qk_rope_head_dim,
                r = model.kv_lora_rank, dv = model.v_head_dim;
  DCP_RETURN_IF_ERROR(ExpectShape(name, "q_nope", *q_nope, {tokens, h, dn},
                                  absl::StrFormat("T = sum of query_lens = %d", tokens)));
  DCP_RETURN_IF_ERROR(
      ExpectShape(name, "q_rope", *q_rope, {tokens, h, dr}, "[T, H, Dr] with T and H of q_nope"));
  DCP_RETURN_IF_ERROR(ExpectShape(name, "kv_c", *kv_c, {rows, r},
                                  absl::StrFormat("N = sum of seq_lens = %d", rows)));
  DCP_RETURN_IF_ERROR(ExpectShape(name, "k_pe", *k_pe, {rows, dr}, "[N, Dr] with Dr of q_rope"));
  DCP_RETURN_IF_ERROR(ExpectShape(name, "w_uk", *w_uk, {h, dn, r},
                                  "[H, Dn, R] with H, Dn of q_nope and R of kv_c"));
  DCP_RETURN_IF_ERROR(
      ExpectShape(name, "w_uv", *w_uv, {h, r, dv}, "[H, R, Dv] with H of q_nope and R of kv_c"));
  if (h < 1 || dn < 1 || r < 1 || dv < 1) {
    return DCP_ERROR(InvalidArgument,
                     "%s: H, Dn, R and Dv must be >= 1 (got H %d, Dn %d, R %d, "
                     "Dv %d)",
                     name, h, dn, r, dv);
  }

  // Metadata.
  if (const std::optional<std::string> scale_text = MetadataValue(file, "softmax_scale")) {
    float scale = 0;
    if (!absl::SimpleAtof(*scale_text, &scale) || !std::isfinite(scale) || scale <= 0) {
      return DCP_ERROR(InvalidArgument,
                       "%s: __metadata__ softmax_scale '%s' is not a positive "
                       "number",
                       name, *scale_text);
    }
    model.softmax_scale = scale;
  }
  if (const std::optional<std::string> topk_text = MetadataValue(file, "index_topk")) {
    int value = 0;
    if (!absl::SimpleAtoi(*topk_text, &value) || value < 1) {
      return DCP_ERROR(InvalidArgument,
                       "%s: __metadata__ index_topk '%s' is not a positive "
                       "integer",
                       name, *topk_text);
    }
    if (value > kMaxIndexTopk) {
      return DCP_ERROR(InvalidArgument, "%s: __metadata__ index_topk %d is above the limit %d",
                       name, value, kMaxIndexTopk);
    }
    problem.index_topk = value;
  } else if (topk != nullptr) {
    problem.index_topk = int(topk->shape[1]);
  } else {
    problem.index_topk = configured_topk;
  }
  // Keys FORMATS.md does not define are not read; said, since a misspelt one (softmax-scale)
  // would leave the default silently ("format" is the safetensors writers' own key).
  for (const auto& [key, value] : file.metadata) {
    if (key != "softmax_scale" && key != "index_topk" && key != "format") {
      DCP_LOG(WARNING) << name << ": __metadata__ key '" << absl::CHexEscape(key)
                       << "' is not one dcp reads (softmax_scale, index_topk): ignored";
    }
  }

  // Top-k indices.
  if (topk != nullptr) {
    if (topk->shape[0] != tokens || topk->shape[1] < 1) {
      return DCP_ERROR(InvalidArgument,
                       "%s: tensor 'topk_indices' has shape %s, expected [%d, K] with K >= 1 (T = "
                       "sum of query_lens)",
                       name, topk->shape_string(), tokens);
    }
    // The worker's width limit, said here, where the file is named, rather than when the
    // batch first runs.
    if (topk->shape[1] > kMaxIndexTopk) {
      return DCP_ERROR(InvalidArgument,
                       "%s: tensor 'topk_indices' is %d wide, above the top-k width limit %d", name,
                       topk->shape[1], kMaxIndexTopk);
    }
    problem.topk_width = int(topk->shape[1]);
    problem.topk.assign(topk->as<int32_t>(), topk->as<int32_t>() + topk->num_elements());
    DCP_RETURN_IF_ERROR(ValidateTopk(problem.requests, problem.topk, problem.topk_width, name));
    // Valid rows hold distinct causal positions: a row selects all of them when it holds
    // position + 1 entries.
    int64_t t = 0;
    for (const RequestShape& request : problem.requests) {
      bool every = true;
      for (int64_t k = 0; k < request.query_len; ++k, ++t) {
        const int32_t* row = &problem.topk[size_t(t * problem.topk_width)];
        const int64_t selected = problem.topk_width - std::count(row, row + problem.topk_width, -1);
        every = every && selected == request.seq_len - request.query_len + k + 1;
      }
      problem.topk_selects_every_causal_key.push_back(every);
    }
  } else {
    problem.topk_selects_every_causal_key.assign(problem.requests.size(), true);
    for (size_t i = 0; i < problem.requests.size(); ++i) {
      if (problem.requests[i].seq_len > problem.index_topk) {
        return DCP_ERROR(InvalidArgument,
                         "%s: no topk_indices, so every causal position is selected, but "
                         "seq_lens[%d] = %d exceeds index_topk = %d",
                         name, i, problem.requests[i].seq_len, problem.index_topk);
      }
    }
  }

  // Values.
  DCP_ASSIGN_OR_RETURN(problem.q_nope, ToFloats(name, "q_nope", *q_nope));
  DCP_ASSIGN_OR_RETURN(problem.q_rope, ToFloats(name, "q_rope", *q_rope));
  DCP_ASSIGN_OR_RETURN(problem.w_uk, ToFloats(name, "w_uk", *w_uk));
  DCP_ASSIGN_OR_RETURN(problem.w_uv, ToFloats(name, "w_uv", *w_uv));
  DCP_ASSIGN_OR_RETURN(std::vector<float> kv_c_values, ToFloats(name, "kv_c", *kv_c));
  DCP_ASSIGN_OR_RETURN(std::vector<float> k_pe_values, ToFloats(name, "k_pe", *k_pe));
  const int64_t width = r + dr;
  problem.kv.resize(size_t(rows * width));
  for (int64_t row = 0; row < rows; ++row) {
    std::copy_n(&kv_c_values[row * r], r, &problem.kv[row * width]);
    std::copy_n(&k_pe_values[row * dr], dr, &problem.kv[row * width + r]);
  }
  std::set<DType> dtypes;
  for (const Tensor* t : {q_nope, q_rope, kv_c, k_pe, w_uk, w_uv}) dtypes.insert(t->dtype);
  problem.input_dtype = dtypes.size() > 1 ? "mixed" : std::string(dtype_name(*dtypes.begin()));
  return problem;
}

absl::StatusOr<Problem> LoadProblem(const std::string& path, int configured_topk) {
  // The file is read whole, parsed into tensors and converted to F32: about 3x its size (4x
  // for BF16 inputs) at the peak. Refused before reading when the machine has less.
  struct stat info;
  if (::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode)) {
    const int64_t needed = int64_t(info.st_size) * 4;
    const int64_t available = AvailableHostMemory();
    if (needed > available) {
      return DCP_ERROR(ResourceExhausted,
                       "%s: a problem file of %.2f GiB needs about %.2f GiB of memory to load, "
                       "but %.2f GiB is available",
                       path, double(info.st_size) / (1 << 30), double(needed) / (1 << 30),
                       double(available) / (1 << 30));
    }
  }
  DCP_ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(path));
  return ProblemFromFile(file, path, configured_topk);
}

RankWeights SliceWeights(const Problem& problem, const RankView& view) {
  const ModelDims& m = problem.model;
  const size_t uk = size_t(m.qk_nope_head_dim) * m.kv_lora_rank;
  const size_t uv = size_t(m.kv_lora_rank) * m.v_head_dim;
  RankWeights weights;
  weights.w_uk.assign(problem.w_uk.begin() + view.head_begin * uk,
                      problem.w_uk.begin() + view.head_end * uk);
  weights.w_uv.assign(problem.w_uv.begin() + view.head_begin * uv,
                      problem.w_uv.begin() + view.head_end * uv);
  return weights;
}

RankBatch SliceBatch(const Problem& problem, const RankView& view, int64_t first_request_id) {
  const ModelDims& m = problem.model;
  const int64_t heads = m.num_heads, dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim;
  const int64_t width = m.latent_width(), tokens = problem.num_tokens();
  const int64_t local_heads = view.num_heads();
  RankBatch batch;
  for (size_t i = 0; i < problem.requests.size(); ++i) {
    batch.requests.push_back(BatchRequest{
        first_request_id + int64_t(i), problem.requests[i].seq_len, problem.requests[i].query_len});
  }
  batch.q_nope.resize(size_t(tokens * local_heads * dn));
  batch.q_rope.resize(size_t(tokens * local_heads * dr));
  for (int64_t t = 0; t < tokens; ++t) {
    std::copy_n(&problem.q_nope[(t * heads + view.head_begin) * dn], local_heads * dn,
                &batch.q_nope[t * local_heads * dn]);
    std::copy_n(&problem.q_rope[(t * heads + view.head_begin) * dr], local_heads * dr,
                &batch.q_rope[t * local_heads * dr]);
  }
  batch.kv_new.resize(size_t(tokens * width));
  batch.cached_rows.resize(problem.requests.size());
  int64_t row_offset = 0, token = 0;
  for (size_t i = 0; i < problem.requests.size(); ++i) {
    const RequestShape& request = problem.requests[i];
    const int64_t context = request.seq_len - request.query_len;
    std::copy_n(&problem.kv[(row_offset + context) * width], request.query_len * width,
                &batch.kv_new[token * width]);
    const int64_t local_rows = view.layout.local_length(context, view.rank);
    std::vector<float>& rows = batch.cached_rows[i];
    rows.resize(size_t(local_rows * width));
    for (int64_t j = 0; j < local_rows; ++j) {
      const int64_t g = view.layout.global_index(j, view.rank);
      std::copy_n(&problem.kv[(row_offset + g) * width], width, &rows[j * width]);
    }
    row_offset += request.seq_len;
    token += request.query_len;
  }
  batch.topk = problem.topk;
  batch.topk_width = problem.topk_width;
  return batch;
}

}  // namespace dcp::launch
