// Test tool for dcp_run's problem and result files, independent of launch/ (its own
// safetensors writer and reader, its own data and a float64 reference of DESIGN.md section 3),
// so that a bug shared by the launcher's reader and its tests cannot hide.
//
//   make_problem write <variant> <path>     one problem file (valid or broken on purpose)
//   make_problem all <folder>               every variant, as <folder>/<variant>.safetensors
//   make_problem random <seed> <path> [fp8] a random problem (RandomProblem), for sweeps
//   make_problem verify <problem> <result> <world_size> [route|-] [tolerance|-] [kv_dtype|-]
//                       [decode_threshold|-] [f32|bf16]
//                                           checks a result file against the float64 reference
//                                           (relative error, default 1e-4); kv_dtype
//                                           fp8_ds_mla: keys read from the cache are the
//                                           format's dequantized rows (tests/reference),
//                                           quantized from the values as the ranks store them
//                                           (f32 on CPU ranks, the default; bf16 on CUDA
//                                           ranks); the decode threshold of the run (default 1)
//                                           tells which requests the dense route leaves to the
//                                           sparse one; the result must also hold FORMATS.md's
//                                           tensors and metadata (out and lse only, route
//                                           dense_mha|sparse_mqa, integer interleave >= 1 and
//                                           chunks >= 0, 0 on the sparse route)
//   make_problem corrupt <result> <out> <tensor> <index> <value>   one element changed
//   make_problem set_metadata <result> <out> <key> <json value>     one metadata value changed
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/reference/fp8_ds_mla_reference.h"

namespace {

using json = nlohmann::json;

// ---- a minimal safetensors image -------------------------------------------------------
struct Entry {
  std::string dtype;  // "F32", "BF16", "I32", or anything for broken files
  std::vector<int64_t> shape;
  std::string bytes;
};

struct File {
  std::map<std::string, Entry> tensors;
  std::map<std::string, std::string> metadata;
};

std::string Image(const File& file) {
  json header = json::object();
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  uint64_t offset = 0;
  for (const auto& [name, entry] : file.tensors) {
    header[name] = {{"dtype", entry.dtype},
                    {"shape", entry.shape},
                    {"data_offsets", {offset, offset + entry.bytes.size()}}};
    offset += entry.bytes.size();
  }
  std::string text = header.dump();
  const uint64_t length = text.size();
  std::string image(reinterpret_cast<const char*>(&length), 8);
  image += text;
  for (const auto& [name, entry] : file.tensors) image += entry.bytes;
  return image;
}

uint16_t ToBf16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, 4);
  word += 0x7fffu + ((word >> 16) & 1u);
  return static_cast<uint16_t>(word >> 16);
}

Entry Floats(const std::vector<int64_t>& shape, const std::vector<float>& values, bool bf16) {
  Entry entry{bf16 ? "BF16" : "F32", shape, ""};
  for (float v : values) {
    if (bf16) {
      const uint16_t bits = ToBf16(v);
      entry.bytes.append(reinterpret_cast<const char*>(&bits), 2);
    } else {
      entry.bytes.append(reinterpret_cast<const char*>(&v), 4);
    }
  }
  return entry;
}

Entry Ints(const std::vector<int64_t>& shape, const std::vector<int32_t>& values) {
  return Entry{"I32", shape,
               std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4)};
}

// ---- reading back (result files and our own problems) ------------------------------------
struct Tensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<double> values;
};

// False (with the reason on stderr) for a file that is not a well-formed safetensors image of
// F32, BF16 and I32 tensors with string metadata: a result under test may be malformed, and
// verify must then fail cleanly, never abort or read past the file.
bool ReadFile(const std::string& path, std::map<std::string, Tensor>* tensors,
              std::map<std::string, std::string>* metadata) {
  const auto bad = [&](const std::string& why) {
    std::fprintf(stderr, "read %s: %s\n", path.c_str(), why.c_str());
    return false;
  };
  std::ifstream in(path, std::ios::binary);
  if (!in) return bad("cannot open");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 8) return bad("shorter than the 8-byte header length");
  uint64_t length;
  std::memcpy(&length, bytes.data(), 8);
  if (length > bytes.size() - 8) return bad("header length past the end of the file");
  const json header = json::parse(bytes.substr(8, length), nullptr, false);
  if (header.is_discarded() || !header.is_object()) return bad("header is not a JSON object");
  const char* data = bytes.data() + 8 + length;
  const uint64_t data_size = bytes.size() - 8 - length;
  try {
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") {
        if (!it.value().is_object()) return bad("__metadata__ is not an object");
        for (auto m = it.value().begin(); m != it.value().end(); ++m) {
          if (!m.value().is_string()) return bad("__metadata__ '" + m.key() + "' is not a string");
          (*metadata)[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      Tensor tensor;
      tensor.dtype = it.value().at("dtype").get<std::string>();
      tensor.shape = it.value().at("shape").get<std::vector<int64_t>>();
      const uint64_t begin = it.value().at("data_offsets").at(0).get<uint64_t>();
      const uint64_t end = it.value().at("data_offsets").at(1).get<uint64_t>();
      if (tensor.dtype != "F32" && tensor.dtype != "BF16" && tensor.dtype != "I32") {
        return bad("tensor '" + it.key() + "' has dtype " + tensor.dtype);
      }
      const size_t size = tensor.dtype == "BF16" ? 2 : 4;
      uint64_t count = 1;  // elements, bounded by what the data could hold (no wrap-around)
      for (int64_t d : tensor.shape) {
        if (d < 0 || (d > 0 && count > data_size / size / uint64_t(d))) {
          return bad("tensor '" + it.key() +
                     "' has a negative dimension or more elements "
                     "than the file holds");
        }
        count *= uint64_t(d);
      }
      if (begin > end || end > data_size || end - begin != count * size) {
        return bad("tensor '" + it.key() +
                   "' has data_offsets that do not match its shape or "
                   "lie past the data");
      }
      for (uint64_t at = begin; at + size <= end; at += size) {
        if (tensor.dtype == "F32") {
          float v;
          std::memcpy(&v, data + at, 4);
          tensor.values.push_back(v);
        } else if (tensor.dtype == "BF16") {
          uint16_t bits;
          std::memcpy(&bits, data + at, 2);
          const uint32_t word = uint32_t(bits) << 16;
          float v;
          std::memcpy(&v, &word, 4);
          tensor.values.push_back(v);
        } else {
          int32_t v;
          std::memcpy(&v, data + at, 4);
          tensor.values.push_back(v);
        }
      }
      (*tensors)[it.key()] = std::move(tensor);
    }
  } catch (const json::exception& e) {
    return bad(std::string("malformed header: ") + e.what());
  }
  return true;
}

