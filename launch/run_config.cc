#include "launch/run_config.h"

#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "launch/batch_spec.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace dcp::launch {
namespace {

using Setter = std::function<absl::Status(const YAML::Node&, RunConfig*)>;

// "file:line" of a node, then ": key" when a key is given.
std::string Where(std::string_view source, const YAML::Node& node, std::string_view key) {
  const YAML::Mark mark = node.Mark();
  std::string where =
      mark.line < 0 ? std::string(source) : absl::StrFormat("%s:%d", source, mark.line + 1);
  if (!key.empty()) where += ": " + std::string(key);
  return where;
}

// Parses documents of `text` until `cap` of them (events dropped) and returns how many it saw.
// Not YAML::LoadAll: yaml-cpp 0.7's never returns on some invalid input ("{a},"), where the
// parser keeps reporting empty documents.
int CountDocuments(std::string_view text, int cap) {
  struct Ignore : YAML::EventHandler {
    void OnDocumentStart(const YAML::Mark&) override {}
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                         YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                    YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
  } ignore;
  std::istringstream in{std::string(text)};
  YAML::Parser parser(in);
  int count = 0;
  while (count < cap && parser.HandleNextDocument(ignore)) ++count;
  return count;
}

// An integer as YAML 1.2's core schema spells it: [-+]?[0-9]+ in decimal (leading zeros
// included: 010 is ten), 0o[0-7]+ octal, 0x[0-9a-fA-F]+ hexadecimal, as its sign and its
// magnitude (up to 2^64 - 1). yaml-cpp reads YAML 1.1, where 010 is eight and 08 an error.
struct YamlInteger {
  bool negative = false;
  uint64_t magnitude = 0;
};
std::optional<YamlInteger> ParseYamlIntegerParts(std::string_view text) {
  int base = 10;
  YamlInteger value;
  if (text.starts_with("0o")) {
    base = 8, text.remove_prefix(2);
  } else if (text.starts_with("0x")) {
    base = 16, text.remove_prefix(2);
  } else if (!text.empty() && (text[0] == '-' || text[0] == '+')) {
    value.negative = text[0] == '-', text.remove_prefix(1);
  }
  if (text.empty()) return std::nullopt;
  const auto [end, error] =
      std::from_chars(text.data(), text.data() + text.size(), value.magnitude, base);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// The signed fields.
std::optional<int64_t> ParseYamlInteger(std::string_view text) {
  const std::optional<YamlInteger> value = ParseYamlIntegerParts(text);
  if (!value.has_value()) return std::nullopt;
  constexpr uint64_t kMax = uint64_t(std::numeric_limits<int64_t>::max());
  if (value->magnitude > kMax + (value->negative ? 1 : 0)) return std::nullopt;
  return value->negative ? int64_t(0 - value->magnitude) : int64_t(value->magnitude);
}

// The unsigned fields (the seed, which --seed takes in full): no '-'.
std::optional<uint64_t> ParseYamlUnsigned(std::string_view text) {
  const std::optional<YamlInteger> value = ParseYamlIntegerParts(text);
  if (!value.has_value() || value->negative) return std::nullopt;
  return value->magnitude;
}

template <typename T>
absl::StatusOr<T> Scalar(const YAML::Node& node, std::string_view where, std::string_view type) {
  if (!node.IsScalar()) {
    return DCP_ERROR(InvalidArgument, "%s must be %s", where, type);
  }
  if constexpr (std::is_same_v<T, bool>) {
    // YAML 1.2's core schema: yaml-cpp (YAML 1.1) also reads y, yes, on, n, no, off.
    const std::string& text = node.Scalar();
    if (text == "true" || text == "True" || text == "TRUE") return true;
    if (text == "false" || text == "False" || text == "FALSE") return false;
    return DCP_ERROR(InvalidArgument, "%s must be %s, got '%s'", where, type, text);
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    const std::optional<uint64_t> value = ParseYamlUnsigned(node.Scalar());
    if (!value.has_value()) {
      return DCP_ERROR(InvalidArgument, "%s must be %s, got '%s'", where, type, node.Scalar());
    }
    return *value;
  } else if constexpr (std::is_integral_v<T>) {
    const std::optional<int64_t> value = ParseYamlInteger(node.Scalar());
    if (!value.has_value() || !std::in_range<T>(*value)) {
      return DCP_ERROR(InvalidArgument, "%s must be %s, got '%s'", where, type, node.Scalar());
    }
    return static_cast<T>(*value);
  } else if constexpr (std::is_same_v<T, float>) {
    // Read as a double, then narrowed only where a float holds it: 1e-50 would become 0 (for
    // softmax_scale, "the default") and 1e39 infinity.
    double value = 0;
    try {
      value = node.as<double>();
    } catch (const YAML::Exception&) {
      return DCP_ERROR(InvalidArgument, "%s must be %s, got '%s'", where, type, node.Scalar());
    }
    const double magnitude = std::fabs(value);
    if (std::isfinite(value) && magnitude != 0 &&
        (magnitude > std::numeric_limits<float>::max() ||
         magnitude < std::numeric_limits<float>::min())) {
      return DCP_ERROR(InvalidArgument, "%s = '%s' is outside a float's range (%g to %g)", where,
                       node.Scalar(), std::numeric_limits<float>::min(),
                       std::numeric_limits<float>::max());
    }
    return static_cast<float>(value);
  } else {
    try {
      return node.as<T>();
    } catch (const YAML::Exception&) {
      return DCP_ERROR(InvalidArgument, "%s must be %s, got '%s'", where, type, node.Scalar());
    }
  }
}

// One table entry per key: how to read it into the config.
struct Key {
  const char* name;
  std::function<absl::Status(const YAML::Node&, const std::string&, RunConfig*)> set;
};

template <typename T>
Key Field(const char* name, T RunConfig::*section, auto member, const char* type) {
  return Key{name,
             [section, member, type](const YAML::Node& node, const std::string& where,
                                     RunConfig* config) -> absl::Status {
               using Value = std::remove_reference_t<decltype((config->*section).*member)>;
               DCP_ASSIGN_OR_RETURN(Value value, Scalar<Value>(node, where, type));
               (config->*section).*member = value;
               return absl::OkStatus();
             }};
}

const std::map<std::string, std::vector<Key>>& Schema() {
  static const auto* schema = new std::map<std::string, std::vector<Key>>{
      {"model",
       {Key{"preset",
            [](const YAML::Node& node, const std::string& where, RunConfig* config) {
              DCP_ASSIGN_OR_RETURN(std::string name, Scalar<std::string>(node, where, "a name"));
              return ApplyModelPreset(name, config);
            }},
        Field("num_heads", &RunConfig::model, &ModelDims::num_heads, "an integer"),
        Field("kv_lora_rank", &RunConfig::model, &ModelDims::kv_lora_rank, "an integer"),
        Field("qk_nope_head_dim", &RunConfig::model, &ModelDims::qk_nope_head_dim, "an integer"),
        Field("qk_rope_head_dim", &RunConfig::model, &ModelDims::qk_rope_head_dim, "an integer"),
        Field("v_head_dim", &RunConfig::model, &ModelDims::v_head_dim, "an integer"),
        Field("softmax_scale", &RunConfig::model, &ModelDims::softmax_scale, "a number")}},
      {"scheduler",
       {Field("max_num_seqs", &RunConfig::scheduler, &SchedulerConfig::max_num_seqs, "an integer"),
        Field("max_model_len", &RunConfig::scheduler, &SchedulerConfig::max_model_len,
              "an integer"),
        Field("block_size", &RunConfig::scheduler, &SchedulerConfig::block_size, "an integer"),
        Field("decode_threshold", &RunConfig::scheduler, &SchedulerConfig::decode_threshold,
              "an integer"),
        Field("num_kv_blocks", &RunConfig::scheduler, &SchedulerConfig::num_kv_blocks,
              "an integer"),
        Key{"workspace_rows",
            [](const YAML::Node& node, const std::string& where, RunConfig* config) {
              DCP_ASSIGN_OR_RETURN(config->workspace_rows,
                                   Scalar<int64_t>(node, where, "an integer"));
              DCP_CHECK_ARG(config->workspace_rows >= 0, "%s must be >= 0 (0 = the formula)",
                            where);
              return absl::OkStatus();
            }}}},
      {"dcp",
       {Field("interleave", &RunConfig::dcp, &DcpConfig::interleave, "an integer"),
        Key{"combine",
            [](const YAML::Node& node, const std::string& where, RunConfig* config) {
              DCP_ASSIGN_OR_RETURN(std::string name, Scalar<std::string>(node, where, "a name"));
              return ParseCombineBackend(name, &config->dcp.combine);
            }},
        Field("comm_timeout_s", &RunConfig::dcp, &DcpConfig::comm_timeout_s, "a number")}},
      {"attention",
       {Field("index_topk", &RunConfig::attention, &AttentionConfig::index_topk, "an integer"),
        Field("is_sparse", &RunConfig::attention, &AttentionConfig::is_sparse, "true or false"),
        Field("force_mqa", &RunConfig::attention, &AttentionConfig::force_mqa, "true or false"),
        Field("validate_topk", &RunConfig::attention, &AttentionConfig::validate_topk,
              "true or false"),
        Field("prefill_backend", &RunConfig::attention, &AttentionConfig::prefill_backend,
              "a name"),
        Key{"kv_cache_dtype",
            [](const YAML::Node& node, const std::string& where, RunConfig* config) {
              DCP_ASSIGN_OR_RETURN(std::string name,
                                   Scalar<std::string>(node, where, "bf16 or fp8_ds_mla"));
              return ParseKvCacheDType(name, &config->attention.kv_cache_dtype);
            }}}},
      {"run",
       {Key{"batches",
            [](const YAML::Node& node, const std::string& where, RunConfig* config) {
              // A list of batch specs, or one string; either may list several batches
              // (',' between them, '_' joining the terms of one).
              config->run.batches.clear();
              std::vector<std::string> lists;
              if (node.IsScalar()) {
                lists.push_back(node.Scalar());
              } else if (node.IsSequence()) {
                for (const YAML::Node& item : node) {
                  DCP_ASSIGN_OR_RETURN(std::string spec,
                                       Scalar<std::string>(item, where, "a list of batch specs"));
                  lists.push_back(spec);
                }
              } else {
                return DCP_ERROR(InvalidArgument, "%s must be a list of batch specs", where);
              }
              for (const std::string& list : lists) {
                absl::StatusOr<std::vector<std::string>> specs = SplitBatchList(list);
                if (!specs.ok()) {
                  return DCP_ERROR(InvalidArgument, "%s: %s", where, specs.status().message());
                }
                config->run.batches.insert(config->run.batches.end(), specs->begin(),
                                           specs->end());
              }
              return absl::OkStatus();
            }},
        Field("problem", &RunConfig::run, &RunSection::problem, "a path"),
        Field("output", &RunConfig::run, &RunSection::output, "a path"),
        Field("device", &RunConfig::run, &RunSection::device, "cpu or cuda"),
        Field("comm", &RunConfig::run, &RunSection::comm, "mpi or nccl"),
        Field("seed", &RunConfig::run, &RunSection::seed, "a non-negative integer"),
        Field("iters", &RunConfig::run, &RunSection::iters, "an integer"),
        Field("warmup", &RunConfig::run, &RunSection::warmup, "an integer"),
        Field("check", &RunConfig::run, &RunSection::check, "true or false"),
        Field("tolerance", &RunConfig::run, &RunSection::tolerance, "a number"),
        Field("print_plan", &RunConfig::run, &RunSection::print_plan, "true or false"),
        Field("json", &RunConfig::run, &RunSection::json, "true or false")}},
  };
  return *schema;
}

// A mapping key as a name: only a plain scalar is one (`? [a, b]` is a key too in YAML).
absl::StatusOr<std::string> KeyName(std::string_view source, const YAML::Node& key,
                                    std::string_view what) {
  if (!key.IsScalar()) {
    return DCP_ERROR(InvalidArgument, "%s: expected %s, got a %s as a key",
                     Where(source, key, ""), what,
                     key.IsSequence() ? "list" : key.IsMap() ? "map" : "null");
  }
  return key.Scalar();
}

}  // namespace

absl::Status ApplyModelPreset(std::string_view name, RunConfig* config) {
  if (name == "small") {
    config->model = ModelDims{};
  } else if (name == "deepseek_v32" || name == "deepseek-v3.2") {
    config->model = ModelDims::DeepSeekV32();
  } else if (name == "glm5" || name == "glm-5") {
    config->model = ModelDims::Glm5();
  } else {
    return DCP_ERROR(InvalidArgument, "unknown model preset '%s' (small, deepseek_v32 or glm5)",
                     name);
  }
  config->model_preset = std::string(name);
  return absl::OkStatus();
}

absl::Status ApplyYamlConfig(std::string_view text, std::string_view source, RunConfig* config) {
  YAML::Node root;
  try {
    // A config is one document: YAML::Load reads the first and ignores the rest, errors
    // included, so the documents are counted first.
    if (CountDocuments(text, 2) > 1) {
      return DCP_ERROR(InvalidArgument,
                       "%s: holds several YAML documents ('---' separates them, and a stray "
                       "',' or ']' after the first starts another); a config is one document",
                       source);
    }
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return DCP_ERROR(InvalidArgument, "%s: not valid YAML: %s", source, e.what());
  }
  if (root.IsNull()) return absl::OkStatus();  // an empty file
  if (!root.IsMap()) {
    return DCP_ERROR(InvalidArgument, "%s: the config must be a map of sections (%s)", source,
                     "model, scheduler, dcp, attention, run");
  }
  const auto& schema = Schema();
  // Every key of the file once, as a plain name: yaml-cpp keeps a repeated key (the first one
  // wins on lookup) and accepts any node as a key, so both are checked here.
  std::set<std::string> sections_seen;
  for (auto it = root.begin(); it != root.end(); ++it) {
    DCP_ASSIGN_OR_RETURN(const std::string section, KeyName(source, it->first, "a section name"));
    if (!schema.contains(section)) {
      return DCP_ERROR(InvalidArgument,
                       "%s: unknown section '%s' (known: model, scheduler, dcp, attention, run)",
                       Where(source, it->first, ""), section);
    }
    if (!sections_seen.insert(section).second) {
      return DCP_ERROR(InvalidArgument,
                       "%s: section '%s' appears twice (merge the two into one)",
                       Where(source, it->first, ""), section);
    }
    if (!it->second.IsMap() && !it->second.IsNull()) {
      return DCP_ERROR(InvalidArgument, "%s: section '%s' must be a map",
                       Where(source, it->first, ""), section);
    }
    std::set<std::string> keys_seen;
    for (auto key = it->second.begin(); it->second.IsMap() && key != it->second.end(); ++key) {
      DCP_ASSIGN_OR_RETURN(const std::string name, KeyName(source, key->first, "a key name"));
      if (!keys_seen.insert(name).second) {
        return DCP_ERROR(InvalidArgument, "%s: key '%s.%s' appears twice",
                         Where(source, key->first, ""), section, name);
      }
    }
  }
  for (const auto& [section, keys] : schema) {
    const YAML::Node node = root[section];
    if (!node || node.IsNull()) continue;
    for (auto it = node.begin(); it != node.end(); ++it) {
      const std::string key = it->first.Scalar();
      bool found = false;
      for (const Key& k : keys) found = found || key == k.name;
      if (!found) {
        std::vector<std::string> names;
        for (const Key& k : keys) names.push_back(k.name);
        return DCP_ERROR(InvalidArgument, "%s: unknown key '%s.%s' (known: %s)",
                         Where(source, it->first, ""), section, key, absl::StrJoin(names, ", "));
      }
    }
    // Table order, so that model.preset comes before the dims that refine it.
    for (const Key& k : keys) {
      const YAML::Node value = node[k.name];
      if (!value) continue;
      const std::string full = absl::StrFormat("%s.%s", section, k.name);
      DCP_RETURN_IF_ERROR(k.set(value, Where(source, value, full), config));
      config->explicit_keys.insert(full);
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRunSection(const RunConfig& config) {
  const RunSection& run = config.run;
  DCP_CHECK_ARG(run.device == "cpu" || run.device == "cuda",
                "--device must be cpu or cuda, got '%s'", run.device);
  DCP_CHECK_ARG(run.comm == "mpi" || run.comm == "nccl" || run.comm == "auto",
                "--comm must be mpi, nccl or auto, got '%s'", run.comm);
  DCP_CHECK_ARG(!(run.comm == "nccl" && run.device != "cuda"),
                "--comm nccl needs --device cuda (NCCL moves device buffers)");
  DCP_CHECK_ARG(run.iters >= 1, "--iters must be >= 1, got %d", run.iters);
  DCP_CHECK_ARG(run.warmup >= 0, "--warmup must be >= 0, got %d", run.warmup);
  DCP_CHECK_ARG(run.tolerance >= 0, "--tolerance must be >= 0, got %g", run.tolerance);
  DCP_CHECK_ARG(!(run.problem.empty() && run.batches.empty()),
                "nothing to run: give --batch (e.g. 8q1kv1k) or --problem FILE, or a config "
                "whose run section lists batches");
  DCP_CHECK_ARG(run.problem.empty() || run.batches.empty(), "give --batch or --problem, not both");
  // --print-plan runs nothing and writes nothing: it plans the first batch of any number.
  DCP_CHECK_ARG(run.output.empty() || run.print_plan || !run.problem.empty() ||
                    run.batches.size() == 1,
                "--output writes one batch's result, but %d batches are listed",
                run.batches.size());
  return absl::OkStatus();
}

}  // namespace dcp::launch
