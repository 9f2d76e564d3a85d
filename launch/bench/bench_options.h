// The command line of dcp_bench, in the style of nccl-tests: `-w` warm-up iterations, `-n`
// timed iterations, `-b/-e/-f` the size sweep (bytes, K/M/G suffixes, x1024), `-c` the
// built-in check, plus the mode, device, communicator, dimensions and sweep selections.
// Parsing never exits: every error is an InvalidArgument naming the flag, so that all ranks
// (which parse the same argv) fail the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dtype.h"

namespace dcp::bench {

enum class Mode { kRoutes, kKernels, kCollectives, kEngine };
const char* mode_name(Mode mode);

struct BenchOptions {
  Mode mode = Mode::kRoutes;
  std::string device = "cpu";     // cpu | cuda
  std::string comm = "auto";      // auto | mpi | nccl (nccl: CUDA ranks only)
  std::string dims = "deepseek_v32";  // --model: deepseek_v32 | glm5 | small
  // attention.prefill_backend of the routes mode (first entry) and the dense_mha rows of the
  // kernels mode (one row per entry; "auto" keeps the row name dense_mha).
  std::vector<std::string> prefill_backends = {"auto"};
  // Kernels mode: time only the rows whose kernel name starts with one of these (empty: all).
  std::vector<std::string> only;

  int warmup_iters = 2;                   // -w
  int iters = 10;                         // -n
  int64_t min_bytes = int64_t{1} << 20;   // -b
  int64_t max_bytes = int64_t{64} << 20;  // -e
  double step_factor = 4.0;               // -f
  bool check = true;                      // -c 0|1

  // Per-rank query heads H/W; the group has heads * world_size heads.
  std::vector<int> heads = {16, 32, 64, 128};
  // Batch specs (launch/batch_spec.h grammar; `_` joins terms of one batch). Empty: the grid
  // batch_sizes x seq_lens of pure prefills, then `extends`.
  std::vector<std::string> batches;
  std::vector<int> batch_sizes = {1, 2, 4, 8, 16, 32, 64};
  std::vector<int> seq_lens = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
  std::vector<std::string> extends = {"16q64kv128", "32q64kv128", "64q64kv128"};
  int64_t max_tokens = 32768;  // batches with more query tokens are skipped (listed)

  int index_topk = 2048;          // K
  int block_size = 64;            // B
  int interleave = 1;             // I
  std::string combine = "ag_rs";  // the routes mode's sparse-MQA combine: ag_rs | a2a
  // The layer's out dtype in the routes and engine modes: f32 | bf16 (bf16 is what an engine's
  // next op reads and what a torch composition hands on).
  std::string output_dtype = "f32";
  // output_dtype as the layer's dtype.
  DType OutputDType() const { return output_dtype == "bf16" ? DType::kBF16 : DType::kF32; }
  int kernel_world = 8;           // W of the DcpCorrect / DcpCombine kernels timed alone
  int64_t gemm_size = 0;          // m = n = k of the GEMM ceiling; 0: 8192 on CUDA, 1024 on CPU
  int64_t copy_bytes = 0;         // bytes of the copy ceiling; 0: 1 GiB on CUDA, 64 MiB on CPU
  double timeout_s = 300.0;
  uint64_t seed = 1;
  std::string csv;  // write the results here too (rank 0)
  bool help = false;
  bool version = false;  // --version
  bool force = false;    // --force: run a sweep estimated over an hour on CPU ranks

  // The batch specs this run sweeps, in order (batches, or the grid then extends).
  std::vector<std::string> BatchList() const;
};

// argv[1..argc). Unknown flags, bad values and stray arguments are errors.
absl::StatusOr<BenchOptions> ParseBenchOptions(int argc, const char* const* argv);

std::string BenchUsage(const char* program);

// "1048576", "1M", "64K", "2G" -> bytes (x1024 suffixes, as nccl-tests).
absl::StatusOr<int64_t> ParseBytes(const std::string& text);

}  // namespace dcp::bench
