#include "launch/flags.h"

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "runtime/status.h"

ABSL_FLAG(std::string, config, "", "YAML config (sections model, scheduler, dcp, attention, run)");
ABSL_FLAG(std::string, batch, "",
          "batch spec(s), e.g. q2k, 8q1s1k, 16q64s128; several batches separated by ';'");
ABSL_FLAG(std::string, problem, "", "problem file (safetensors, FORMATS.md) to run instead");
ABSL_FLAG(std::string, output, "", "result file (safetensors): out, lse and the route");
ABSL_FLAG(std::string, model, "small", "model preset: small (CPU-sized) or deepseek_v32");
ABSL_FLAG(int, num_heads, 16, "query heads H of the whole group (divisible by the ranks)");
ABSL_FLAG(std::string, device, "cpu", "rank device: cpu or cuda");
ABSL_FLAG(std::string, comm, "mpi",
          "collectives: mpi, nccl (needs --device cuda) or auto (nccl when every rank has its "
          "own GPU)");
ABSL_FLAG(std::string, combine, "ag_rs", "sparse MQA combine: ag_rs or a2a");
ABSL_FLAG(int, interleave, 1, "KV interleave I (cp_kv_cache_interleave_size), divides block size");
ABSL_FLAG(int, block_size, 64, "KV block size B");
ABSL_FLAG(int, max_num_seqs, 64, "scheduler max_num_seqs N");
ABSL_FLAG(int, max_model_len, 4096, "scheduler max_model_len M");
ABSL_FLAG(int, num_kv_blocks, 0, "per-rank KV block pool (0 = enough for N full sequences)");
ABSL_FLAG(int64_t, workspace_rows, 0,
          "chunked-prefill workspace rows S (0 = the formula of DESIGN.md section 6)");
ABSL_FLAG(int, index_topk, 2048, "top-k width K of the sparse attention");
ABSL_FLAG(int, decode_threshold, 1, "a request with query_len <= this is a decode");
ABSL_FLAG(bool, force_mqa, false, "always take the sparse MQA route");
ABSL_FLAG(std::string, prefill_backend, "auto", "dense MHA prefill backend: auto, none or a name");
ABSL_FLAG(double, comm_timeout, 300.0, "seconds before a stuck collective is an error");
ABSL_FLAG(uint64_t, seed, 0, "seed of the synthetic data");
ABSL_FLAG(int, iters, 1, "timed Forward calls per batch");
ABSL_FLAG(int, warmup, 0, "untimed Forward calls per batch before the timed ones");
ABSL_FLAG(bool, check, false, "compare with the single-rank reference on rank 0; exit 1 past "
          "tolerance");
ABSL_FLAG(double, tolerance, 0.0, "max relative error of --check (0 = 1e-3 for F32 storage, "
          "3e-2 for BF16)");
ABSL_FLAG(bool, print_plan, false, "rank 0 prints the first batch's plan as JSON; nothing runs");
ABSL_FLAG(bool, json, false, "print the summary as one JSON object");

namespace dcp::launch {
namespace {

// The flags of this file, in the order --help lists them.
constexpr const char* kFlagNames[] = {
    "config",       "batch",         "problem",         "output",         "model",
    "num_heads",    "device",        "comm",            "combine",        "interleave",
    "block_size",   "max_num_seqs",  "max_model_len",   "num_kv_blocks",  "workspace_rows", "index_topk",
    "decode_threshold", "force_mqa", "prefill_backend", "comm_timeout",   "seed",
    "iters",        "warmup",        "check",           "tolerance",      "print_plan",
    "json"};

absl::CommandLineFlag* FindOurs(std::string_view name) {
  for (const char* ours : kFlagNames) {
    if (name == ours) return absl::FindCommandLineFlag(ours);
  }
  return nullptr;
}

}  // namespace

std::string CommandLine::config_path() const { return absl::GetFlag(FLAGS_config); }

absl::StatusOr<CommandLine> ParseCommandLine(int argc, const char* const* argv) {
  CommandLine result;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-help" || arg == "-h" || arg == "--helpfull") {
      result.help = true;
      continue;
    }
    if (arg.size() < 2 || arg[0] != '-' || arg == "--") {
      return DCP_ERROR(InvalidArgument, "unexpected argument '%s' (dcp_run takes only flags; "
                       "see --help)", arg);
    }
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    std::string name(arg.substr(0, arg.find('=')));
    const bool has_value = arg.find('=') != std::string_view::npos;
    std::string value = has_value ? std::string(arg.substr(arg.find('=') + 1)) : "";
    absl::StrReplaceAll({{"-", "_"}}, &name);

    absl::CommandLineFlag* flag = FindOurs(name);
    if (flag == nullptr && absl::StartsWith(name, "no") && !has_value) {
      absl::CommandLineFlag* negated = FindOurs(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        flag = negated;
        name = name.substr(2);
        value = "false";
      }
    }
    if (flag == nullptr) {
      return DCP_ERROR(InvalidArgument, "unknown flag '%s' (see --help)", argv[i]);
    }
    if (!has_value && value.empty()) {
      if (flag->IsOfType<bool>()) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return DCP_ERROR(InvalidArgument, "flag '--%s' needs a value", name);
      }
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return DCP_ERROR(InvalidArgument, "bad value '%s' for flag '--%s': %s", value, name, error);
    }
    result.given.insert(name);
  }
  return result;
}

