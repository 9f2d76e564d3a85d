#include "launch/job.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "core/environment.h"
#include "core/kv_layout.h"
#include "core/status.h"
#include "launch/batch_calls.h"
#include "launch/batch_spec.h"
#include "launch/bootstrap.h"
#include "launch/check.h"
#include "launch/distribute.h"
#include "launch/flags.h"
#include "launch/input_file.h"
#include "launch/limits.h"
#include "launch/liveness.h"
#include "launch/problem.h"
#include "launch/rank_batch.h"
#include "launch/result_file.h"
#include "launch/run_config.h"
#include "launch/summary.h"
#include "launch/synthetic.h"
#include "launch/version.h"
#include "runtime/dcp.h"

namespace dcp::launch {
namespace {

// The launcher's own traffic waits this long until the workload is loaded: rank 0 may spend
// minutes reading a problem file while the others wait. From then on every collective of the
// launcher and of the DcpContext honours dcp.comm_timeout_s, except the peers' wait for work
// rank 0 does alone (the --check reference, writing --output), which keeps this bound on the
// waiting ranks (rank 0 itself waits comm_timeout_s).
constexpr double kBootstrapTimeoutS = 3600.0;
// How long a rank that ends the job waits for its peers to answer the liveness probe.
constexpr double kLivenessWaitS = 1.0;

int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kResourceExhausted:
      return kExitBadInput;
    default:
      return kExitRuntimeError;
  }
}

// Runs one step of the job with C++ exceptions (an allocation that fails, a library that
// throws) turned into a Status, so that the group still agrees on the failure.
template <typename Step>
absl::Status Guarded(Step step) {
  try {
    return step();
  } catch (const std::bad_alloc&) {
    return DCP_ERROR(ResourceExhausted, "out of memory (the batch is too large for this host)");
  } catch (const std::exception& e) {
    return DCP_ERROR(Internal, "unexpected exception: %s", e.what());
  }
}

