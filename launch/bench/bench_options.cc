#include "launch/bench/bench_options.h"

#include <cmath>
#include <functional>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "core/status.h"
#include "launch/batch_spec.h"
#include "launch/limits.h"

namespace dcp::bench {
namespace {

using Setter = std::function<absl::Status(BenchOptions&, const std::string&)>;

struct Flag {
  const char* short_name;  // "-n", or nullptr
  const char* long_name;   // "iters" (matched with '-' or '_')
  const char* value_name;  // nullptr: a boolean switch taking no value
  const char* help;
  Setter set;
};

absl::Status BadValue(const char* flag, const std::string& value, const std::string& why) {
  return DCP_ERROR(InvalidArgument, "--%s: bad value '%s': %s", flag, value, why);
}

Setter IntFlag(const char* name, int BenchOptions::*field, int min_value) {
  return [=](BenchOptions& o, const std::string& v) -> absl::Status {
    int value = 0;
    if (!absl::SimpleAtoi(v, &value)) return BadValue(name, v, "not an integer");
    if (value < min_value) return BadValue(name, v, absl::StrCat("must be >= ", min_value));
    o.*field = value;
    return absl::OkStatus();
  };
}

Setter BytesFlag(const char* name, int64_t BenchOptions::*field, int64_t min_value) {
  return [=](BenchOptions& o, const std::string& v) -> absl::Status {
    absl::StatusOr<int64_t> value = ParseBytes(v);
    if (!value.ok()) return BadValue(name, v, std::string(value.status().message()));
    if (*value < min_value) return BadValue(name, v, absl::StrCat("must be >= ", min_value));
    o.*field = *value;
    return absl::OkStatus();
  };
}

Setter ChoiceFlag(const char* name, std::string BenchOptions::*field,
                  std::vector<std::string> choices) {
  return [=](BenchOptions& o, const std::string& v) -> absl::Status {
    for (const std::string& choice : choices) {
      if (v == choice) {
        o.*field = v;
        return absl::OkStatus();
      }
    }
    return BadValue(name, v, absl::StrCat("expected one of ", absl::StrJoin(choices, ", ")));
  };
}

Setter IntListFlag(const char* name, std::vector<int> BenchOptions::*field) {
  return [=](BenchOptions& o, const std::string& v) -> absl::Status {
    std::vector<int> values;
    for (absl::string_view item : absl::StrSplit(v, ',', absl::SkipEmpty())) {
      // A `k` suffix multiplies by 1024, as in batch specs (8k = 8192).
      std::string text(item);
      int64_t factor = 1;
      if (!text.empty() && (text.back() == 'k' || text.back() == 'K')) {
        factor = 1024;
        text.pop_back();
      }
      int value = 0;
      if (!absl::SimpleAtoi(text, &value) || value < 1 ||
          value * factor > std::numeric_limits<int32_t>::max()) {
        return BadValue(name, v, absl::StrCat("'", item, "' is not a positive integer"));
      }
      values.push_back(static_cast<int>(value * factor));
    }
    if (values.empty()) return BadValue(name, v, "empty list");
    o.*field = values;
    return absl::OkStatus();
  };
}

// A comma-separated list of names (--only's kernel name prefixes, --prefill_backend), not
// checked against the batch grammar.
Setter NameListFlag(std::vector<std::string> BenchOptions::*field) {
  return [=](BenchOptions& o, const std::string& v) -> absl::Status {
    (o.*field).clear();
    for (absl::string_view piece : absl::StrSplit(v, ',', absl::SkipWhitespace())) {
      (o.*field).emplace_back(absl::StripAsciiWhitespace(piece));
    }
    return absl::OkStatus();
  };
}

// A batch list in dcp_run's grammar (launch/batch_spec.h, which refuses whitespace); '' is the
// empty list.
Setter StringListFlag(const char* name, std::vector<std::string> BenchOptions::*field) {
  return [=](BenchOptions& o, const std::string& v) -> absl::Status {
    if (v.empty()) {
      (o.*field).clear();
      return absl::OkStatus();
    }
    absl::StatusOr<std::vector<std::string>> specs = launch::SplitBatchList(v);
    if (!specs.ok()) return BadValue(name, v, std::string(specs.status().message()));
    o.*field = *std::move(specs);
    return absl::OkStatus();
  };
}

const std::vector<Flag>& Flags() {
  static const std::vector<Flag>* flags = new std::vector<Flag>{
      {nullptr, "mode", "routes|kernels|collectives|engine", "what to measure (default routes)",
       [](BenchOptions& o, const std::string& v) -> absl::Status {
         if (v == "routes")
           o.mode = Mode::kRoutes;
         else if (v == "kernels")
           o.mode = Mode::kKernels;
         else if (v == "collectives")
           o.mode = Mode::kCollectives;
         else if (v == "engine")
           o.mode = Mode::kEngine;
         else
           return BadValue("mode", v, "expected routes, kernels, collectives or engine");
         return absl::OkStatus();
       }},
      {nullptr, "device", "cpu|cuda", "the ranks' device (default cpu)",
       ChoiceFlag("device", &BenchOptions::device, {"cpu", "cuda"})},
      {nullptr, "comm", "auto|mpi|nccl",
       "data-plane communicator (default auto: NCCL on CUDA ranks with a GPU each, else MPI)",
       ChoiceFlag("comm", &BenchOptions::comm, {"auto", "mpi", "nccl"})},
      {nullptr, "model", "deepseek_v32|glm5|small",
       "model dimensions, as dcp_run --model: DeepSeek-V3.2 (R 512, Dn 128, Dr 64, Dv 128), "
       "GLM-5 (R 512, Dn 192, Dr 64, Dv 256) or the small test dims (R 64, Dn 32, Dr 16, Dv 32) "
       "(default deepseek_v32)",
       ChoiceFlag("model", &BenchOptions::dims, {"deepseek_v32", "glm5", "small"})},
      {nullptr, "prefill_backend", "LIST",
       "dense MHA prefill backends: auto, native, cudnn (kernels mode: a dense_mha row each; "
       "routes mode: the first) (default auto)",
       NameListFlag(&BenchOptions::prefill_backends)},
      {nullptr, "only", "LIST",
       "kernels mode: time only kernels whose name starts with one of these (e.g. dense_mha)",
       NameListFlag(&BenchOptions::only)},
      {"-w", "warmup_iters", "N", "warm-up iterations, not timed (default 2)",
       IntFlag("warmup_iters", &BenchOptions::warmup_iters, 0)},
      {"-n", "iters", "N", "timed iterations; the median is reported (default 10)",
       IntFlag("iters", &BenchOptions::iters, 1)},
      {"-b", "minbytes", "BYTES", "smallest size of the size sweeps (default 1M)",
       BytesFlag("minbytes", &BenchOptions::min_bytes, 1)},
      {"-e", "maxbytes", "BYTES", "largest size of the size sweeps (default 64M)",
       BytesFlag("maxbytes", &BenchOptions::max_bytes, 1)},
      {"-f", "stepfactor", "F", "multiply the size by F at each step (default 4)",
       [](BenchOptions& o, const std::string& v) -> absl::Status {
         double value = 0;
         if (!absl::SimpleAtod(v, &value) || !(value > 1.0) || !std::isfinite(value)) {
           return BadValue("stepfactor", v, "must be a number > 1");
         }
         o.step_factor = value;
         return absl::OkStatus();
       }},
      {"-c", "check", "0|1", "run the built-in correctness check, counted in #wrong (default 1)",
       [](BenchOptions& o, const std::string& v) -> absl::Status {
         if (v != "0" && v != "1") return BadValue("check", v, "expected 0 or 1");
         o.check = v == "1";
         return absl::OkStatus();
       }},
      {nullptr, "heads", "LIST", "per-rank query heads H/W to sweep (default 16,32,64,128)",
       IntListFlag("heads", &BenchOptions::heads)},
      {nullptr, "batches", "SPECS",
       "batch specs replacing the default sweep, as dcp_run --batch: ',' separates batches, "
       "'_' joins the terms of one (e.g. q1k,16q64kv128,2q8_4q64kv128)",
       StringListFlag("batches", &BenchOptions::batches)},
      {nullptr, "batch_sizes", "LIST", "requests per pure-prefill batch (default 1,2,...,64)",
       IntListFlag("batch_sizes", &BenchOptions::batch_sizes)},
      {nullptr, "seq_lens", "LIST", "pure-prefill lengths (default 1,2,4,...,8k)",
       IntListFlag("seq_lens", &BenchOptions::seq_lens)},
      {nullptr, "extends", "SPECS",
       "extend batches after the grid (default 16q64kv128,32q64kv128,64q64kv128; '' for none)",
       StringListFlag("extends", &BenchOptions::extends)},
      {nullptr, "max_tokens", "N", "skip batches of more query tokens (default 32768)",
       BytesFlag("max_tokens", &BenchOptions::max_tokens, 1)},
      {nullptr, "index_topk", "K", "top-k width K (default 2048)",
       IntFlag("index_topk", &BenchOptions::index_topk, 1)},
      {nullptr, "block_size", "B", "KV cache block size (default 64)",
       IntFlag("block_size", &BenchOptions::block_size, 1)},
      {nullptr, "interleave", "I", "cp_kv_cache_interleave_size (default 1)",
       IntFlag("interleave", &BenchOptions::interleave, 1)},
      {nullptr, "combine", "ag_rs|a2a", "sparse-MQA combine of the routes mode (default ag_rs)",
       ChoiceFlag("combine", &BenchOptions::combine, {"ag_rs", "a2a"})},
      {nullptr, "output_dtype", "f32|bf16",
       "the layer's out dtype in the routes and engine modes, and the dense MHA rows' out in the "
       "kernels mode (default f32)",
       ChoiceFlag("output_dtype", &BenchOptions::output_dtype, {"f32", "bf16"})},
      {nullptr, "kernel_world", "W",
       "world size assumed by DcpCorrect/DcpCombine in the kernels mode (default 8)",
       IntFlag("kernel_world", &BenchOptions::kernel_world, 1)},
      {nullptr, "gemm_size", "N",
       "m = n = k of the bf16 GEMM ceiling (default 8192 on CUDA, 1024 on CPU)",
       BytesFlag("gemm_size", &BenchOptions::gemm_size, 1)},
      {nullptr, "copy_bytes", "BYTES",
       "buffer of the device-to-device copy ceiling (default 1G on CUDA, 64M on CPU)",
       BytesFlag("copy_bytes", &BenchOptions::copy_bytes, 1)},
      {nullptr, "timeout", "SECONDS", "a collective stuck longer is an error (default 300)",
       [](BenchOptions& o, const std::string& v) -> absl::Status {
         double value = 0;
         if (!absl::SimpleAtod(v, &value) || !std::isfinite(value) ||
             value < launch::kMinCommTimeoutS || value > launch::kMaxCommTimeoutS) {
           return BadValue("timeout", v,
                           absl::StrFormat("must be a number of seconds in [%g, %g], as dcp_run's",
                                           launch::kMinCommTimeoutS, launch::kMaxCommTimeoutS));
         }
         o.timeout_s = value;
         return absl::OkStatus();
       }},
      {nullptr, "seed", "N", "seed of the generated data (default 1)",
       [](BenchOptions& o, const std::string& v) -> absl::Status {
         if (!absl::SimpleAtoi(v, &o.seed)) return BadValue("seed", v, "not an integer");
         return absl::OkStatus();
       }},
      {nullptr, "csv", "FILE", "also write the results as CSV (rank 0)",
       [](BenchOptions& o, const std::string& v) -> absl::Status {
         if (v.empty()) return BadValue("csv", v, "empty path");
         o.csv = v;
         return absl::OkStatus();
       }},
      {nullptr, "force", nullptr,
       "run a sweep estimated to take over an hour on CPU ranks (refused without it)",
       [](BenchOptions& o, const std::string&) -> absl::Status {
         o.force = true;
         return absl::OkStatus();
       }},
      {nullptr, "version", nullptr, "print the version and the git commit of the build",
       [](BenchOptions& o, const std::string&) -> absl::Status {
         o.version = true;
         return absl::OkStatus();
       }},
      {"-h", "help", nullptr, "print this help",
       [](BenchOptions& o, const std::string&) -> absl::Status {
         o.help = true;
         return absl::OkStatus();
       }},
  };
  return *flags;
}

const Flag* FindLong(const std::string& name) {
  const std::string key = absl::StrReplaceAll(name, {{"-", "_"}});
  for (const Flag& flag : Flags()) {
    if (key == flag.long_name) return &flag;
  }
  return nullptr;
}

const Flag* FindShort(const std::string& name) {
  for (const Flag& flag : Flags()) {
    if (flag.short_name != nullptr && name == flag.short_name) return &flag;
  }
  return nullptr;
}

}  // namespace

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::kRoutes:
      return "routes";
    case Mode::kKernels:
      return "kernels";
    case Mode::kCollectives:
      return "collectives";
    case Mode::kEngine:
      return "engine";
  }
  return "?";
}

