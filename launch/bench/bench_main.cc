// dcp_bench: benchmarks of the DCP attention layer, run under mpirun like dcp_run.
//   mpirun -np 2 dcp_bench --mode routes --model small --heads 4 --batches q64,4q64 -n 5
// Rank 0 prints the tables (and writes --csv); every rank exits with the same status:
// 0 ok, 1 a measurement failed or #wrong > 0, 2 a bad command line.
#include <mpi.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "collectives/mpi_communicator.h"
#include "collectives/mpi_status.h"
#include "core/status.h"
#include "launch/bench/bench_harness.h"
#include "launch/bench/bench_options.h"
#include "launch/bench/bench_setup.h"
#include "launch/bench/modes.h"
#include "launch/bootstrap.h"
#include "launch/version.h"

namespace dcp::bench {
namespace {

constexpr int kExitOk = 0, kExitFailed = 1, kExitUsage = 2;
// The host collectives' deadline until --timeout is read: the start-up agreement only.
constexpr double kBootstrapTimeoutS = 600.0;

// One line per rank, gathered to rank 0: where each rank runs.
absl::Status PrintRanks(const BenchEnv& env) {
  constexpr int kLine = 160;
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  DCP_MPI_CHECK(MPI_Get_processor_name(name, &length));
  std::string line =
      absl::StrFormat("#  rank %d host %s device %s", env.rank, name, env.device->name());
  line.resize(kLine, '\0');
  std::vector<char> all(env.root() ? size_t(kLine) * env.world_size : 0);
  DCP_MPI_CHECK(MPI_Gather(line.data(), kLine, MPI_CHAR, all.data(), kLine, MPI_CHAR, 0,
                           env.bootstrap->mpi_comm()));
  for (int r = 0; env.root() && r < env.world_size; ++r) {
    std::printf("%s\n", std::string(all.data() + size_t(r) * kLine).c_str());
  }
  return absl::OkStatus();
}

void PrintHeader(const BenchEnv& env) {
  const BenchOptions& o = env.options;
  const ModelDims& d = env.dims;
  std::printf("# %s, started %s\n", launch::VersionLine("dcp_bench").c_str(),
              env.started_at.c_str());
  std::printf("# dcp_bench --mode %s: %d ranks, device %s (%s storage), comm %s\n",
              mode_name(o.mode), env.world_size, o.device.c_str(),
              std::string(dtype_name(env.device->storage_dtype())).c_str(),
              env.comm->name().c_str());
  std::printf(
      "# model %s: R %d, Dn %d, Dr %d, Dv %d; K %d, block %d, interleave %d; "
      "warm-up %d, iters %d, check %d\n",
      o.dims.c_str(), d.kv_lora_rank, d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim,
      o.index_topk, o.block_size, o.interleave, o.warmup_iters, o.iters, o.check ? 1 : 0);
}

absl::StatusOr<ModeResult> RunMode(BenchEnv& env) {
  switch (env.options.mode) {
    case Mode::kRoutes:
      return RunRoutes(env);
    case Mode::kKernels:
      return RunKernels(env);
    case Mode::kCollectives:
      return RunCollectives(env);
    case Mode::kEngine:
      return RunEngine(env);
  }
  return DCP_ERROR(Internal, "unknown mode");
}

int Run(int argc, char** argv, const launch::ProcessInfo& process) {
  const bool root = process.rank == 0;
  auto report = [&](const absl::Status& status, int code) {
    if (root) std::fprintf(stderr, "dcp_bench: %s\n", std::string(status.message()).c_str());
    return code;
  };
  // The group first, then one agreement that every rank holds rank 0's arguments (flags are
  // every rank's own: ranks started MPMD with others measured other shapes, or waited in
  // collectives their peers never joined); parsing them then gives every rank one outcome.
  // The timeout is the bootstrap's until --timeout is read.
  // A group failure (a peer stopped, died or did not arrive in time) leaves the other ranks
  // waiting in the next collective, which this rank would never join: end the job everywhere.
  auto end_on_group_failure = [&](const absl::Status& status) {
    if (!IsGroupFailure(status)) return;
    std::fprintf(stderr, "dcp_bench: rank %d: fatal: %s; ending the job on every rank\n",
                 process.rank, std::string(status.message()).c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, kExitFailed);
  };
  auto bootstrap = MpiCommunicator::Create(MPI_COMM_WORLD, kBootstrapTimeoutS);
  if (!bootstrap.ok()) return report(bootstrap.status(), kExitFailed);
  const absl::Status same = AgreeOnStatus(
      **bootstrap, launch::SameCommandLineOnEveryRank(**bootstrap, argc, argv, "dcp_bench"));
  end_on_group_failure(same);
  if (!same.ok()) return report(same, kExitUsage);  // every rank holds it: rank 0 says it
  absl::StatusOr<BenchOptions> options = ParseBenchOptions(argc, argv);
  if (!options.ok()) {
    report(options.status(), kExitUsage);
    if (root) std::fprintf(stderr, "dcp_bench: run with --help for the flags\n");
    return kExitUsage;
  }
  if (options->help) {
    if (root) std::printf("%s", BenchUsage(argv[0]).c_str());
    return kExitOk;
  }
  if (options->version) {
    if (root) std::printf("%s\n", launch::VersionLine("dcp_bench").c_str());
    return kExitOk;
  }
  absl::StatusOr<ModelDims> dims = DimsByName(options->dims);
  if (!dims.ok()) return report(dims.status(), kExitUsage);
  (*bootstrap)->set_timeout_s(options->timeout_s);
  auto device = MakeBenchDevice(*options);
  absl::Status status = AgreeOnStatus(**bootstrap, device.status());
  end_on_group_failure(status);
  if (!status.ok()) return report(status, kExitFailed);
  auto comm = MakeBenchCommunicator(*options, **bootstrap, **device);
  status = AgreeOnStatus(**bootstrap, comm.status());
  end_on_group_failure(status);
  if (!status.ok()) return report(status, kExitFailed);

  BenchEnv env;
  env.options = *options;
  env.rank = process.rank;
  env.world_size = process.world_size;
  env.bootstrap = bootstrap->get();
  env.device = device->get();
  env.comm = comm->get();
  env.dims = *dims;
  {  // rank 0's clock, so that every row of every rank's view carries one timestamp
    std::string stamp = launch::TimestampUtc();
    stamp.resize(32, '\0');
    if (MPI_Bcast(stamp.data(), 32, MPI_CHAR, 0, MPI_COMM_WORLD) != MPI_SUCCESS) return kExitFailed;
    env.started_at = stamp.c_str();
  }
  if (root) PrintHeader(env);
  status = PrintRanks(env);
  if (!status.ok()) return report(status, kExitFailed);

  absl::StatusOr<ModeResult> result = RunMode(env);
  if (!result.ok()) {
    end_on_group_failure(result.status());
    // A request the mode refuses before measuring (a sweep over an hour) is a usage error.
    const bool usage = result.status().code() == absl::StatusCode::kInvalidArgument;
    return report(result.status(), usage ? kExitUsage : kExitFailed);
  }
  if (root) {
    for (const NamedTable& named : result->tables) {
      std::printf("#\n");
      named.table.Print(stdout);
      if (!env.options.csv.empty()) {
        const std::string path = CsvPath(env.options.csv, named.suffix);
        const absl::Status written = named.table.WriteCsv(path);
        if (!written.ok()) {
          report(written, kExitFailed);
          result->num_failed++;
        } else {
          std::printf("# wrote %s\n", path.c_str());
        }
      }
    }
    std::printf("# #wrong total: %lld, failed measurements: %lld -> %s\n",
                static_cast<long long>(result->num_wrong),
                static_cast<long long>(result->num_failed),
                result->num_wrong == 0 && result->num_failed == 0 ? "OK" : "FAILED");
    std::fflush(stdout);
  }
  // The CSV is written on rank 0 only; share its outcome so every rank exits alike.
  int64_t failed = result->num_failed;
  if (MPI_Bcast(&failed, 1, MPI_INT64_T, 0, MPI_COMM_WORLD) != MPI_SUCCESS) return kExitFailed;
  return result->num_wrong == 0 && failed == 0 ? kExitOk : kExitFailed;
}

}  // namespace
}  // namespace dcp::bench

int main(int argc, char** argv) {
  absl::StatusOr<dcp::launch::ProcessInfo> process = dcp::launch::InitMpi(&argc, &argv);
  if (!process.ok()) {
    std::fprintf(stderr, "dcp_bench: %s\n", std::string(process.status().message()).c_str());
    return 1;
  }
  const int code = dcp::bench::Run(argc, argv, *process);
  dcp::launch::FinalizeMpi();
  return code;
}
