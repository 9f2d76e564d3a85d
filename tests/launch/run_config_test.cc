#include "launch/run_config.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/flags/reflection.h"
#include "gtest/gtest.h"
#include "launch/flags.h"

namespace dcp::launch {
namespace {

absl::StatusOr<CommandLine> Parse(std::vector<const char*> args) {
  args.insert(args.begin(), "dcp_run");
  return ParseCommandLine(int(args.size()), args.data());
}

// The file, then the flags, as dcp_run does.
absl::StatusOr<RunConfig> Configure(const std::string& yaml, std::vector<const char*> args) {
  absl::StatusOr<CommandLine> command_line = Parse(std::move(args));
  if (!command_line.ok()) return command_line.status();
  RunConfig config;
  if (absl::Status s = ApplyYamlConfig(yaml, "test.yaml", &config); !s.ok()) return s;
  if (absl::Status s = ApplyFlags(*command_line, &config); !s.ok()) return s;
  return config;
}

std::string ErrorOf(const std::string& yaml, std::vector<const char*> args = {}) {
  absl::StatusOr<RunConfig> config = Configure(yaml, std::move(args));
  EXPECT_FALSE(config.ok());
  return config.ok() ? "" : std::string(config.status().message());
}

class RunConfigTest : public ::testing::Test {
  absl::FlagSaver saver_;  // every test starts from the flags' defaults
};

TEST_F(RunConfigTest, DefaultsAreTheSmallModel) {
  absl::StatusOr<RunConfig> config = Configure("", {"--batch=q4"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model.num_heads, ModelDims{}.num_heads);
  EXPECT_EQ(config->run.batches, std::vector<std::string>{"q4"});
  EXPECT_TRUE(ValidateRunSection(*config).ok());
}

TEST_F(RunConfigTest, YamlSectionsFillEveryStruct) {
  absl::StatusOr<RunConfig> config = Configure(R"(
model:
  preset: deepseek_v32
  num_heads: 64
scheduler: {max_num_seqs: 8, max_model_len: 512, block_size: 16, decode_threshold: 2,
            workspace_rows: 256}
dcp: {interleave: 4, combine: a2a, comm_timeout_s: 12.5}
attention: {index_topk: 128, force_mqa: true, validate_topk: false, prefill_backend: none}
run:
  batches: [q2k, 8q1kv1k]
  seed: 9
  iters: 3
  check: true
)",
                                               {});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model.kv_lora_rank, 512);  // from the preset
  EXPECT_EQ(config->model.num_heads, 64);      // refined after it
  EXPECT_EQ(config->scheduler.max_num_seqs, 8);
  EXPECT_EQ(config->scheduler.decode_threshold, 2);
  EXPECT_EQ(config->workspace_rows, 256);
  EXPECT_EQ(config->options().workspace_rows_override, 256);
  EXPECT_EQ(config->dcp.interleave, 4);
  EXPECT_EQ(config->dcp.combine, CombineBackend::kAllToAll);
  EXPECT_DOUBLE_EQ(config->dcp.comm_timeout_s, 12.5);
  EXPECT_EQ(config->attention.index_topk, 128);
  EXPECT_TRUE(config->attention.force_mqa);
  EXPECT_FALSE(config->attention.validate_topk);
  EXPECT_EQ(config->attention.prefill_backend, "none");
  EXPECT_EQ(config->run.batches, (std::vector<std::string>{"q2k", "8q1kv1k"}));
  EXPECT_EQ(config->run.seed, 9u);
  EXPECT_TRUE(config->run.check);
  EXPECT_TRUE(config->is_explicit("scheduler.max_model_len"));
  EXPECT_FALSE(config->is_explicit("scheduler.num_kv_blocks"));
}

TEST_F(RunConfigTest, Glm5PresetAndCudnnBackend) {
  absl::StatusOr<RunConfig> config = Configure(R"(
model: {preset: glm5}
attention: {prefill_backend: cudnn}
)",
                                               {});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model.num_heads, 64);
  EXPECT_EQ(config->model.kv_lora_rank, 512);
  EXPECT_EQ(config->model.qk_head_dim(), 256);
  EXPECT_EQ(config->model.v_head_dim, 256);
  EXPECT_EQ(config->attention.prefill_backend, "cudnn");
}