absl::StatusOr<int64_t> ParseBytes(const std::string& text) {
  if (text.empty()) return DCP_ERROR(InvalidArgument, "empty size");
  std::string digits = text;
  int64_t factor = 1;
  switch (digits.back()) {
    case 'k':
    case 'K':
      factor = int64_t{1} << 10;
      break;
    case 'm':
    case 'M':
      factor = int64_t{1} << 20;
      break;
    case 'g':
    case 'G':
      factor = int64_t{1} << 30;
      break;
    default:
      break;
  }
  if (factor != 1) digits.pop_back();
  int64_t value = 0;
  if (!absl::SimpleAtoi(digits, &value) || value < 0 ||
      value > std::numeric_limits<int64_t>::max() / factor) {
    return DCP_ERROR(InvalidArgument, "'%s' is not a size (digits with an optional K/M/G)", text);
  }
  return value * factor;
}

std::vector<std::string> BenchOptions::BatchList() const {
  if (!batches.empty()) return batches;
  std::vector<std::string> list;
  for (int batch_size : batch_sizes) {
    for (int seq_len : seq_lens) {
      const std::string length =
          seq_len % 1024 == 0 ? absl::StrCat(seq_len / 1024, "k") : absl::StrCat(seq_len);
      list.push_back(batch_size == 1 ? absl::StrCat("q", length)
                                     : absl::StrCat(batch_size, "q", length));
    }
  }
  list.insert(list.end(), extends.begin(), extends.end());
  return list;
}