absl::Status ApplyFlags(const CommandLine& command_line, RunConfig* config) {
  const auto given = [&](const char* name) { return command_line.given.contains(name); };
  const auto mark = [&](const char* key) { config->explicit_keys.insert(key); };
  // The preset first: explicit dims below refine it.
  if (given("model")) {
    DCP_RETURN_IF_ERROR(ApplyModelPreset(absl::GetFlag(FLAGS_model), config));
    for (const char* key : {"model.num_heads", "model.kv_lora_rank", "model.qk_nope_head_dim",
                            "model.qk_rope_head_dim", "model.v_head_dim"}) {
      config->explicit_keys.erase(key);
    }
  }
  if (given("num_heads")) config->model.num_heads = absl::GetFlag(FLAGS_num_heads), mark("model.num_heads");
  if (given("batch")) {
    config->run.batches.clear();
    for (absl::string_view spec : absl::StrSplit(absl::GetFlag(FLAGS_batch), ';')) {
      spec = absl::StripAsciiWhitespace(spec);
      if (!spec.empty()) config->run.batches.emplace_back(spec);
    }
    if (config->run.batches.empty()) {
      return DCP_ERROR(InvalidArgument, "--batch is empty (expected e.g. q2k, 8q1s1k, 16q64s128)");
    }
    if (!given("problem")) config->run.problem.clear();  // the command line wins over the file
    mark("run.batches");
  }
  if (given("problem")) {
    config->run.problem = absl::GetFlag(FLAGS_problem);
    if (!given("batch")) config->run.batches.clear();
    mark("run.problem");
  }
  if (given("output")) config->run.output = absl::GetFlag(FLAGS_output), mark("run.output");
  if (given("device")) config->run.device = absl::GetFlag(FLAGS_device), mark("run.device");
  if (given("comm")) config->run.comm = absl::GetFlag(FLAGS_comm), mark("run.comm");
  if (given("combine")) {
    DCP_RETURN_IF_ERROR(ParseCombineBackend(absl::GetFlag(FLAGS_combine), &config->dcp.combine));
    mark("dcp.combine");
  }
  if (given("interleave")) config->dcp.interleave = absl::GetFlag(FLAGS_interleave), mark("dcp.interleave");
  if (given("comm_timeout")) {
    config->dcp.comm_timeout_s = absl::GetFlag(FLAGS_comm_timeout);
    mark("dcp.comm_timeout_s");
  }
  if (given("block_size")) {
    config->scheduler.block_size = absl::GetFlag(FLAGS_block_size);
    mark("scheduler.block_size");
  }
  if (given("max_num_seqs")) {
    config->scheduler.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
    mark("scheduler.max_num_seqs");
  }
  if (given("max_model_len")) {
    config->scheduler.max_model_len = absl::GetFlag(FLAGS_max_model_len);
    mark("scheduler.max_model_len");
  }
  if (given("num_kv_blocks")) {
    config->scheduler.num_kv_blocks = absl::GetFlag(FLAGS_num_kv_blocks);
    mark("scheduler.num_kv_blocks");
  }
  if (given("workspace_rows")) {
    config->workspace_rows = absl::GetFlag(FLAGS_workspace_rows);
    DCP_CHECK_ARG(config->workspace_rows >= 0, "--workspace-rows must be >= 0, got %d",
                  config->workspace_rows);
    mark("scheduler.workspace_rows");
  }
  if (given("decode_threshold")) {
    config->scheduler.decode_threshold = absl::GetFlag(FLAGS_decode_threshold);
    mark("scheduler.decode_threshold");
  }
  if (given("index_topk")) {
    config->attention.index_topk = absl::GetFlag(FLAGS_index_topk);
    mark("attention.index_topk");
  }
  if (given("force_mqa")) {
    config->attention.force_mqa = absl::GetFlag(FLAGS_force_mqa);
    mark("attention.force_mqa");
  }
  if (given("prefill_backend")) {
    config->attention.prefill_backend = absl::GetFlag(FLAGS_prefill_backend);
    mark("attention.prefill_backend");
  }
  if (given("seed")) config->run.seed = absl::GetFlag(FLAGS_seed), mark("run.seed");
  if (given("iters")) config->run.iters = absl::GetFlag(FLAGS_iters), mark("run.iters");
  if (given("warmup")) config->run.warmup = absl::GetFlag(FLAGS_warmup), mark("run.warmup");
  if (given("check")) config->run.check = absl::GetFlag(FLAGS_check), mark("run.check");
  if (given("tolerance")) {
    config->run.tolerance = absl::GetFlag(FLAGS_tolerance);
    mark("run.tolerance");
  }
  if (given("print_plan")) {
    config->run.print_plan = absl::GetFlag(FLAGS_print_plan);
    mark("run.print_plan");
  }
  if (given("json")) config->run.json = absl::GetFlag(FLAGS_json), mark("run.json");
  return absl::OkStatus();
}

std::string UsageText(const char* program) {
  std::string text = absl::StrCat(
      "usage: mpirun -np W ", program, " [--config FILE] [--batch SPEC | --problem FILE] "
      "[flags]\n\nRuns one DCP attention layer over the MPI world; flags override the config "
      "file.\n\nflags:\n");
  for (const char* name : kFlagNames) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string shown = absl::StrReplaceAll(name, {{"_", "-"}});
    absl::StrAppend(&text, "  --", shown, "  ", flag->Help(), " (default: ",
                    flag->DefaultValue().empty() ? "none" : flag->DefaultValue(), ")\n");
  }
  return text;
}

}  // namespace dcp::launch
