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
#include "core/status.h"
#include "launch/batch_spec.h"

ABSL_FLAG(std::string, config, "", "YAML config (sections model, scheduler, dcp, attention, run)");
ABSL_FLAG(std::string, batch, "",
          "batch spec(s), vLLM's grammar: '_' joins the terms of one batch, ',' separates "
          "batches, e.g. q2k,8q1kv1k,2q2k_32q1kv1k");
ABSL_FLAG(std::string, problem, "", "problem file (safetensors, FORMATS.md) to run instead");
ABSL_FLAG(std::string, output, "", "result file (safetensors): out, lse and the route");
ABSL_FLAG(std::string, model, "small", "model preset: small (CPU-sized), deepseek_v32 or glm5");
ABSL_FLAG(int, num_heads, 16, "query heads H of the whole group (divisible by the ranks)");
ABSL_FLAG(std::string, device, "cpu", "rank device: cpu or cuda");
ABSL_FLAG(std::string, comm, "auto",
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
ABSL_FLAG(bool, validate_topk, true,
          "check the top-k indices on the device every step that reads them");
ABSL_FLAG(std::string, prefill_backend, "auto", "dense MHA prefill backend: auto, none or a name");
ABSL_FLAG(std::string, kv_cache_dtype, "bf16",
          "KV cache rows: bf16 or fp8_ds_mla (vLLM's 656-byte FP8 rows; R 512, Dr 64)");
ABSL_FLAG(double, comm_timeout, 300.0, "seconds before a stuck collective is an error");
ABSL_FLAG(uint64_t, seed, 0, "seed of the synthetic data");
ABSL_FLAG(int, iters, 1, "timed Forward calls per batch");
ABSL_FLAG(int, warmup, 0, "untimed Forward calls per batch before the timed ones");
ABSL_FLAG(bool, check, false,
          "compare with the single-rank reference on rank 0; exit 1 past "
          "tolerance");
ABSL_FLAG(double, tolerance, 0.0,
          "max relative error of --check (0 = 1e-4 for F32 storage, "
          "5e-2 for BF16)");
ABSL_FLAG(bool, print_plan, false, "rank 0 prints the first batch's plan as JSON; nothing runs");
ABSL_FLAG(bool, json, false, "print the summary as one JSON object");

namespace dcp::launch {
namespace {

// The flags of this file, in the order --help lists them.
// clang-format off
constexpr const char* kFlagNames[] = {
    "config", "batch", "problem", "output", "model", "num_heads", "device", "comm", "combine",
    "interleave", "block_size", "max_num_seqs", "max_model_len", "num_kv_blocks",
    "workspace_rows", "index_topk", "decode_threshold", "force_mqa", "validate_topk",
    "prefill_backend", "kv_cache_dtype", "comm_timeout", "seed", "iters", "warmup", "check",
    "tolerance", "print_plan", "json"};
// clang-format on

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
    if (arg == "--version") {
      result.version = true;
      continue;
    }
    if (arg.size() < 2 || arg[0] != '-' || arg == "--") {
      return DCP_ERROR(InvalidArgument,
                       "unexpected argument '%s' (dcp_run takes only flags; "
                       "see --help)",
                       arg);
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
  // Copies a flag given on the command line into its config field, marked explicit.
  const auto apply = [&](const char* name, const char* key, const auto& flag, auto* field) {
    if (!given(name)) return;
    *field = absl::GetFlag(flag);
    config->explicit_keys.insert(key);
  };
  // The preset first: explicit dims below refine it.
  if (given("model")) {
    DCP_RETURN_IF_ERROR(ApplyModelPreset(absl::GetFlag(FLAGS_model), config));
    config->explicit_keys.insert("model.preset");
    for (const char* key : {"model.num_heads", "model.kv_lora_rank", "model.qk_nope_head_dim",
                            "model.qk_rope_head_dim", "model.v_head_dim"}) {
      config->explicit_keys.erase(key);
    }
  }
  apply("num_heads", "model.num_heads", FLAGS_num_heads, &config->model.num_heads);

  // --batch and --problem replace each other's value from the file.
  if (given("batch")) {
    const std::string list = absl::GetFlag(FLAGS_batch);
    if (absl::StripAsciiWhitespace(list).empty()) {
      return DCP_ERROR(InvalidArgument,
                       "--batch is empty (expected e.g. q2k, 8q1kv1k, q2k,2q2k_32q1kv1k)");
    }
    DCP_ASSIGN_OR_RETURN(config->run.batches, SplitBatchList(list));
    if (!given("problem")) config->run.problem.clear();
    config->explicit_keys.insert("run.batches");
  }
  if (given("problem")) {
    config->run.problem = absl::GetFlag(FLAGS_problem);
    if (!given("batch")) config->run.batches.clear();
    config->explicit_keys.insert("run.problem");
  }

  if (given("combine")) {
    DCP_RETURN_IF_ERROR(ParseCombineBackend(absl::GetFlag(FLAGS_combine), &config->dcp.combine));
    config->explicit_keys.insert("dcp.combine");
  }
  apply("interleave", "dcp.interleave", FLAGS_interleave, &config->dcp.interleave);
  apply("comm_timeout", "dcp.comm_timeout_s", FLAGS_comm_timeout, &config->dcp.comm_timeout_s);

  SchedulerConfig& scheduler = config->scheduler;
  apply("block_size", "scheduler.block_size", FLAGS_block_size, &scheduler.block_size);
  apply("max_num_seqs", "scheduler.max_num_seqs", FLAGS_max_num_seqs, &scheduler.max_num_seqs);
  apply("max_model_len", "scheduler.max_model_len", FLAGS_max_model_len, &scheduler.max_model_len);
  apply("num_kv_blocks", "scheduler.num_kv_blocks", FLAGS_num_kv_blocks, &scheduler.num_kv_blocks);
  apply("decode_threshold", "scheduler.decode_threshold", FLAGS_decode_threshold,
        &scheduler.decode_threshold);
  apply("workspace_rows", "scheduler.workspace_rows", FLAGS_workspace_rows,
        &config->workspace_rows);
  DCP_CHECK_ARG(config->workspace_rows >= 0, "--workspace-rows must be >= 0, got %d",
                config->workspace_rows);

  AttentionConfig& attention = config->attention;
  apply("index_topk", "attention.index_topk", FLAGS_index_topk, &attention.index_topk);
  apply("force_mqa", "attention.force_mqa", FLAGS_force_mqa, &attention.force_mqa);
  apply("validate_topk", "attention.validate_topk", FLAGS_validate_topk, &attention.validate_topk);
  apply("prefill_backend", "attention.prefill_backend", FLAGS_prefill_backend,
        &attention.prefill_backend);
  if (given("kv_cache_dtype")) {
    DCP_RETURN_IF_ERROR(
        ParseKvCacheDType(absl::GetFlag(FLAGS_kv_cache_dtype), &attention.kv_cache_dtype));
    config->explicit_keys.insert("attention.kv_cache_dtype");
  }

  RunSection& run = config->run;
  apply("output", "run.output", FLAGS_output, &run.output);
  apply("device", "run.device", FLAGS_device, &run.device);
  apply("comm", "run.comm", FLAGS_comm, &run.comm);
  apply("seed", "run.seed", FLAGS_seed, &run.seed);
  apply("iters", "run.iters", FLAGS_iters, &run.iters);
  apply("warmup", "run.warmup", FLAGS_warmup, &run.warmup);
  apply("check", "run.check", FLAGS_check, &run.check);
  apply("tolerance", "run.tolerance", FLAGS_tolerance, &run.tolerance);
  apply("print_plan", "run.print_plan", FLAGS_print_plan, &run.print_plan);
  apply("json", "run.json", FLAGS_json, &run.json);
  return absl::OkStatus();
}

std::string UsageText(const char* program) {
  std::string text = absl::StrCat(
      "usage: mpirun -np W ", program,
      " [--config FILE] [--batch SPEC | --problem FILE] "
      "[flags]\n\nRuns one DCP attention layer over the MPI world; flags override the config "
      "file.\n\nflags:\n  --version  print the version and the git commit of the build\n");
  for (const char* name : kFlagNames) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string shown = absl::StrReplaceAll(name, {{"_", "-"}});
    absl::StrAppend(&text, "  --", shown, "  ", flag->Help(),
                    " (default: ", flag->DefaultValue().empty() ? "none" : flag->DefaultValue(),
                    ")\n");
  }
  return text;
}

}  // namespace dcp::launch