absl::StatusOr<BenchOptions> ParseBenchOptions(int argc, const char* const* argv) {
  BenchOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const Flag* flag = nullptr;
    std::string value;
    bool has_value = false;
    if (arg.rfind("--", 0) == 0 && arg.size() > 2) {
      const size_t equals = arg.find('=');
      flag = FindLong(arg.substr(2, equals == std::string::npos ? std::string::npos : equals - 2));
      if (equals != std::string::npos) {
        value = arg.substr(equals + 1);
        has_value = true;
      }
    } else if (arg.size() >= 2 && arg[0] == '-' && arg[1] != '-') {
      flag = FindShort(arg.substr(0, 2));
      if (flag != nullptr && arg.size() > 2) {  // -n5, as getopt takes it
        value = arg.substr(2);
        has_value = true;
      }
    } else {
      return DCP_ERROR(InvalidArgument, "unexpected argument '%s' (see --help)", arg);
    }
    if (flag == nullptr) {
      return DCP_ERROR(InvalidArgument, "unknown flag '%s' (see --help)", arg);
    }
    if (flag->value_name == nullptr) {
      if (has_value) {
        return DCP_ERROR(InvalidArgument, "flag '%s' takes no value", arg);
      }
    } else if (!has_value) {
      if (i + 1 >= argc) {
        return DCP_ERROR(InvalidArgument, "flag '%s' needs a value (%s)", arg, flag->value_name);
      }
      value = argv[++i];
    }
    DCP_RETURN_IF_ERROR(flag->set(options, value));
  }
  if (options.help || options.version) return options;
  DCP_CHECK_ARG(options.min_bytes <= options.max_bytes,
                "-b/--minbytes (%d) must not exceed -e/--maxbytes (%d)", options.min_bytes,
                options.max_bytes);
  for (const int heads : options.heads) {
    DCP_CHECK_ARG(heads <= launch::kMaxHeads,
                  "--heads %d per rank is more than the ceiling of %d heads (dcp_run's)", heads,
                  launch::kMaxHeads);
  }
  DCP_CHECK_ARG(options.index_topk <= launch::kMaxIndexTopk,
                "--index_topk %d is more than the ceiling of %d (dcp_run's)", options.index_topk,
                launch::kMaxIndexTopk);
  DCP_CHECK_ARG(options.block_size % options.interleave == 0,
                "--interleave (%d) must divide --block_size (%d)", options.interleave,
                options.block_size);
  if (options.comm == "nccl") {
    DCP_CHECK_ARG(options.device == "cuda", "--comm nccl needs --device cuda");
  }
  return options;
}