TEST_F(RunConfigTest, FlagsOverrideTheFile) {
  absl::StatusOr<RunConfig> config = Configure(
      "attention: {index_topk: 128}\nrun: {batches: [q4], check: true}\n",
      {"--index-topk", "256", "--nocheck", "--num_heads=32", "--combine=a2a", "--force-mqa",
       "--novalidate_topk", "--batch", "q8,2q1kv9", "--max-model-len=1024"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->attention.index_topk, 256);
  EXPECT_FALSE(config->run.check);
  EXPECT_EQ(config->model.num_heads, 32);
  EXPECT_EQ(config->dcp.combine, CombineBackend::kAllToAll);
  EXPECT_TRUE(config->attention.force_mqa);
  EXPECT_FALSE(config->attention.validate_topk);
  EXPECT_EQ(config->run.batches, (std::vector<std::string>{"q8", "2q1kv9"}));
  EXPECT_EQ(config->scheduler.max_model_len, 1024);
}

TEST_F(RunConfigTest, ProblemFlagReplacesTheFilesBatches) {
  absl::StatusOr<RunConfig> config = Configure("run: {batches: [q4]}\n", {"--problem=p.st"});
  ASSERT_TRUE(config.ok());
  EXPECT_TRUE(config->run.batches.empty());
  EXPECT_EQ(config->run.problem, "p.st");
  EXPECT_TRUE(ValidateRunSection(*config).ok());
  // Both on the command line: an error.
  config = Configure("", {"--problem=p.st", "--batch=q4"});
  ASSERT_TRUE(config.ok());
  EXPECT_FALSE(ValidateRunSection(*config).ok());
}

TEST_F(RunConfigTest, UnknownKeysAndSectionsAreErrors) {
  EXPECT_NE(ErrorOf("model: {num_head: 4}\n").find("unknown key 'model.num_head'"),
            std::string::npos);
  EXPECT_NE(ErrorOf("modle: {num_heads: 4}\n").find("unknown section 'modle'"), std::string::npos);
  EXPECT_NE(ErrorOf("run: {batch: q4}\n").find("unknown key 'run.batch'"), std::string::npos);
  // The line of the offending key is named.
  EXPECT_NE(ErrorOf("model:\n  num_heads: 4\n  bogus: 1\n").find("test.yaml:3"), std::string::npos);
}

TEST_F(RunConfigTest, BadValuesAreErrors) {
  EXPECT_NE(ErrorOf("model: {num_heads: many}\n").find("model.num_heads must be an integer"),
            std::string::npos);
  EXPECT_NE(ErrorOf("dcp: {combine: ring}\n").find("ag_rs or a2a"), std::string::npos);
  EXPECT_NE(ErrorOf("model: {preset: llama}\n").find("unknown model preset 'llama'"),
            std::string::npos);
  EXPECT_NE(ErrorOf("attention: {force_mqa: maybe}\n").find("true or false"), std::string::npos);
  EXPECT_NE(ErrorOf("run: {batches: {a: 1}}\n").find("list of batch specs"), std::string::npos);
  EXPECT_NE(ErrorOf("model: [1, 2]\n").find("must be a map"), std::string::npos);
  EXPECT_NE(ErrorOf("model: {num_heads: 4\n").find("not valid YAML"), std::string::npos);
  EXPECT_NE(ErrorOf("- a\n- b\n").find("map of sections"), std::string::npos);
  // A float past a float's range is refused, not rounded to 0 (softmax_scale's "default") or
  // to infinity.
  EXPECT_NE(ErrorOf("model: {softmax_scale: 1e-50}\n")
                .find("model.softmax_scale = '1e-50' is outside a float's range"),
            std::string::npos);
  EXPECT_NE(ErrorOf("model: {softmax_scale: 1e39}\n").find("outside a float's range"),
            std::string::npos);
}

// A YAML list item may itself list batches (',' between them, '_' joining terms).
TEST_F(RunConfigTest, YamlBatchesUseTheBatchListGrammar) {
  absl::StatusOr<RunConfig> config = Configure("run: {batches: [q2k, '8q1kv1k,2q8_q4']}\n", {});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->run.batches, (std::vector<std::string>{"q2k", "8q1kv1k", "2q8_q4"}));
  const std::string error = ErrorOf("run: {batches: ['q8;2q1s9']}\n");
  EXPECT_NE(error.find("old form"), std::string::npos) << error;
  EXPECT_NE(error.find("write 'q8,2q1s9'"), std::string::npos) << error;
  EXPECT_NE(ErrorOf("", {"--batch=q4,4q1s8;q2"}).find("write 'q4_4q1s8,q2'"), std::string::npos);
}