// A non-negative decimal integer (the result's metadata values), or -1.
int64_t MetadataInteger(const std::string& text) {
  if (text.empty() || text.size() > 18) return -1;
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return -1;
    value = value * 10 + (c - '0');
  }
  return value;
}

// A copy of `in` whose __metadata__ key `key` is set to the JSON value `value` (text, e.g.
// "\"bogus\"" or 3): verify's own tests of the result metadata FORMATS.md defines.
int SetMetadata(const std::string& in, const std::string& out, const std::string& key,
                const std::string& value) {
  std::ifstream file(in, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  uint64_t length = 0;
  if (bytes.size() >= 8) std::memcpy(&length, bytes.data(), 8);
  json header = bytes.size() >= 8 && length <= bytes.size() - 8
                    ? json::parse(bytes.substr(8, length), nullptr, false)
                    : json(nullptr);
  const json parsed = json::parse(value, nullptr, false);
  if (!header.is_object() || parsed.is_discarded()) {
    std::fprintf(stderr, "set_metadata: cannot read %s or parse the value %s\n", in.c_str(),
                 value.c_str());
    return 1;
  }
  header["__metadata__"][key] = parsed;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t new_length = text.size();
  std::string image(reinterpret_cast<const char*>(&new_length), 8);
  image += text;
  image += bytes.substr(8 + length);
  std::ofstream written(out, std::ios::binary);
  written.write(image.data(), std::streamsize(image.size()));
  return written ? 0 : 1;
}

// ---- the problem: small dims, requests in mixed order --------------------------------------
struct Dims {
  int h = 8, r = 32, dn = 16, dr = 8, dv = 16;
};

struct Request {
  int seq_len, query_len;
};

// Decodes and prefills interleaved, a fresh prefill, a decode with a short context and an
// extend, so that "decodes first" reordering inside DcpContext is visible in file order.
const std::vector<Request> kRequests = {{40, 12}, {50, 1}, {20, 20}, {9, 1}, {70, 5}, {33, 1}};

float Random(uint64_t* state) {  // xorshift64*, in [-1, 1)
  *state ^= *state >> 12;
  *state ^= *state << 25;
  *state ^= *state >> 27;
  const uint64_t bits = *state * 2685821657736338717ull;
  return float(int64_t(bits >> 40) - (1 << 23)) / float(1 << 23);
}

std::vector<float> RandomValues(size_t count, uint64_t seed, float scale) {
  std::vector<float> values(count);
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (float& v : values) v = scale * Random(&state);
  return values;
}

struct Options {
  bool bf16 = false;
  int topk_width = 0;  // 0: no topk_indices
  int row_entries = 0;  // at most this many positions a row selects (0: topk_width)
  bool quantization_edges = false;  // kv_c tiles that fp8_ds_mla must handle exactly (R 512)
  float alike_scale = 0;  // > 0: every kv_c row is the first one times this (keys that tie)
  Dims dims;
  std::vector<Request> requests = kRequests;
};

// Rows whose 128-wide tiles hit fp8_ds_mla's edge cases: one tile spread over nine decades (E4M3
// normals, subnormals and values that round to zero), all-zero tiles with negative zeros (scale
// FLT_MIN), tiles of float32 subnormals (max|x| / 448 below FLT_MIN: the scale clamps), tiles
// scaled by 30 (keys that dominate their rows' softmax), and tiles whose scale is 2^-8 exactly
// with every other value halfway between two E4M3 magnitudes (ties to the even code). Needs
// R = 512.
void AddQuantizationEdges(std::vector<float>* kv_c, int r) {
  const int64_t rows = int64_t(kv_c->size()) / r;
  for (int64_t row = 0; row < rows; ++row) {
    float* x = kv_c->data() + row * r;
    float* spread = x + 128 * (row % 4);
    for (int e = 0; e < 128; ++e) spread[e] *= std::pow(10.0f, -float(e % 9));
    if (row % 5 == 0) {
      float* zeros = x + 128 * ((row + 1) % 4);
      for (int e = 0; e < 128; ++e) zeros[e] = e % 2 ? -0.0f : 0.0f;
    }
    if (row % 7 == 0 || row % 7 == 3) {
      float* scaled = x + 128 * ((row + 2) % 4);
      for (int e = 0; e < 128; ++e) scaled[e] *= row % 7 == 0 ? 1e-40f : 30.0f;
    }
    if (row % 7 == 5) {
      float* ties = x + 128 * ((row + 3) % 4);
      ties[0] = std::ldexp(448.0f, -8);  // max|x| = 448 * 2^-8: the scale is 2^-8
      for (int e = 1; e < 128; e += 2) {
        const int hi = int(e + row) % 126 + 1;  // between the finite codes hi - 1 and hi
        const double below = dcp::reference::E4m3Value(uint8_t(hi - 1));
        const double above = dcp::reference::E4m3Value(uint8_t(hi));
        ties[e] = std::ldexp(float((below + above) / 2), -8) * (e % 4 == 1 ? 1.0f : -1.0f);
      }
    }
  }
}

File MakeProblem(const Options& options) {
  const Dims& d = options.dims;
  int64_t tokens = 0, rows = 0;
  std::vector<int32_t> seq_lens, query_lens;
  for (const Request& r : options.requests) {
    tokens += r.query_len;
    rows += r.seq_len;
    seq_lens.push_back(r.seq_len);
    query_lens.push_back(r.query_len);
  }
  File file;
  const bool b = options.bf16;
  file.tensors["q_nope"] = Floats({tokens, d.h, d.dn}, RandomValues(tokens * d.h * d.dn, 1, 1), b);
  file.tensors["q_rope"] = Floats({tokens, d.h, d.dr}, RandomValues(tokens * d.h * d.dr, 2, 1), b);
  std::vector<float> kv_c = RandomValues(rows * d.r, 3, 1);
  if (options.quantization_edges) AddQuantizationEdges(&kv_c, d.r);
  if (options.alike_scale > 0) {
    for (int64_t i = rows * d.r - 1; i >= 0; --i) kv_c[i] = kv_c[i % d.r] * options.alike_scale;
  }
  file.tensors["kv_c"] = Floats({rows, d.r}, kv_c, b);
  file.tensors["k_pe"] = Floats({rows, d.dr}, RandomValues(rows * d.dr, 4, 1), b);
  file.tensors["w_uk"] = Floats({d.h, d.dn, d.r}, RandomValues(d.h * d.dn * d.r, 5, 0.2f), b);
  file.tensors["w_uv"] = Floats({d.h, d.r, d.dv}, RandomValues(d.h * d.r * d.dv, 6, 0.2f), b);
  file.tensors["seq_lens"] = Ints({int64_t(seq_lens.size())}, seq_lens);
  file.tensors["query_lens"] = Ints({int64_t(query_lens.size())}, query_lens);
  if (options.topk_width > 0) {
    // Random causal subsets in random order, padded with -1, the newest token always in;
    // except the fourth request (a decode), which selects nothing (out 0, lse -inf).
    const int k = options.topk_width;
    const int entries = options.row_entries > 0 ? options.row_entries : k;
    std::vector<int32_t> topk;
    uint64_t state = 99;
    for (size_t index = 0; index < options.requests.size(); ++index) {
      const Request& r = options.requests[index];
      for (int i = 0; i < r.query_len; ++i) {
        if (index == 3) {
          topk.insert(topk.end(), size_t(k), -1);
          continue;
        }
        const int position = r.seq_len - r.query_len + i;
        std::vector<int32_t> candidates(position);
        for (int j = 0; j < position; ++j) candidates[j] = j;
        for (int j = position - 1; j > 0; --j) {
          const int swap = int((Random(&state) + 1.0f) * 0.5f * float(j + 1)) % (j + 1);
          std::swap(candidates[j], candidates[swap]);
        }
        std::vector<int32_t> row = {position};
        const int extra = std::min<int>(position, entries - 1 - (i % 3 == 1 ? 2 : 0));
        row.insert(row.end(), candidates.begin(), candidates.begin() + std::max(extra, 0));
        std::rotate(row.begin(), row.begin() + row.size() / 2, row.end());
        row.resize(k, -1);
        topk.insert(topk.end(), row.begin(), row.end());
      }
    }
    file.tensors["topk_indices"] = Ints({tokens, k}, topk);
  }
  return file;
}

// A random problem for sweeps (`make_problem random <seed> <path>`): 1-8 requests of random
// kinds and lengths (decodes, prefills, extends; seq_len up to 300), random small dims, F32 or
// BF16, and top-k rows absent, or every causal position in rows as wide as the longest request,
// or rows of a random width holding, per token, nothing, every causal position (where the width
// allows) or a random causal subset; entries in random columns between -1 padding. Prints the
// head count (a world size must divide it). fp8_dims: R 512 and Dr 64 with kv_c tiles at
// fp8_ds_mla's edges (AddQuantizationEdges).
// RandomRun draws a run for it: a world size of 1-4 that divides the heads and dcp_run flags
// (block size, interleave, combine, sometimes a workspace small enough for several chunks,
// --force-mqa, a decode threshold above 1).
struct RandomRun {
  int world_size = 1;
  int decode_threshold = 1;
  std::string args;
};

File RandomProblem(uint64_t seed, bool fp8_dims, RandomRun* run) {
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 7;
  const auto below = [&](int n) {  // uniform in [0, n)
    return int((Random(&state) + 1.0f) * 0.5f * float(n)) % n;
  };
  Options options;
  options.bf16 = below(2) == 1;
  options.dims =
      Dims{std::array{4, 8, 12}[below(3)], std::array{16, 32, 64}[below(3)],
           std::array{8, 16}[below(2)], std::array{4, 8}[below(2)], std::array{8, 16}[below(2)]};
  if (fp8_dims) {  // fp8_ds_mla's R 512 / Dr 64, with its quantization edges
    options.dims.r = 512;
    options.dims.dr = 64;
    options.quantization_edges = true;
  }
  const int heads = options.dims.h;
  std::vector<int> worlds;
  for (int w = 1; w <= 4; ++w) {
    if (heads % w == 0) worlds.push_back(w);
  }
  run->world_size = worlds[below(int(worlds.size()))];
  const int block = std::array{4, 8, 16, 64}[below(4)];
  const int interleave = std::array{1, 2, 4}[below(3)];
  run->args = "--block-size " + std::to_string(block) + " --interleave " +
              std::to_string(interleave) + " --combine " + (below(2) ? "a2a" : "ag_rs");
  if (below(2) == 0) {
    run->args += " --workspace-rows " +
                 std::to_string((1 + below(8)) * block * interleave * run->world_size);
  }
  if (below(5) == 0) run->args += " --force-mqa";
  if (below(4) == 0) {
    run->decode_threshold = 2 + below(3);
    run->args += " --decode-threshold " + std::to_string(run->decode_threshold);
  }
  if (fp8_dims) run->args += " --kv-cache-dtype fp8_ds_mla";
  options.requests.clear();
  const int count = 1 + below(8);
  for (int i = 0; i < count; ++i) {
    const int seq_len = 1 + below(300);
    const int kind = below(3);  // decode, prefill, extend
    const int query_len = kind == 0 ? 1 : kind == 1 ? seq_len : 1 + below(seq_len);
    options.requests.push_back({seq_len, query_len});
  }
  File file = MakeProblem(options);
  if (below(3) == 0) return file;  // every causal position (seq_lens <= 2048)
  // Rows of mixed kinds, or every causal position in rows wide enough for the longest request
  // (the dense route's case with top-k given).
  const bool full = below(2) == 0;
  int longest = 0;
  for (const Request& r : options.requests) longest = std::max(longest, r.seq_len);
  const int k = full ? longest + below(8) : 1 + below(64);
  std::vector<int32_t> topk;
  for (const Request& r : options.requests) {
    for (int i = 0; i < r.query_len; ++i) {
      const int position = r.seq_len - r.query_len + i;
      std::vector<int32_t> keys(position + 1);
      for (int j = 0; j <= position; ++j) keys[j] = j;
      for (int j = position; j > 0; --j) std::swap(keys[j], keys[below(j + 1)]);
      const int mode = full ? 1 : below(8);  // 0: nothing; 1-3: every position if they fit
      const int take = mode == 0                     ? 0
                       : (mode <= 3 && position < k) ? position + 1
                                                     : 1 + below(std::min(k, position + 1));
      std::vector<int32_t> row(k, -1);
      std::vector<int> columns(k);
      for (int c = 0; c < k; ++c) columns[c] = c;
      for (int c = k - 1; c > 0; --c) std::swap(columns[c], columns[below(c + 1)]);
      for (int n = 0; n < take; ++n) row[columns[n]] = keys[n];
      topk.insert(topk.end(), row.begin(), row.end());
    }
  }
  file.tensors["topk_indices"] = Ints({file.tensors["q_nope"].shape[0], k}, topk);
  return file;
}

bool WriteImage(const std::string& path, const std::string& image) {
  std::ofstream out(path, std::ios::binary);
  out.write(image.data(), std::streamsize(image.size()));
  return bool(out);
}

// Every variant: the valid problems first, then one broken file per defect.
std::map<std::string, std::string> Variants() {
  std::map<std::string, std::string> images;
  Options dense;  // no top-k: every causal position (seq_lens <= 2048)
  File f = MakeProblem(dense);
  f.metadata["softmax_scale"] = "0.125";
  images["dense_f32"] = Image(f);
  Options dense_bf16 = dense;
  dense_bf16.bf16 = true;
  images["dense_bf16"] = Image(MakeProblem(dense_bf16));
  Options sparse;
  sparse.topk_width = 16;  // seq_lens up to 70 > 16: the sparse route
  images["sparse_f32"] = Image(MakeProblem(sparse));
  Options sparse_bf16 = sparse;
  sparse_bf16.bf16 = true;
  images["sparse_bf16"] = Image(MakeProblem(sparse_bf16));
  // Keys that all tie, at logits near 1e19: the partial LSEs of the ranks tie where fp32 (and
  // float64) cannot hold LSE + log(count); the combines must still average, not sum.
  Options alike = sparse;
  alike.alike_scale = 1e19f;
  images["alike_huge_f32"] = Image(MakeProblem(alike));
  Options full;
  full.topk_width = 80;  // wide enough for every causal position: the dense route
  images["topk_full"] = Image(MakeProblem(full));
  Options partial = full;
  partial.row_entries = 8;  // as wide, but the prefills' rows select fewer than every position
  images["topk_partial"] = Image(MakeProblem(partial));

  // DeepSeek-V3.2 head dims (R 512, Dn 128, Dr 64, Dv 128: the CUDA kernels' sizes), 8 heads.
  Options deepseek;
  deepseek.dims = Dims{8, 512, 128, 64, 128};
  deepseek.bf16 = true;
  images["deepseek_dense_bf16"] = Image(MakeProblem(deepseek));
  deepseek.topk_width = 16;
  images["deepseek_sparse_bf16"] = Image(MakeProblem(deepseek));
  // The same dims in F32 (the cache write quantizes float32 values on CPU ranks and rounds k_pe
  // to bf16), with kv_c tiles at fp8_ds_mla's edges: run with --kv-cache-dtype fp8_ds_mla.
  Options fp8 = deepseek;
  fp8.bf16 = false;
  fp8.topk_width = 0;
  fp8.quantization_edges = true;
  images["deepseek_fp8_dense"] = Image(MakeProblem(fp8));
  fp8.topk_width = 16;
  images["deepseek_fp8_sparse"] = Image(MakeProblem(fp8));

  // ---- broken on purpose ----
  File base = MakeProblem(sparse);
  File broken = base;
  broken.tensors.erase("k_pe");
  images["bad_missing_tensor"] = Image(broken);
  broken = base;
  broken.tensors["q_nope_"] = broken.tensors["q_nope"];
  broken.tensors.erase("q_nope");
  images["bad_tensor_name"] = Image(broken);
  broken = base;
  broken.tensors["w_uk"].shape = {8, 16, 16};
  broken.tensors["w_uk"].bytes.resize(8 * 16 * 16 * 4);
  images["bad_shape"] = Image(broken);
  broken = base;
  broken.tensors["seq_lens"].dtype = "F32";
  images["bad_dtype"] = Image(broken);
  broken = base;
  broken.tensors["q_rope"].dtype = "F16";
  broken.tensors["q_rope"].shape.back() *= 2;
  images["bad_dtype_f16"] = Image(broken);
  broken = base;
  std::vector<int32_t> query_lens;
  for (const Request& r : kRequests) query_lens.push_back(r.query_len);
  query_lens[2] = 21;  // > seq_len 20
  broken.tensors["query_lens"] = Ints({int64_t(query_lens.size())}, query_lens);
  images["bad_query_len"] = Image(broken);
  broken = base;
  broken.tensors["kv_c"].shape[0] -= 1;
  broken.tensors["kv_c"].bytes.resize(broken.tensors["kv_c"].bytes.size() - 32 * 4);
  images["bad_kv_rows"] = Image(broken);
  broken = base;
  {
    std::string& bytes = broken.tensors["topk_indices"].bytes;
    const int32_t future = 45;  // token 0 of request 0 sits at position 28
    std::memcpy(&bytes[0], &future, 4);
  }
  images["bad_topk_future"] = Image(broken);
  broken = base;
  {
    std::string& bytes = broken.tensors["topk_indices"].bytes;
    int32_t first;
    std::memcpy(&first, &bytes[16 * 4 * 5], 4);  // token 5: copy its first entry to column 1
    std::memcpy(&bytes[16 * 4 * 5 + 4], &first, 4);
    if (first == -1) std::abort();
  }
  images["bad_topk_duplicate"] = Image(broken);
  broken = base;
  {
    const int32_t minus_two = -2;
    std::memcpy(&broken.tensors["topk_indices"].bytes[4 * 3], &minus_two, 4);
  }
  images["bad_topk_negative"] = Image(broken);
  broken = base;
  {
    const float nan = std::nanf("");
    std::memcpy(&broken.tensors["q_rope"].bytes[40], &nan, 4);
  }
  images["bad_nan"] = Image(broken);
  broken = MakeProblem(dense);
  broken.metadata["index_topk"] = "32";  // no top-k, but seq_lens up to 70 > 32
  images["bad_no_topk_long"] = Image(broken);
  broken = base;
  broken.metadata["softmax_scale"] = "fast";
  images["bad_metadata"] = Image(broken);
  Options three_heads = sparse;
  three_heads.dims.h = 3;
  images["bad_heads_3"] = Image(MakeProblem(three_heads));

  const std::string good = Image(base);
  images["bad_truncated"] = good.substr(0, good.size() - 100);
  images["bad_trailing_bytes"] = good + std::string(12, '\0');
  std::string header_json = good;
  header_json[8] = '#';  // the JSON header's opening brace
  images["bad_header_json"] = header_json;
  std::string header_length = good;
  const uint64_t huge = uint64_t(1) << 40;
  std::memcpy(&header_length[0], &huge, 8);
  images["bad_header_length"] = header_length;
  std::string duplicate = good;  // "q_rope" renamed "q_nope": one name, two tensors
  duplicate.replace(duplicate.find("\"q_rope\":"), 9, "\"q_nope\":");
  images["bad_duplicate_tensor"] = duplicate;
  images["bad_empty"] = "";
  images["bad_not_safetensors"] = "this is not a safetensors file, just text\n";
  return images;
}

// What a rank's fp8_ds_mla cache gives back for rows [rows, 512] / [rows, 64], row by row
// through tests/reference's model of the format (written from FORMATS.md, sharing no code with
// dcp): kv_c dequantized, k_pe rounded to bf16. x is the value as the rank stores it: float32 on
// CPU ranks, rounded to bf16 first on CUDA ranks (`stored_bf16`).
void Fp8DsMlaCache(const std::vector<double>& kv_c, const std::vector<double>& k_pe,
                   bool stored_bf16, std::vector<double>* kv_cache, std::vector<double>* pe_cache) {
  const auto stored = [stored_bf16](double value) {
    const float x = float(value);
    if (!stored_bf16) return x;
    const uint32_t word = uint32_t(dcp::reference::Bf16Nearest(x)) << 16;
    float rounded;
    std::memcpy(&rounded, &word, 4);
    return rounded;
  };
  const size_t rows = k_pe.size() / 64;
  kv_cache->resize(kv_c.size());
  pe_cache->resize(k_pe.size());
  std::vector<float> x(576);
  for (size_t row = 0; row < rows; ++row) {
    for (int e = 0; e < 512; ++e) x[e] = stored(kv_c[row * 512 + e]);
    for (int e = 0; e < 64; ++e) x[512 + e] = stored(k_pe[row * 64 + e]);
    const std::vector<uint8_t> stored =
        dcp::reference::QuantizeFp8DsMlaRow(x.data(), x.data() + 512);
    const std::vector<double> values = dcp::reference::DequantizeFp8DsMlaRow(stored.data());
    std::copy(values.begin(), values.begin() + 512, kv_cache->begin() + row * 512);
    std::copy(values.begin() + 512, values.end(), pe_cache->begin() + row * 64);
  }
}

// ---- verify: float64 reference of DESIGN.md section 3 ------------------------------------
// kv_dtype fp8_ds_mla (FORMATS.md, as vLLM): the sparse route reads every key from the cache,
// the batch's new tokens included; the dense route reads the prefills' cached context from it
// and their new tokens fresh (decodes, query_len <= decode_threshold, stay on the sparse route).
int Verify(const std::string& problem_path, const std::string& result_path, int world_size,
           const std::string& route, double tolerance, const std::string& kv_dtype,
           int decode_threshold, const std::string& stored) {
  std::map<std::string, Tensor> p, r;
  std::map<std::string, std::string> pm, rm;
  if (!ReadFile(problem_path, &p, &pm) || !ReadFile(result_path, &r, &rm)) {
    std::fprintf(stderr, "verify: cannot read %s or %s\n", problem_path.c_str(),
                 result_path.c_str());
    return 1;
  }
  const int64_t tokens = p["q_nope"].shape[0], h = p["q_nope"].shape[1], dn = p["q_nope"].shape[2],
                dr = p["q_rope"].shape[2], rank = p["kv_c"].shape[1], dv = p["w_uv"].shape[2];
  const double scale =
      pm.count("softmax_scale") ? std::stod(pm["softmax_scale"]) : 1.0 / std::sqrt(double(dn + dr));
  if (r["out"].dtype != "F32" || r["out"].shape != std::vector<int64_t>{tokens, h, dv} ||
      r["lse"].dtype != "F32" || r["lse"].shape != std::vector<int64_t>{tokens, h}) {
    std::fprintf(stderr, "verify: result tensors out/lse have the wrong dtype or shape\n");
    return 1;
  }
  for (const char* key : {"route", "dcp_world_size", "interleave", "chunks"}) {
    if (!rm.count(key)) {
      std::fprintf(stderr, "verify: result metadata lacks '%s'\n", key);
      return 1;
    }
  }
  // FORMATS.md: the result holds out and lse only; route is dense_mha or sparse_mqa, interleave
  // (>= 1) and chunks are integers, and the sparse route uses no context chunks.
  if (r.size() != 2) {
    std::fprintf(stderr, "verify: the result holds %zu tensors; FORMATS.md's holds out and lse\n",
                 r.size());
    return 1;
  }
  const int64_t interleave = MetadataInteger(rm["interleave"]);
  const int64_t chunks = MetadataInteger(rm["chunks"]);
  if ((rm["route"] != "dense_mha" && rm["route"] != "sparse_mqa") || interleave < 1 || chunks < 0 ||
      (rm["route"] == "sparse_mqa" && chunks != 0)) {
    std::fprintf(stderr,
                 "verify: result metadata route '%s', interleave '%s', chunks '%s': expected "
                 "dense_mha or sparse_mqa, an integer >= 1, and an integer >= 0 (0 on the "
                 "sparse route)\n",
                 rm["route"].c_str(), rm["interleave"].c_str(), rm["chunks"].c_str());
    return 1;
  }
  if (rm["dcp_world_size"] != std::to_string(world_size) ||
      (!route.empty() && route != "-" && rm["route"] != route)) {
    std::fprintf(stderr, "verify: metadata route %s, dcp_world_size %s; expected %s, %d\n",
                 rm["route"].c_str(), rm["dcp_world_size"].c_str(), route.c_str(), world_size);
    return 1;
  }
  const bool has_topk = p.count("topk_indices") > 0;
  const int64_t k = has_topk ? p["topk_indices"].shape[1] : 0;
  const std::vector<double>& q_nope = p["q_nope"].values;
  const std::vector<double>& q_rope = p["q_rope"].values;
  const std::vector<double>& kv_c = p["kv_c"].values;
  const std::vector<double>& k_pe = p["k_pe"].values;
  const std::vector<double>& w_uk = p["w_uk"].values;
  const std::vector<double>& w_uv = p["w_uv"].values;
  const bool fp8 = kv_dtype == "fp8_ds_mla";
  if (!fp8 && !kv_dtype.empty() && kv_dtype != "-" && kv_dtype != "bf16") {
    std::fprintf(stderr, "verify: unknown kv_dtype '%s' (bf16 or fp8_ds_mla)\n", kv_dtype.c_str());
    return 1;
  }
  if (fp8 && (rank != 512 || dr != 64)) {
    std::fprintf(stderr, "verify: fp8_ds_mla needs R 512 and Dr 64, the problem has %lld, %lld\n",
                 static_cast<long long>(rank), static_cast<long long>(dr));
    return 1;
  }
  if (stored != "f32" && stored != "bf16") {
    std::fprintf(stderr, "verify: unknown storage '%s' (f32: CPU ranks, bf16: CUDA ranks)\n",
                 stored.c_str());
    return 1;
  }
  std::vector<double> kv_cache, pe_cache;
  if (fp8) Fp8DsMlaCache(kv_c, k_pe, stored == "bf16", &kv_cache, &pe_cache);
  const bool dense_route = rm["route"] == "dense_mha";
  double out_error = 0, out_scale = 0, lse_error = 0;
  int64_t t = 0, row_offset = 0;
  for (size_t i = 0; i < p["seq_lens"].values.size(); ++i) {
    const int64_t seq_len = int64_t(p["seq_lens"].values[i]);
    const int64_t query_len = int64_t(p["query_lens"].values[i]);
    for (int64_t q = 0; q < query_len; ++q, ++t) {
      const int64_t position = seq_len - query_len + q;
      std::vector<int64_t> keys;
      if (has_topk) {
        for (int64_t c = 0; c < k; ++c) {
          const int64_t j = int64_t(p["topk_indices"].values[t * k + c]);
          if (j >= 0) keys.push_back(j);
        }
      } else {
        for (int64_t j = 0; j <= position; ++j) keys.push_back(j);
      }
      // Each key's row: the cache's (fp8_ds_mla) or the file's own values.
      std::vector<const double*> kv_rows, pe_rows;
      for (int64_t j : keys) {
        const int64_t row = row_offset + j;
        const bool fresh =
            !fp8 || (dense_route && query_len > decode_threshold && j >= seq_len - query_len);
        kv_rows.push_back((fresh ? kv_c : kv_cache).data() + row * rank);
        pe_rows.push_back((fresh ? k_pe : pe_cache).data() + row * dr);
      }
      for (int64_t head = 0; head < h; ++head) {
        std::vector<double> scores;
        for (size_t n = 0; n < keys.size(); ++n) {
          double score = 0;
          for (int64_t a = 0; a < dn; ++a) {
            double k_nope = 0;
            for (int64_t c = 0; c < rank; ++c) {
              k_nope += w_uk[(head * dn + a) * rank + c] * kv_rows[n][c];
            }
            score += q_nope[(t * h + head) * dn + a] * k_nope;
          }
          for (int64_t a = 0; a < dr; ++a) {
            score += q_rope[(t * h + head) * dr + a] * pe_rows[n][a];
          }
          scores.push_back(scale * score);
        }
        double max_score = -INFINITY, sum = 0;
        for (double s : scores) max_score = std::max(max_score, s);
        for (double s : scores) sum += std::exp(s - max_score);
        const double lse = keys.empty() ? -INFINITY : max_score + std::log(sum);
        std::vector<double> out(dv, 0.0);
        for (size_t n = 0; n < keys.size(); ++n) {
          // Relative to the maximum: far from zero, lse (even in float64) loses log(sum).
          const double weight = std::exp(scores[n] - max_score) / sum;
          for (int64_t e = 0; e < dv; ++e) {
            double v = 0;
            for (int64_t c = 0; c < rank; ++c)
              v += w_uv[(head * rank + c) * dv + e] * kv_rows[n][c];
            out[e] += weight * v;
          }
        }
        const double got_lse = r["lse"].values[t * h + head];
        if (keys.empty()) {
          if (!(std::isinf(got_lse) && got_lse < 0)) lse_error = INFINITY;
        } else if (!std::isfinite(got_lse)) {
          lse_error = INFINITY;  // std::max would keep the old value over a NaN
        } else {
          lse_error = std::max(lse_error, std::fabs(got_lse - lse) / std::max(1.0, std::fabs(lse)));
        }
        for (int64_t e = 0; e < dv; ++e) {
          const double got = r["out"].values[(t * h + head) * dv + e];
          out_scale = std::max(out_scale, std::fabs(out[e]));
          out_error = std::max(out_error, std::fabs(got - out[e]));
          if (!std::isfinite(got)) out_error = INFINITY;
        }
      }
    }
    row_offset += seq_len;
  }
  const double out_rel = out_error / std::max(out_scale, 1e-30);
  const bool ok = out_rel <= tolerance && lse_error <= tolerance;
  std::printf(
      "verify: %s vs float64 reference: out rel %.3g, lse rel %.3g, route %s, chunks %s: %s\n",
      result_path.c_str(), out_rel, lse_error, rm["route"].c_str(), rm["chunks"].c_str(),
      ok ? "OK" : "FAIL");
  return ok ? 0 : 1;
}

// A copy of result file `in` with element `index` of F32 tensor `name` set to `value` ("nan",
// "inf", or a number): verify's own test (a NaN where a value belongs must fail).
int Corrupt(const std::string& in, const std::string& out, const std::string& name, int64_t index,
            const std::string& value) {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  if (!ReadFile(in, &tensors, &metadata)) {
    std::fprintf(stderr, "corrupt: cannot read %s\n", in.c_str());
    return 1;
  }
  auto it = tensors.find(name);
  if (it == tensors.end() || it->second.dtype != "F32" || index < 0 ||
      index >= static_cast<int64_t>(it->second.values.size())) {
    std::fprintf(stderr, "corrupt: no F32 tensor '%s' with element %lld\n", name.c_str(),
                 static_cast<long long>(index));
    return 1;
  }
  it->second.values[index] = std::strtod(value.c_str(), nullptr);
  File file;
  file.metadata = metadata;
  for (const auto& [tensor_name, tensor] : tensors) {
    if (tensor.dtype != "F32") {
      std::fprintf(stderr, "corrupt: tensor '%s' is %s, only F32 results are handled\n",
                   tensor_name.c_str(), tensor.dtype.c_str());
      return 1;
    }
    file.tensors[tensor_name] =
        Floats(tensor.shape, std::vector<float>(tensor.values.begin(), tensor.values.end()), false);
  }
  return WriteImage(out, Image(file)) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "write" && argc == 4) {
    const auto variants = Variants();
    auto it = variants.find(argv[2]);
    if (it == variants.end()) {
      std::fprintf(stderr, "make_problem: unknown variant %s\n", argv[2]);
      return 2;
    }
    return WriteImage(argv[3], it->second) ? 0 : 1;
  }
  if (command == "all" && argc == 3) {
    for (const auto& [name, image] : Variants()) {
      if (!WriteImage(std::string(argv[2]) + "/" + name + ".safetensors", image)) return 1;
    }
    return 0;
  }
  if (command == "random" && (argc == 4 || (argc == 5 && std::string(argv[4]) == "fp8"))) {
    RandomRun run;
    const File file = RandomProblem(std::strtoull(argv[2], nullptr, 10), argc == 5, &run);
    std::printf("np %d\ndecode_threshold %d\nargs %s\n", run.world_size, run.decode_threshold,
                run.args.c_str());
    return WriteImage(argv[3], Image(file)) ? 0 : 1;
  }
  if (command == "set_metadata" && argc == 6) {
    return SetMetadata(argv[2], argv[3], argv[4], argv[5]);
  }
  if (command == "corrupt" && argc == 7) {
    return Corrupt(argv[2], argv[3], argv[4], std::atoll(argv[5]), argv[6]);
  }
  if (command == "verify" && argc >= 5 && argc <= 10) {
    const std::string tolerance = argc >= 7 ? argv[6] : "-";
    const std::string threshold = argc >= 9 ? argv[8] : "-";
    const std::string stored = argc == 10 ? argv[9] : "-";
    return Verify(argv[2], argv[3], std::atoi(argv[4]), argc >= 6 ? argv[5] : "",
                  tolerance == "-" ? 1e-4 : std::atof(tolerance.c_str()), argc >= 8 ? argv[7] : "",
                  threshold == "-" ? 1 : std::atoi(threshold.c_str()),
                  stored == "-" ? "f32" : stored);
  }
  std::fprintf(
      stderr,
      "usage: make_problem write <variant> <path> | all <folder> | random <seed> <path> [fp8] | "
      "corrupt <result> <out> <tensor> <index> <value> | "
      "set_metadata <result> <out> <key> <json value> | "
      "verify <problem> "
      "<result> <world_size> [route|-] [tolerance|-] [bf16|fp8_ds_mla|-] "
      "[decode_threshold|-] [f32|bf16: how the ranks store values, f32 on CPU ranks]\n");
  return 2;
}