int64_t RoundUp(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

class Job {
 public:
  explicit Job(const ProcessInfo& process) : process_(process) {}
  absl::Status Run(int argc, char** argv);
  bool check_failed() const { return check_failed_; }
  // Drops contexts and communicators (before MPI_Finalize).
  void Release();

 private:
  bool is_root() const { return process_.rank == 0; }
  // AgreeOnStatus over the bootstrap communicator; a communicator that cannot agree aborts.
  absl::Status Agree(const absl::Status& local);
  // Agree after a step that rank 0 did alone (its peers idle): they wait kBootstrapTimeoutS.
  absl::Status AgreeAfterRootWork(const absl::Status& local);
  // Ends the job on every rank with kExitRuntimeError after a group failure.
  [[noreturn]] void Fatal(const absl::Status& status);

  absl::Status Configure(int argc, char** argv);
  absl::Status LoadWorkload();
  absl::Status FitConfig();
  // Problem mode: the model and top-k width the user stated against the problem file's
  // (FitConfig).
  absl::Status CheckModelAgainstProblem(const ModelDims& file, int file_topk) const;
  absl::Status StartGroup();
  absl::Status PrintPlan();
  absl::Status StartReference();
  absl::Status RunBatch(int index);
  RankBatch WholeBatch(int index, int64_t first_request_id) const;

  bool problem_mode() const { return !config_.run.problem.empty(); }
  int heads_per_rank() const { return config_.model.num_heads / process_.world_size; }
  RankView my_view() const {
    return RankView::Of(config_.model, process_.world_size, config_.dcp.interleave, process_.rank);
  }
  RankView whole_view() const { return RankView::Of(config_.model, 1, config_.dcp.interleave, 0); }
  RunDescription Describe() const;
  void Progress(int index, int done, int total) const;

  ProcessInfo process_;
  std::unique_ptr<MpiCommunicator> bootstrap_;
  std::unique_ptr<LivenessProbe> liveness_;  // names the rank that stalled the job
  RunConfig config_;
  CommandLine command_line_;
  std::optional<Problem> problem_;  // rank 0, problem mode
  std::optional<ProblemHeader> header_;
  RankBatch problem_batch_;  // problem mode: this rank's share
  std::vector<std::vector<RequestShape>> batches_;
  std::vector<std::string> labels_;
  std::unique_ptr<SyntheticWorkload> synthetic_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Communicator> comm_;
  RankWeights weights_;
  std::unique_ptr<DcpContext> context_;
  std::unique_ptr<Reference> reference_;
  std::vector<BatchReport> reports_;
  int64_t next_request_id_ = 0;
  bool check_failed_ = false;
};

void Job::Fatal(const absl::Status& status) {
  std::string culprits;
  if (liveness_ != nullptr) {
    const std::vector<int> silent = liveness_->Silent(kLivenessWaitS);
    if (!silent.empty()) {
      culprits = absl::StrFormat("; rank%s %s did not answer a liveness probe within %g s "
                                 "(stopped, hung or dead)",
                                 silent.size() > 1 ? "s" : "", absl::StrJoin(silent, ", "),
                                 kLivenessWaitS);
    }
  }
  std::fprintf(stderr,
               "dcp_run: rank %d: fatal: %s (collective timeout %.3g s)%s; ending the job on "
               "every rank with exit %d\n",
               process_.rank, std::string(status.message()).c_str(), bootstrap_->timeout_s(),
               culprits.c_str(), kExitRuntimeError);
  std::fflush(stderr);
  bootstrap_->Abort(kExitRuntimeError);
}

absl::Status Job::Agree(const absl::Status& local) {
  // A peer that did not arrive in time will not arrive for the agreement either: waiting for
  // it again would double the time the job takes to end.
  if (IsGroupFailure(local)) Fatal(local);
  absl::Status shared = AgreeOnStatus(*bootstrap_, local);
  if (shared.ok()) return shared;
  if (IsGroupFailure(shared)) Fatal(shared);
  // Every rank now holds the same error, unless the communicator itself failed (a peer died or
  // timed out): then this barrier fails at once, and the only way out is to end the job.
  if (absl::Status alive = bootstrap_->Barrier(); !alive.ok()) Fatal(shared);
  return shared;
}

absl::Status Job::AgreeAfterRootWork(const absl::Status& local) {
  const double timeout_s = bootstrap_->timeout_s();
  if (!is_root()) bootstrap_->set_timeout_s(kBootstrapTimeoutS);
  absl::Status shared = Agree(local);
  bootstrap_->set_timeout_s(timeout_s);
  return shared;
}

absl::Status Job::Run(int argc, char** argv) {
  {
    auto bootstrap = MpiCommunicator::Create(MPI_COMM_WORLD, kBootstrapTimeoutS);
    if (!bootstrap.ok()) {
      std::fprintf(stderr, "dcp_run: rank %d: fatal: %s\n", process_.rank,
                   std::string(bootstrap.status().message()).c_str());
      MPI_Abort(MPI_COMM_WORLD, kExitRuntimeError);
    }
    bootstrap_ = std::move(bootstrap).value();
  }
  {
    absl::StatusOr<std::unique_ptr<LivenessProbe>> probe = LivenessProbe::Create(MPI_COMM_WORLD);
    if (probe.ok()) liveness_ = std::move(probe).value();  // without it: no rank named
  }
  // Flags are read on every rank from its own command line (a config file is rank 0's, sent
  // to all); ranks started with other flags would scatter a problem file's rows with other
  // settings: refused before anything reads them.
  DCP_RETURN_IF_ERROR(Agree(SameCommandLineOnEveryRank(*bootstrap_, argc, argv, "dcp_run")));
  DCP_RETURN_IF_ERROR(Agree(Guarded([&] { return Configure(argc, argv); })));
  if (command_line_.help) {
    if (is_root()) std::fputs(UsageText("dcp_run").c_str(), stdout);
    return absl::OkStatus();
  }
  if (command_line_.version) {
    if (is_root()) std::printf("%s\n", VersionLine("dcp_run").c_str());
    return absl::OkStatus();
  }
  DCP_RETURN_IF_ERROR(Agree(Guarded([&] { return LoadWorkload(); })));
  DCP_RETURN_IF_ERROR(Agree(Guarded([&] { return FitConfig(); })));
  // Bootstrap is over: from here a peer that does not arrive within comm_timeout_s ends the job.
  bootstrap_->set_timeout_s(config_.dcp.comm_timeout_s);
  DCP_RETURN_IF_ERROR(Agree(Guarded([&] { return StartGroup(); })));
  if (config_.run.print_plan) return Agree(PrintPlan());
  if (config_.run.check) {
    DCP_RETURN_IF_ERROR(AgreeAfterRootWork(Guarded([&] { return StartReference(); })));
  }
  if (is_root() && !config_.run.json) std::fputs(FormatHeader(Describe()).c_str(), stdout);
  // Test hook: each rank states its pid once the group runs (the stalled-rank test stops one).
  if (EnvSwitch("DCP_RUN_REPORT_PID", false)) {
    std::fprintf(stderr, "[dcp_run rank %d pid %d running]\n", process_.rank, int(::getpid()));
    std::fflush(stderr);
  }
  for (int index = 0; index < int(batches_.size()); ++index) {
    DCP_RETURN_IF_ERROR(Agree(Guarded([&] { return RunBatch(index); })));
  }
  if (is_root()) {
    if (config_.run.json) {
      // Paths and labels are the user's bytes: invalid UTF-8 is replaced (U+FFFD), not thrown.
      const std::string json = RunJson(Describe(), reports_, !check_failed_)
                                   .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      std::printf("%s\n", json.c_str());
    } else if (config_.run.check) {
      std::printf("dcp_run: %s\n", check_failed_ ? "CHECK FAILED: the group's result differs "
                                                   "from the single-rank reference"
                                                 : "check passed: every batch matches the "
                                                   "single-rank reference");
    }
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

void Job::Release() {
  reference_.reset();
  context_.reset();
  comm_.reset();
  device_.reset();
  liveness_.reset();
  bootstrap_.reset();
}

absl::Status Job::Configure(int argc, char** argv) {
  DCP_ASSIGN_OR_RETURN(command_line_, ParseCommandLine(argc, argv));
  if (command_line_.help || command_line_.version) return absl::OkStatus();
  const std::string path = command_line_.config_path();
  if (!path.empty()) {
    std::string text;
    DCP_RETURN_IF_ERROR(Agree(is_root()
                                  ? Guarded([&] { return ReadInputFile(path, "config", &text); })
                                  : absl::OkStatus()));
    int64_t length = int64_t(text.size());
    DCP_RETURN_IF_ERROR(bootstrap_->HostBroadcast(&length, sizeof(length), 0));
    text.resize(size_t(length));
    DCP_RETURN_IF_ERROR(bootstrap_->HostBroadcast(text.data(), text.size(), 0));
    DCP_RETURN_IF_ERROR(ApplyYamlConfig(text, path, &config_));
  }
  DCP_RETURN_IF_ERROR(ApplyFlags(command_line_, &config_));
  return ValidateRunSection(config_);
}

absl::Status Job::LoadWorkload() {
  const RunSection& run = config_.run;
  absl::Status local = absl::OkStatus();
  if (is_root() && !run.output.empty() && !run.print_plan) {
    local = Guarded([&] { return CheckOutputWritable(run.output); });
  }
  if (problem_mode()) {
    if (is_root() && local.ok()) {
      // Guarded here, not only around the whole step: the peers wait in the Agree below, so an
      // exception must become this rank's vote in it (a thrown step would leave them there).
      local = Guarded([&]() -> absl::Status {
        DCP_ASSIGN_OR_RETURN(problem_, LoadProblem(run.problem, config_.attention.index_topk));
        return absl::OkStatus();
      });
    }
    DCP_RETURN_IF_ERROR(Agree(local));
    DCP_ASSIGN_OR_RETURN(header_,
                         BroadcastProblemHeader(*bootstrap_, problem_ ? &*problem_ : nullptr));
    batches_.push_back(header_->requests);
    labels_.push_back(run.problem);
    return absl::OkStatus();
  }
  DCP_RETURN_IF_ERROR(Agree(local));
  for (const std::string& spec : run.batches) {
    DCP_ASSIGN_OR_RETURN(std::vector<RequestShape> requests, ParseBatchSpec(spec));
    batches_.push_back(std::move(requests));
    labels_.push_back(spec);
  }
  return absl::OkStatus();
}

absl::Status Job::CheckModelAgainstProblem(const ModelDims& file, int file_topk) const {
  // The problem file defines the model. A dimension the user stated (a flag, a config key, or
  // a preset, through --model or model.preset) that disagrees with it is a mistake: refused,
  // not overridden silently. One that agrees is fine.
  const ModelDims& given = config_.model;
  const bool flag_preset = command_line_.given.contains("model");
  const bool preset = flag_preset || config_.is_explicit("model.preset");
  const std::string preset_source =
      absl::StrFormat("%s %s", flag_preset ? "--model" : "model.preset", config_.model_preset);
  struct Dim {
    const char* key;   // config key
    const char* flag;  // flag name (underscore form), or nullptr
    int given, in_file;
    const char* what;  // where the file holds it
  };
  const Dim dims[] = {
      {"model.num_heads", "num_heads", given.num_heads, file.num_heads, "q_nope's heads"},
      {"model.kv_lora_rank", nullptr, given.kv_lora_rank, file.kv_lora_rank, "kv_c's width R"},
      {"model.qk_nope_head_dim", nullptr, given.qk_nope_head_dim, file.qk_nope_head_dim,
       "q_nope's head dim Dn"},
      {"model.qk_rope_head_dim", nullptr, given.qk_rope_head_dim, file.qk_rope_head_dim,
       "q_rope's head dim Dr"},
      {"model.v_head_dim", nullptr, given.v_head_dim, file.v_head_dim, "w_uv's head dim Dv"},
  };
  for (const Dim& d : dims) {
    if (d.given == d.in_file) continue;
    std::string source;
    if (d.flag != nullptr && command_line_.given.contains(d.flag)) {
      source = absl::StrFormat("--%s %d", absl::StrReplaceAll(d.flag, {{"_", "-"}}), d.given);
    } else if (config_.is_explicit(d.key)) {
      source = absl::StrFormat("%s %d (config)", d.key, d.given);
    } else if (preset) {
      source = absl::StrFormat("%s (%s %d)", preset_source, d.key, d.given);
    } else {
      continue;  // a default: the file's value replaces it
    }
    return DCP_ERROR(InvalidArgument,
                     "%s disagrees with the problem file, whose %s is %d (a problem file "
                     "defines the model: leave the model out, or give the file's)",
                     source, d.what, d.in_file);
  }
  // So does the top-k width: the file's index_topk metadata, else its topk_indices' width
  // (FORMATS.md).
  const bool topk_flag = command_line_.given.contains("index_topk");
  if ((topk_flag || config_.is_explicit("attention.index_topk")) &&
      config_.attention.index_topk != file_topk) {
    return DCP_ERROR(InvalidArgument,
                     "%s disagrees with the problem file, whose index_topk is %d (its "
                     "index_topk metadata, else the width of topk_indices)",
                     topk_flag ? absl::StrFormat("--index-topk %d", config_.attention.index_topk)
                               : absl::StrFormat("attention.index_topk %d (config)",
                                                 config_.attention.index_topk),
                     file_topk);
  }
  if (config_.is_explicit("model.softmax_scale") && given.softmax_scale > 0 &&
      std::fabs(given.softmax_scale - file.scale()) > 1e-6f * file.scale()) {
    return DCP_ERROR(InvalidArgument,
                     "model.softmax_scale %g (config) disagrees with the problem file's %g (its "
                     "softmax_scale metadata, else 1/sqrt(Dn + Dr))",
                     given.softmax_scale, file.scale());
  }
  return absl::OkStatus();
}

absl::Status Job::FitConfig() {
  const int world = process_.world_size;
  if (header_.has_value()) {
    DCP_RETURN_IF_ERROR(CheckModelAgainstProblem(header_->model, header_->index_topk));
    config_.model = header_->model;
    config_.attention.index_topk = header_->index_topk;
    // The dense route attends to every causal key of a prefill, which is what the file's top-k
    // selects only when its rows hold every causal position: a prefill whose rows select fewer
    // keys sends the batch down the sparse route, which reads the rows (DESIGN.md section 3).
    for (size_t i = 0; i < header_->requests.size(); ++i) {
      if (header_->requests[i].query_len > config_.scheduler.decode_threshold &&
          !header_->topk_selects_every_causal_key[i]) {
        config_.attention.force_mqa = true;
      }
    }
  }
  if (config_.model.num_heads % world != 0) {
    return DCP_ERROR(InvalidArgument,
                     "%d heads cannot be split evenly over %d ranks: the number of ranks "
                     "(mpirun -np) must divide num_heads",
                     config_.model.num_heads, world);
  }
  config_.dcp.world_size = world;
  config_.dcp.rank = process_.rank;
  // Every value that sizes memory against its stated ceiling (before limits grow to fit).
  DCP_RETURN_IF_ERROR(CheckCeilings(config_, batches_));

  // Limits the user left at their defaults grow to fit the batches; explicit ones are checked.
  int64_t max_seq_len = 0, max_requests = 0;
  for (size_t b = 0; b < batches_.size(); ++b) {
    max_requests = std::max<int64_t>(max_requests, int64_t(batches_[b].size()));
    for (const RequestShape& r : batches_[b])
      max_seq_len = std::max<int64_t>(max_seq_len, r.seq_len);
  }
  SchedulerConfig& scheduler = config_.scheduler;
  if (max_seq_len > scheduler.max_model_len) {
    if (config_.is_explicit("scheduler.max_model_len")) {
      return DCP_ERROR(InvalidArgument,
                       "a request has seq_len %d > scheduler.max_model_len %d (raise "
                       "--max-model-len)",
                       max_seq_len, scheduler.max_model_len);
    }
    scheduler.max_model_len = int(RoundUp(max_seq_len, 256));
  }
  if (max_requests > scheduler.max_num_seqs) {
    if (config_.is_explicit("scheduler.max_num_seqs")) {
      return DCP_ERROR(InvalidArgument,
                       "a batch has %d requests > scheduler.max_num_seqs %d (raise "
                       "--max-num-seqs)",
                       max_requests, scheduler.max_num_seqs);
    }
    scheduler.max_num_seqs = int(max_requests);
  }
  // --print-plan runs nothing: the KV pool and the memory check cover the first batch, the one
  // it plans (a later 64 x 128k-token batch asked 46 GiB of a plan dump); the limits above
  // still grow to fit every batch, so the plan is the one the run would execute.
  std::vector<std::vector<RequestShape>> first_batch;
  if (config_.run.print_plan) first_batch.push_back(batches_[0]);
  const std::vector<std::vector<RequestShape>>& allocated =
      config_.run.print_plan ? first_batch : batches_;
  // The per-rank KV pool: what the largest batch needs, unless set. The worker's default (N
  // full sequences of max_model_len) grows with max_num_seqs, which grows to fit the batch:
  // 10,000 decodes over 64 tokens would reserve 13 GB for 4096-token sequences.
  if (!config_.is_explicit("scheduler.num_kv_blocks") && scheduler.num_kv_blocks == 0 &&
      scheduler.block_size > 0 && config_.dcp.interleave > 0) {  // else ValidateConfigs fails
    const KvLayout layout{world, config_.dcp.interleave};
    int64_t needed = 1;
    for (const std::vector<RequestShape>& batch : allocated) {
      int64_t blocks = 0;
      for (const RequestShape& r : batch) {
        blocks += (layout.local_length(r.seq_len, 0) + scheduler.block_size - 1) /
                  scheduler.block_size;
      }
      needed = std::max(needed, blocks);
    }
    DCP_CHECK_ARG(needed <= kMaxKvBlocks,
                  "the largest batch needs %d KV blocks per rank, more than the ceiling of %d "
                  "(raise --block-size or split the batch)",
                  needed, kMaxKvBlocks);
    scheduler.num_kv_blocks = int(needed);
  }
  // The whole run against the memory of this node, before anything of it is allocated.
  DCP_RETURN_IF_ERROR(
      ValidateConfigs(config_.model, config_.dcp, config_.scheduler, config_.attention));
  {
    // A problem file is already in rank 0's memory (LoadProblem checked that it fits).
    RunConfig root_view = config_, other_view = config_;
    root_view.dcp.rank = 0;
    other_view.dcp.rank = world > 1 ? 1 : 0;
    DCP_RETURN_IF_ERROR(CheckMemory(EstimateRankMemory(root_view, allocated, 0),
                                    EstimateRankMemory(other_view, allocated, 0),
                                    process_.local_size, AvailableHostMemory()));
  }
  if (!problem_mode()) {
    synthetic_ = std::make_unique<SyntheticWorkload>(config_.model, config_.attention.index_topk,
                                                     config_.run.seed);
  }
  return absl::OkStatus();
}

absl::Status Job::StartGroup() {
  const RunSection& run = config_.run;
  {
    absl::StatusOr<std::unique_ptr<Device>> device = MakeRankDevice(run.device, process_);
    DCP_RETURN_IF_ERROR(Agree(device.status()));
    device_ = std::move(device).value();
  }
  {
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        MakeRankCommunicator(run.comm, *bootstrap_, *device_, config_.dcp.comm_timeout_s);
    DCP_RETURN_IF_ERROR(Agree(comm.status()));
    comm_ = std::move(comm).value();
  }
  if (comm_->memory_space() != device_->memory_space()) {
    return DCP_ERROR(InvalidArgument,
                     "--comm %s moves %s buffers but --device %s keeps them in %s memory "
                     "(use --comm nccl with --device cuda)",
                     run.comm, comm_->memory_space() == MemorySpace::kHost ? "host" : "device",
                     run.device, device_->memory_space() == MemorySpace::kHost ? "host" : "device");
  }
  if (problem_mode()) {
    DCP_RETURN_IF_ERROR(ScatterProblem(*bootstrap_, problem_ ? &*problem_ : nullptr, *header_,
                                       config_.dcp.interleave, next_request_id_, &weights_,
                                       &problem_batch_));
  } else {
    weights_ = synthetic_->Weights(my_view());
  }
  DCP_ASSIGN_OR_RETURN(context_,
                       DcpContext::Create(config_.options(), *comm_, *device_,
                                          WeightViews(weights_, config_.model, heads_per_rank())));
  return absl::OkStatus();
}

absl::Status Job::PrintPlan() {
  std::vector<BatchRequest> requests;
  for (size_t i = 0; i < batches_[0].size(); ++i) {
    requests.push_back(
        {next_request_id_ + int64_t(i), batches_[0][i].seq_len, batches_[0][i].query_len});
  }
  const bool has_topk = problem_mode() ? header_->topk_width > 0 : true;
  DCP_ASSIGN_OR_RETURN(std::string json, context_->PlanJson(requests, has_topk));
  if (is_root()) {
    std::printf("%s\n", json.c_str());
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

absl::Status Job::StartReference() {
  if (!is_root()) return absl::OkStatus();
  const RankWeights whole =
      problem_mode() ? SliceWeights(*problem_, whole_view()) : synthetic_->Weights(whole_view());
  DCP_ASSIGN_OR_RETURN(reference_, Reference::Create(config_.options(), whole));
  return absl::OkStatus();
}

RankBatch Job::WholeBatch(int index, int64_t first_request_id) const {
  return problem_mode() ? SliceBatch(*problem_, whole_view(), first_request_id)
                        : synthetic_->Batch(batches_[index], index, first_request_id, whole_view());
}

void Job::Progress(int index, int done, int total) const {
  if (!is_root() || total < 10) return;
  const int step = std::max(1, total / 10);
  if (done % step == 0 || done == total) {
    std::fprintf(stderr, "[dcp_run] batch %d/%d: %d/%d iterations\n", index + 1,
                 int(batches_.size()), done, total);
  }
}

absl::Status Job::RunBatch(int index) {
  const ModelDims& model = config_.model;
  const RunSection& run = config_.run;
  const int64_t first_request_id = next_request_id_;
  next_request_id_ += int64_t(batches_[index].size());
  RankBatch batch = problem_mode()
                        ? std::move(problem_batch_)
                        : synthetic_->Batch(batches_[index], index, first_request_id, my_view());

  // Each DcpContext call agrees across the group by itself (once per batch of requests), so an
  // error comes back on every rank alike and no launcher agreement is needed per iteration; a
  // rank that stops makes the others' calls time out (DeadlineExceeded), which ends the job.
  DCP_RETURN_IF_ERROR(AddRequests(*context_, batch));
  StatsAccumulator stats;
  std::vector<float> out, lse;
  const int total = run.warmup + run.iters;
  for (int i = 0; i < total; ++i) {
    DCP_RETURN_IF_ERROR(LoadContext(*context_, batch, model));
    DCP_RETURN_IF_ERROR(ForwardBatch(*context_, batch, model, heads_per_rank(), &out, &lse));
    if (i >= run.warmup) stats.Add(context_->last_stats());
    Progress(index, i + 1, total);
  }
  DCP_RETURN_IF_ERROR(FreeRequests(*context_, batch));

  std::vector<float> all_out, all_lse;
  DCP_RETURN_IF_ERROR(GatherOutputs(*bootstrap_, batch.num_tokens(), heads_per_rank(),
                                    model.v_head_dim, out, lse, &all_out, &all_lse));
  DCP_ASSIGN_OR_RETURN(BatchReport report, ReduceStats(*bootstrap_, stats.Mean(), run.iters));
  report.label = labels_[index];
  report.num_requests = int(batch.requests.size());

  if (run.check) {
    absl::Status checked = absl::OkStatus();
    if (is_root()) {
      checked = Guarded([&]() -> absl::Status {
        std::vector<float> ref_out, ref_lse;
        DCP_RETURN_IF_ERROR(
            reference_->Run(WholeBatch(index, first_request_id), &ref_out, &ref_lse));
        const double tolerance =
            run.tolerance > 0 ? run.tolerance : DefaultTolerance(device_->storage_dtype());
        report.check = CompareOutputs(all_out, all_lse, ref_out, ref_lse, model.num_heads,
                                      model.v_head_dim, tolerance);
        return absl::OkStatus();
      });
    }
    DCP_RETURN_IF_ERROR(AgreeAfterRootWork(checked));
    int32_t passed = is_root() ? int32_t(report.check->passed) : 0;
    DCP_RETURN_IF_ERROR(bootstrap_->HostBroadcast(&passed, sizeof(passed), 0));
    if (!passed) check_failed_ = true;
  }

  // The result file only after a run that succeeded (and passed its check, if asked).
  if (!run.output.empty() && !check_failed_) {
    absl::Status written = absl::OkStatus();
    if (is_root()) {
      const ForwardStats& last = context_->last_stats();
      written = Guarded([&] {
        return WriteResultFile(
            run.output, batch.num_tokens(), model.num_heads, model.v_head_dim, all_out, all_lse,
            {last.route, process_.world_size, config_.dcp.interleave, last.num_chunks});
      });
    }
    DCP_RETURN_IF_ERROR(AgreeAfterRootWork(written));
  }
  if (is_root()) {
    if (!run.json) {
      std::fputs(FormatReport(report, index, int(batches_.size())).c_str(), stdout);
      std::fflush(stdout);
    }
    reports_.push_back(std::move(report));
  }
  return absl::OkStatus();
}

RunDescription Job::Describe() const {
  RunDescription run;
  run.world_size = process_.world_size;
  run.device = device_ ? device_->name() : config_.run.device;
  run.comm = comm_ ? comm_->name() : config_.run.comm;
  run.combine = combine_backend_name(config_.dcp.combine);
  run.source = problem_mode() ? "problem " + config_.run.problem
                              : absl::StrFormat("synthetic, seed %d", config_.run.seed);
  run.input_dtype = header_.has_value() ? header_->input_dtype : "";
  run.model = config_.model;
  run.index_topk = config_.attention.index_topk;
  run.interleave = config_.dcp.interleave;
  run.block_size = config_.scheduler.block_size;
  return run;
}

}  // namespace

int RunJob(int argc, char** argv) {
  absl::StatusOr<ProcessInfo> process = InitMpi(&argc, &argv);
  if (!process.ok()) {
    std::fprintf(stderr, "dcp_run: error: %s\n", std::string(process.status().message()).c_str());
    return kExitRuntimeError;
  }
  int code = kExitOk;
  {
    Job job(*process);
    const absl::Status status = job.Run(argc, argv);
    if (!status.ok()) {
      if (process->rank == 0) {
        std::fprintf(stderr, "dcp_run: error: %s\n", std::string(status.message()).c_str());
      }
      code = ExitCodeFor(status);
    } else if (job.check_failed()) {
      code = kExitCheckFailed;
    }
    job.Release();
  }
  // Test hook: each rank states its exit code, so tests can check that all ranks agree.
  if (EnvSwitch("DCP_RUN_REPORT_EXIT", false)) {
    std::fprintf(stderr, "[dcp_run rank %d exit %d]\n", process->rank, code);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  FinalizeMpi();
  return code;
}

}  // namespace dcp::launch