// Finding 3: a key that is not a plain name is bad input (InvalidArgument), not an exception.
TEST_F(RunConfigTest, NonScalarKeysAreErrors) {
  for (const char* text : {"? [a, b]\n: 1\n", "? {a: 1}\n: 1\n", "model:\n  ? [x]\n  : 4\n",
                           "run: {[q4]: 1}\n"}) {
    absl::StatusOr<RunConfig> config = Configure(text, {});
    ASSERT_FALSE(config.ok()) << text;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
    EXPECT_NE(config.status().message().find("as a key"), std::string::npos) << config.status();
  }
}

// Finding 4: a repeated section or key is an error (yaml-cpp would keep the first silently).
TEST_F(RunConfigTest, DuplicateSectionsAndKeysAreErrors) {
  std::string error = ErrorOf("run: {iters: 2}\nmodel: {num_heads: 4}\nrun: {iters: 5}\n");
  EXPECT_NE(error.find("section 'run' appears twice"), std::string::npos) << error;
  EXPECT_NE(error.find("test.yaml:3"), std::string::npos) << error;
  error = ErrorOf("scheduler:\n  block_size: 16\n  max_num_seqs: 4\n  block_size: 32\n");
  EXPECT_NE(error.find("key 'scheduler.block_size' appears twice"), std::string::npos) << error;
  EXPECT_NE(error.find("test.yaml:4"), std::string::npos) << error;
}

TEST_F(RunConfigTest, CommandLineErrors) {
  EXPECT_NE(ErrorOf("", {"--num-head=4"}).find("unknown flag '--num-head=4'"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"--iters=abc"}).find("bad value 'abc' for flag '--iters'"),
            std::string::npos);
  EXPECT_NE(ErrorOf("", {"--iters"}).find("needs a value"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"stray"}).find("unexpected argument 'stray'"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"--check=perhaps"}).find("--check"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"--combine=x"}).find("ag_rs or a2a"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"--model=gpt"}).find("unknown model preset"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"--nobatch"}).find("unknown flag"), std::string::npos);
}

TEST_F(RunConfigTest, RunSectionValidation) {
  const auto error = [](std::vector<const char*> args) {
    absl::StatusOr<RunConfig> config = Configure("", std::move(args));
    EXPECT_TRUE(config.ok()) << config.status();
    const absl::Status status = ValidateRunSection(*config);
    EXPECT_FALSE(status.ok());
    return std::string(status.message());
  };
  EXPECT_NE(error({}).find("nothing to run"), std::string::npos);
  EXPECT_NE(error({"--batch=q4", "--device=tpu"}).find("cpu or cuda"), std::string::npos);
  EXPECT_NE(error({"--batch=q4", "--comm=nccl"}).find("needs --device cuda"), std::string::npos);
  EXPECT_NE(error({"--batch=q4", "--iters=0"}).find("--iters"), std::string::npos);
  EXPECT_NE(error({"--batch=q4,q8", "--output=x"}).find("2 batches"), std::string::npos);
}