std::string BenchUsage(const char* program) {
  std::string text = absl::StrFormat(
      "usage: mpirun -np N %s [flags]\n"
      "Benchmarks of the DCP attention layer. Modes:\n"
      "  routes       whole-layer latency (DcpContext::Forward) through the planner's route\n"
      "               (dense MHA when eligible) and through forced sparse MQA, per batch and\n"
      "               per-rank head count; speedup mqa/mha and the crossover seq_len\n"
      "  kernels      each Device kernel alone: median time, TFLOP/s or GB/s, fraction of the\n"
      "               copy and GEMM ceilings measured in the same run\n"
      "  collectives  workspace fill and both sparse-MQA combines over a size sweep: time,\n"
      "               algbw, busbw (nccl-tests factors) and #wrong from a built-in check;\n"
      "               over NCCL also all_gather, reduce_scatter, all_to_all and ws_fill against\n"
      "               raw NCCL calls on the same bytes (table _nccl: ratio, fill)\n"
      "  engine       the layer as an engine runs it (DcpEngine: Plan once per step, Run per\n"
      "               layer over an engine-owned paged cache): plan and host us, eager and\n"
      "               graph-replayed layer time (CUDA ranks over NCCL), the captured kernels'\n"
      "               sum, the GPU's busy time (CUPTI) and the overhead beyond it\n"
      "Exit status: 0 ok, 1 a run failed or #wrong > 0, 2 bad command line.\n\nflags:\n",
      program);
  for (const Flag& flag : Flags()) {
    std::string names = flag.short_name != nullptr
                            ? absl::StrCat(flag.short_name, ", --", flag.long_name)
                            : absl::StrCat("    --", flag.long_name);
    if (flag.value_name != nullptr) absl::StrAppend(&names, " ", flag.value_name);
    // The help wrapped at 100 columns, continuation lines under its first word.
    constexpr size_t kIndent = 43, kWidth = 100;
    std::string line = absl::StrFormat("  %-40s ", names);
    for (absl::string_view word : absl::StrSplit(flag.help, ' ', absl::SkipEmpty())) {
      if (line.size() > kIndent && line.size() + word.size() > kWidth) {
        absl::StrAppend(&text, absl::StripTrailingAsciiWhitespace(line), "\n");
        line = std::string(kIndent, ' ');
      }
      absl::StrAppend(&line, word, " ");
    }
    line.pop_back();
    absl::StrAppend(&text, line, "\n");
  }
  return text;
}

}  // namespace dcp::bench