TEST_F(RunConfigTest, PrintPlanTakesAnyNumberOfBatchesWithAnOutput) {
  // The plan of the first batch is printed and nothing is written, so --output is moot.
  absl::StatusOr<RunConfig> config = Configure("", {"--batch=q4,q8", "--output=x", "--print-plan"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(ValidateRunSection(*config).ok());
}

TEST_F(RunConfigTest, KvCacheDtypeFromTheFileAndTheFlag) {
  absl::StatusOr<RunConfig> config =
      Configure("model: {preset: deepseek_v32}\nattention: {kv_cache_dtype: fp8_ds_mla}\n",
                {"--batch=q4"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->attention.kv_cache_dtype, KvCacheDType::kFp8DsMla);
  EXPECT_TRUE(config->is_explicit("attention.kv_cache_dtype"));
  EXPECT_TRUE(ValidateConfigs(config->model, config->dcp, config->scheduler, config->attention)
                  .ok());
  // The flag overrides the file.
  config = Configure("attention: {kv_cache_dtype: fp8_ds_mla}\n",
                     {"--batch=q4", "--kv-cache-dtype=bf16"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->attention.kv_cache_dtype, KvCacheDType::kBF16);
  config = Configure("", {"--batch=q4", "--kv_cache_dtype=fp8_ds_mla"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->attention.kv_cache_dtype, KvCacheDType::kFp8DsMla);
  // The small model's R = 64 has no fp8_ds_mla rows: a clear error from the validation.
  const absl::Status invalid =
      ValidateConfigs(config->model, config->dcp, config->scheduler, config->attention);
  EXPECT_EQ(invalid.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(invalid.message().find("kv_lora_rank 512"), std::string::npos) << invalid.message();
  EXPECT_NE(ErrorOf("attention: {kv_cache_dtype: fp8}\n", {"--batch=q4"}).find("fp8_ds_mla"),
            std::string::npos);
  EXPECT_NE(ErrorOf("", {"--batch=q4", "--kv-cache-dtype=e5m2"}).find("bf16 or fp8_ds_mla"),
            std::string::npos);
}

// Integers as YAML 1.2 spells them (yaml-cpp reads YAML 1.1: 010 was eight, 08 an error).
TEST_F(RunConfigTest, IntegersAreYaml12) {
  for (const auto& [text, value] : std::vector<std::pair<const char*, int>>{
           {"010", 10}, {"08", 8}, {"+16", 16}, {"0o20", 16}, {"0x10", 16}, {"0000", 0}}) {
    absl::StatusOr<RunConfig> config =
        Configure(std::string("scheduler: {block_size: ") + text + "}\n", {"--batch=q4"});
    ASSERT_TRUE(config.ok()) << text << ": " << config.status();
    EXPECT_EQ(config->scheduler.block_size, value) << text;
  }
  for (const char* text : {"0o8", "0x", "1e3", "16.0", "0b101", "99999999999", "1_000"}) {
    const std::string message =
        ErrorOf(std::string("scheduler: {block_size: ") + text + "}\n", {"--batch=q4"});
    EXPECT_NE(message.find("must be an integer"), std::string::npos) << text << ": " << message;
  }
  absl::StatusOr<RunConfig> negative = Configure("run: {seed: -1}\n", {"--batch=q4"});
  EXPECT_FALSE(negative.ok()) << "a negative seed";
  // The seed is unsigned 64-bit, as --seed takes it: 2^64 - 1 reads, 2^64 does not.
  absl::StatusOr<RunConfig> largest =
      Configure("run: {seed: 18446744073709551615}\n", {"--batch=q4"});
  ASSERT_TRUE(largest.ok()) << largest.status();
  EXPECT_EQ(largest->run.seed, 18446744073709551615u);
  EXPECT_NE(ErrorOf("run: {seed: 18446744073709551616}\n", {"--batch=q4"})
                .find("run.seed must be a non-negative integer"),
            std::string::npos);
  // Booleans are YAML 1.2's too: true / false (and their capitalised forms), not yes / on.
  for (const char* text : {"true", "True", "TRUE"}) {
    absl::StatusOr<RunConfig> config =
        Configure(std::string("run: {json: ") + text + "}\n", {"--batch=q4"});
    ASSERT_TRUE(config.ok()) << text << ": " << config.status();
    EXPECT_TRUE(config->run.json) << text;
  }
  for (const char* text : {"yes", "on", "y", "no", "off", "1"}) {
    EXPECT_NE(ErrorOf(std::string("run: {json: ") + text + "}\n", {"--batch=q4"})
                  .find("run.json must be true or false"),
              std::string::npos)
        << text;
  }
}

// A file of several documents: every one is parsed, and more than one is an error (the reader
// of the first alone dropped the rest, their unknown keys and invalid YAML included).
TEST_F(RunConfigTest, OneDocument) {
  EXPECT_NE(ErrorOf("run: {batches: [q8]}\n---\nrun: {batches: [q9], foo: bar}\n")
                .find("holds several YAML documents"),
            std::string::npos);
  // yaml-cpp's LoadAll never returned on this (the fuzzer's find): refused, at once.
  EXPECT_NE(ErrorOf("{a},\n").find("holds several YAML documents"), std::string::npos);
  // Whatever yaml-cpp makes of an invalid second document, the file is refused.
  EXPECT_FALSE(ErrorOf("run: {batches: [q8]}\n---\n: : : not yaml [\n").empty());
  absl::StatusOr<RunConfig> one = Configure("---\nrun: {batches: [q8]}\n", {});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->run.batches, std::vector<std::string>{"q8"});
}

TEST_F(RunConfigTest, HelpListsTheFlagsWithDashes) {
  absl::StatusOr<CommandLine> command_line = Parse({"--help"});
  ASSERT_TRUE(command_line.ok());
  EXPECT_TRUE(command_line->help);
  const std::string usage = UsageText("dcp_run");
  for (const char* flag : {"--config",       "--batch",
                           "--problem",      "--output",
                           "--num-heads",    "--device",
                           "--comm",         "--combine",
                           "--interleave",   "--block-size",
                           "--max-num-seqs", "--max-model-len",
                           "--index-topk",   "--decode-threshold",
                           "--force-mqa",    "--prefill-backend",
                           "--seed",         "--iters",
                           "--check",        "--print-plan",
                           "--json"}) {
    EXPECT_NE(usage.find(flag), std::string::npos) << flag;
  }
}

}  // namespace
}  // namespace dcp::launch
