// collectives: the data movement of DCP at growing sizes, each pipeline timed step by step in
// one iteration (GPU timestamps between the steps, step_clock.h):
//   ws_fill: GatherRows (paged cache -> local region) | AllGather | GatherRows (reorganize
//            into global token order), the chunked-prefill workspace fill (DESIGN.md 6);
//   ag_rs:   AllGather LSE | DcpCorrect | ReduceScatterSum, the sparse-MQA combine (7);
//   a2a:     AllToAll partials | AllToAll LSE | DcpCombine.
// size: nccl-tests' convention, the bytes of the whole buffer (all-gather: the gathered
// output; reduce-scatter and all-to-all: the send buffer). algbw = size / time; busbw = algbw
// x (W-1)/W for all-gather, reduce-scatter and all-to-all (nccl-tests PERFORMANCE.md), none
// for the local kernels. #wrong: elements of the pipeline's result that differ from what each
// rank predicts from the generators (rows exactly; merges within fp32 tolerance).
//
// Beside ours, the same bytes through raw NCCL (raw_peer.h), when the data plane is NCCL:
// table "nccl" (CSV suffix _nccl) times all_gather, reduce_scatter and all_to_all (F32) and the
// ws_fill pipeline against a raw ncclAllGather of its gathered bytes, each as a loop of
// back-to-back calls on the device stream (time per call; median over iterations of the
// slowest rank). Ours runs stream-ordered (the engine's mode: Completion::kStream) and, in the
// host_us column, with a host wait per call (the default mode). ratio = ours / raw time (the
// target is <= 1.1); for ws_fill, fill = raw busbw share reached by the pipeline (>= 0.9 at
// >= 64 MB). #wrong: elements where ours differs from raw, bit for bit.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "launch/bench/bench_check.h"
#include "launch/bench/bench_data.h"
#include "launch/bench/modes.h"
#include "launch/bench/raw_peer.h"
#include "core/kv_layout.h"
#include "core/status.h"

namespace dcp::bench {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr uint64_t kStreamRows = 31;

// One step of a pipeline as a table row.
struct StepRow {
  std::string op;
  int64_t size_bytes = 0;
  DType dtype = DType::kF32;
  bool collective = false;  // busbw = algbw x (W-1)/W
};

class CollectiveBench {
 public:
  explicit CollectiveBench(BenchEnv& env)
      : env_(env), table_(Columns(env)), vs_table_(VsColumns(env)) {}

  // Rows go to stderr and the CSV as they are measured (BenchEnv::Stream). Binds an NCCL data
  // plane to stream order and makes the raw peer.
  absl::Status Start();

  // Times the pipeline's steps; rows[0] is the whole pipeline, rows[1..] its steps.
  // `check` runs after the timing (setup + steps once more) and returns this rank's #wrong.
  absl::Status Run(const std::string& pipeline, const std::vector<StepRow>& rows,
                   const absl::Status& prepared, const std::function<absl::Status()>& setup,
                   const std::vector<std::function<absl::Status()>>& steps,
                   const std::function<absl::StatusOr<int64_t>()>& check);

  absl::Status WorkspaceFill(int64_t size);
  absl::Status Combine(int64_t size, bool all_to_all);
  // One collective of `size` bytes (nccl-tests' convention), ours against the raw peer.
  absl::Status VersusRaw(const std::string& op, int64_t size);

  bool has_peer() const { return peer_ != nullptr; }
  ModeResult Finish();

 private:
  static std::vector<Column> Columns(const BenchEnv& env);
  static std::vector<Column> VsColumns(const BenchEnv& env);
  void AddRow(const std::string& pipeline, const StepRow& row, double seconds, int64_t wrong,
              const std::string& status);
  // Seconds per call of `call` (which enqueues one operation), from loops of back-to-back calls.
  absl::StatusOr<double> TimePerCall(int64_t size, const std::function<absl::Status()>& call);
  // Times ours (stream-ordered, then with host completion) and raw; adds a row of vs_table_.
  // `compare` returns the elements where ours and raw results differ (after both ran once).
  absl::Status Versus(const std::string& op, int64_t size, int element_bytes, double bus_factor,
                      const std::function<absl::Status()>& ours,
                      const std::function<absl::Status()>& raw,
                      const std::function<absl::StatusOr<int64_t>()>& compare);

  BenchEnv& env_;
  ResultTable table_;
  ResultTable vs_table_;
  std::unique_ptr<RawPeer> peer_;
  int64_t num_wrong_ = 0, num_failed_ = 0;
};

absl::Status CollectiveBench::Start() {
  DCP_RETURN_IF_ERROR(AgreeOnStatus(*env_.bootstrap, env_.Stream(&table_, "")));
  if (env_.comm->name() != "nccl") return absl::OkStatus();
  DCP_RETURN_IF_ERROR(AgreeOnStatus(
      *env_.bootstrap, env_.comm->BindStream(DeviceStream(env_), Completion::kStream)));
  DCP_ASSIGN_OR_RETURN(peer_, MakeRawPeer(env_));
  return AgreeOnStatus(*env_.bootstrap, env_.Stream(&vs_table_, "nccl"));
}

std::vector<Column> CollectiveBench::VsColumns(const BenchEnv& env) {
  std::vector<Column> columns = env.MetaColumns();
  const std::vector<Column> main = {{"op", "op"},
                                    {"size_bytes", "size"},
                                    {"count", "count"},
                                    {"raw_us", "raw_us"},
                                    {"ours_us", "ours_us"},
                                    {"host_us", "host_us"},
                                    {"raw_busbw_gbps", "raw_busbw"},
                                    {"ours_busbw_gbps", "busbw"},
                                    {"ratio", "ratio"},
                                    {"host_ratio", "host_ratio"},
                                    {"fill", "fill"},
                                    {"wrong", "#wrong"},
                                    {"status", "status"}};
  columns.insert(columns.end(), main.begin(), main.end());
  return columns;
}

absl::StatusOr<double> CollectiveBench::TimePerCall(int64_t size,
                                                    const std::function<absl::Status()>& call) {
  // Enough calls per iteration that launch gaps are averaged, few at large sizes.
  const int reps = static_cast<int>(
      std::clamp<int64_t>((int64_t{64} << 20) / std::max<int64_t>(size, 1), 1, 20));
  DCP_ASSIGN_OR_RETURN(StepTimes times,
                       TimeSteps(env_, 1, nullptr, [&](const Mark& mark) -> absl::Status {
                         for (int i = 0; i < reps; ++i) DCP_RETURN_IF_ERROR(call());
                         return mark();
                       }));
  return times.step_s[0] / reps;
}

absl::Status CollectiveBench::Versus(const std::string& op, int64_t size, int element_bytes,
                                     double bus_factor, const std::function<absl::Status()>& ours,
                                     const std::function<absl::Status()>& raw,
                                     const std::function<absl::StatusOr<int64_t>()>& compare) {
  const StreamHandle stream = DeviceStream(env_);
  auto measured = [&]() -> absl::StatusOr<std::array<double, 3>> {
    std::array<double, 3> seconds{};
    DCP_ASSIGN_OR_RETURN(seconds[0], TimePerCall(size, raw));
    DCP_ASSIGN_OR_RETURN(seconds[1], TimePerCall(size, ours));
    DCP_RETURN_IF_ERROR(env_.comm->Synchronize());  // a watchdog failure shows here
    DCP_RETURN_IF_ERROR(env_.comm->BindStream(stream, Completion::kHost));
    auto host = TimePerCall(size, ours);
    DCP_RETURN_IF_ERROR(env_.comm->BindStream(stream, Completion::kStream));
    DCP_ASSIGN_OR_RETURN(seconds[2], std::move(host));
    return seconds;
  }();
  int64_t wrong = -1;
  absl::Status status = measured.status();
  if (status.ok() && env_.options.check) {
    absl::StatusOr<int64_t> local = [&]() -> absl::StatusOr<int64_t> {
      DCP_RETURN_IF_ERROR(raw());
      DCP_RETURN_IF_ERROR(ours());
      DCP_RETURN_IF_ERROR(env_.comm->Synchronize());
      DCP_RETURN_IF_ERROR(env_.device->Synchronize());
      return compare();
    }();
    status = AgreeOnStatus(*env_.bootstrap, local.status());
    if (status.ok()) {
      DCP_ASSIGN_OR_RETURN(wrong, SumOverRanks(env_, *local));
      num_wrong_ += wrong;
    }
  }
  status = AgreeOnStatus(*env_.bootstrap, status);
  std::vector<std::string> cells = env_.MetaCells();
  const auto busbw = [&](double seconds) { return size / seconds * 1e-9 * bus_factor; };
  if (!status.ok()) {
    ++num_failed_;
    const std::vector<std::string> main = {op,
                                           FormatInt(size),
                                           FormatInt(size / element_bytes),
                                           "-",
                                           "-",
                                           "-",
                                           "-",
                                           "-",
                                           "-",
                                           "-",
                                           "-",
                                           "-",
                                           absl::StrCat("error: ", status.message())};
    cells.insert(cells.end(), main.begin(), main.end());
  } else {
    const auto& t = *measured;
    const bool fill = op == "ws_fill";
    const std::vector<std::string> main = {op,
                                           FormatInt(size),
                                           FormatInt(size / element_bytes),
                                           FormatSig(t[0] * 1e6),
                                           FormatSig(t[1] * 1e6),
                                           FormatSig(t[2] * 1e6),
                                           FormatFixed(busbw(t[0]), 2),
                                           FormatFixed(busbw(t[1]), 2),
                                           FormatFixed(t[1] / t[0], 3),
                                           FormatFixed(t[2] / t[0], 3),
                                           fill ? FormatFixed(t[0] / t[1], 3) : "-",
                                           wrong >= 0 ? FormatInt(wrong) : "-",
                                           "ok"};
    cells.insert(cells.end(), main.begin(), main.end());
  }
  vs_table_.AddRow(std::move(cells));
  return absl::OkStatus();
}

absl::Status CollectiveBench::VersusRaw(const std::string& op, int64_t size) {
  Device& device = *env_.device;
  Communicator& comm = *env_.comm;
  const int world = env_.world_size;
  const double factor = double(world - 1) / world;
  // size: the gathered output (all_gather) or the send buffer (reduce_scatter, all_to_all).
  const size_t count = size_t(size) / (4 * size_t(world));  // per rank (per block)
  const size_t send_count = op == "all_gather" ? count : count * world;
  const size_t recv_count = op == "reduce_scatter" ? count : count * world;
  Buffer send, ours_out, raw_out;
  const absl::Status prepared = [&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(send, device.Allocate(send_count * 4));
    DCP_ASSIGN_OR_RETURN(ours_out, device.Allocate(recv_count * 4));
    DCP_ASSIGN_OR_RETURN(raw_out, device.Allocate(recv_count * 4));
    return FillRandom(device, send.data(), DType::kF32, send_count, env_.options.seed,
                      97 + uint64_t(env_.rank));
  }();
  DCP_RETURN_IF_ERROR(AgreeOnStatus(*env_.bootstrap, prepared));
  std::function<absl::Status()> ours, raw;
  if (op == "all_gather") {
    ours = [&] { return comm.AllGather(send.data(), ours_out.data(), count, DType::kF32); };
    raw = [&] { return peer_->AllGather(send.data(), raw_out.data(), count, DType::kF32); };
  } else if (op == "reduce_scatter") {
    ours = [&] { return comm.ReduceScatterSum(send.data(), ours_out.data(), count, DType::kF32); };
    raw = [&] { return peer_->ReduceScatterSum(send.data(), raw_out.data(), count, DType::kF32); };
  } else {
    ours = [&] { return comm.AllToAll(send.data(), ours_out.data(), count, DType::kF32); };
    raw = [&] { return peer_->AllToAll(send.data(), raw_out.data(), count, DType::kF32); };
  }
  const auto compare = [&]() -> absl::StatusOr<int64_t> {
    DCP_ASSIGN_OR_RETURN(auto a, DownloadFloats(device, ours_out.data(), DType::kF32, recv_count));
    DCP_ASSIGN_OR_RETURN(auto b, DownloadFloats(device, raw_out.data(), DType::kF32, recv_count));
    int64_t wrong = 0;
    for (size_t i = 0; i < recv_count; ++i) wrong += std::memcmp(&a[i], &b[i], 4) != 0;
    return wrong;
  };
  return Versus(op, int64_t(count) * 4 * world, 4, factor, ours, raw, compare);
}

std::vector<Column> CollectiveBench::Columns(const BenchEnv& env) {
  std::vector<Column> columns = env.MetaColumns();
  const std::vector<Column> main = {
      {"pipeline", ""},    {"op", "op"},           {"size_bytes", "size"},  {"count", "count"},
      {"type", "type"},    {"time_us", "time_us"}, {"algbw_gbps", "algbw"}, {"busbw_gbps", "busbw"},
      {"wrong", "#wrong"}, {"status", "status"}};
  columns.insert(columns.end(), main.begin(), main.end());
  return columns;
}

void CollectiveBench::AddRow(const std::string& pipeline, const StepRow& row, double seconds,
                             int64_t wrong, const std::string& status) {
  const int world = env_.world_size;
  const double algbw = row.size_bytes / seconds * 1e-9;
  const double busbw = row.collective ? algbw * (world - 1) / world : kNan;
  std::vector<std::string> cells = env_.MetaCells();
  const std::vector<std::string> main = {pipeline,
                                         row.op,
                                         FormatInt(row.size_bytes),
                                         FormatInt(row.size_bytes / int64_t(dtype_size(row.dtype))),
                                         absl::AsciiStrToLower(std::string(dtype_name(row.dtype))),
                                         FormatSig(seconds * 1e6),
                                         FormatFixed(algbw, 2),
                                         FormatFixed(busbw, 2),
                                         wrong >= 0 ? FormatInt(wrong) : "-",
                                         status};
  cells.insert(cells.end(), main.begin(), main.end());
  table_.AddRow(std::move(cells));
}

absl::Status CollectiveBench::Run(const std::string& pipeline, const std::vector<StepRow>& rows,
                                  const absl::Status& prepared,
                                  const std::function<absl::Status()>& setup,
                                  const std::vector<std::function<absl::Status()>>& steps,
                                  const std::function<absl::StatusOr<int64_t>()>& check) {
  const auto fail = [&](const absl::Status& status) {
    ++num_failed_;
    for (const StepRow& row : rows) {
      AddRow(pipeline, row, kNan, -1, absl::StrCat("error: ", status.message()));
    }
    return absl::OkStatus();
  };
  const absl::Status agreed = AgreeOnStatus(*env_.bootstrap, prepared);
  if (!agreed.ok()) return fail(agreed);
  const auto run_steps = [&](const Mark* mark) -> absl::Status {
    for (const auto& step : steps) {
      DCP_RETURN_IF_ERROR(step());
      if (mark) DCP_RETURN_IF_ERROR((*mark)());
    }
    return absl::OkStatus();
  };
  auto times = TimeSteps(env_, static_cast<int>(steps.size()), setup,
                         [&](const Mark& mark) { return run_steps(&mark); });
  if (!times.ok()) return fail(times.status());
  int64_t wrong = -1;
  if (env_.options.check) {
    absl::StatusOr<int64_t> local = [&]() -> absl::StatusOr<int64_t> {
      if (setup) DCP_RETURN_IF_ERROR(setup());
      DCP_RETURN_IF_ERROR(run_steps(nullptr));
      DCP_RETURN_IF_ERROR(env_.device->Synchronize());
      return check();
    }();
    const absl::Status checked = AgreeOnStatus(*env_.bootstrap, local.status());
    if (!checked.ok()) return fail(checked);
    DCP_ASSIGN_OR_RETURN(wrong, SumOverRanks(env_, *local));
    num_wrong_ += wrong;
  }
  AddRow(pipeline, rows[0], times->total_s, wrong, "ok");
  for (size_t s = 0; s < steps.size(); ++s) {
    AddRow(pipeline, rows[s + 1], times->step_s[s], -1, "ok");
  }
  return absl::OkStatus();
}

absl::Status CollectiveBench::WorkspaceFill(int64_t size) {
  Device& device = *env_.device;
  Communicator& comm = *env_.comm;
  const int world = env_.world_size, rank = env_.rank, interleave = env_.options.interleave;
  const KvLayout layout{world, interleave};
  const DType dtype = device.storage_dtype();
  const int width = env_.dims.latent_width();
  const size_t row_bytes = width * dtype_size(dtype);
  // L local rows per rank (a multiple of I), N = W * L rows gathered.
  const int64_t local =
      std::max<int64_t>(interleave, size / int64_t(world * row_bytes) / interleave * interleave);
  const int64_t total = local * world;
  const uint64_t seed = env_.options.seed;
  const ValueStream value(seed, kStreamRows);

  // The paged shard: local row j (global token g) sits at slot slots[j], a permutation.
  std::vector<int32_t> slots(local), reorganize(total);
  const int64_t stride = std::gcd<int64_t>(7919, local) == 1 ? 7919 : 7927;
  for (int64_t j = 0; j < local; ++j) slots[j] = static_cast<int32_t>((j * stride + 3) % local);
  std::vector<float> cache(size_t(local) * width);
  for (int64_t j = 0; j < local; ++j) {
    const int64_t g = layout.global_index(j, rank);
    for (int c = 0; c < width; ++c) {
      cache[size_t(slots[j]) * width + c] = value.Exact(uint64_t(g) * width + c);
    }
  }
  for (int64_t g = 0; g < total; ++g) {
    reorganize[g] = static_cast<int32_t>(layout.owner(g) * local + layout.local_index(g));
  }
  Buffer d_cache, d_slots, d_reorganize, local_region, gathered, rows;
  const absl::Status prepared = [&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(d_cache, UploadAs(device, cache, dtype));
    DCP_ASSIGN_OR_RETURN(d_slots, UploadInts(device, slots));
    DCP_ASSIGN_OR_RETURN(d_reorganize, UploadInts(device, reorganize));
    DCP_ASSIGN_OR_RETURN(local_region, device.Allocate(local * row_bytes));
    DCP_ASSIGN_OR_RETURN(gathered, device.Allocate(total * row_bytes));
    DCP_ASSIGN_OR_RETURN(rows, device.Allocate(total * row_bytes));
    return absl::OkStatus();
  }();
  cache.clear();
  cache.shrink_to_fit();
  const int64_t gathered_bytes = total * int64_t(row_bytes);
  const std::vector<StepRow> step_rows = {{"ws_fill", gathered_bytes, dtype, true},
                                          {"ws_gather", local * int64_t(row_bytes), dtype, false},
                                          {"all_gather", gathered_bytes, dtype, true},
                                          {"ws_reorganize", gathered_bytes, dtype, false}};
  const std::vector<std::function<absl::Status()>> steps =
      {[&] {
         return device.GatherRows({d_cache.data(), d_slots.as<int32_t>(), local_region.data(),
                                   dtype, local, local, width, width, width});
       },
       [&] {
         return comm.AllGather(local_region.data(), gathered.data(), size_t(local) * width, dtype);
       },
       [&] {
         return device.GatherRows({gathered.data(), d_reorganize.as<int32_t>(), rows.data(), dtype,
                                   total, total, width, width, width});
       }};
  DCP_RETURN_IF_ERROR(
      Run("ws_fill", step_rows, prepared, nullptr, steps, [&]() -> absl::StatusOr<int64_t> {
        DCP_ASSIGN_OR_RETURN(auto got,
                             DownloadFloats(device, rows.data(), dtype, size_t(total) * width));
        int64_t wrong = 0;
        for (int64_t g = 0; g < total; ++g) {
          for (int c = 0; c < width; ++c) {
            wrong += got[size_t(g) * width + c] != value.Exact(uint64_t(g) * width + c);
          }
        }
        return wrong;
      }));
  if (!has_peer() || !prepared.ok()) return absl::OkStatus();
  // The pipeline against a raw all-gather of the same gathered bytes into a buffer of its own.
  Buffer raw_gathered;
  const absl::Status allocated = [&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(raw_gathered, device.Allocate(total * row_bytes));
    return absl::OkStatus();
  }();
  DCP_RETURN_IF_ERROR(AgreeOnStatus(*env_.bootstrap, allocated));
  const auto pipeline = [&]() -> absl::Status {
    for (const auto& step : steps) DCP_RETURN_IF_ERROR(step());
    return absl::OkStatus();
  };
  const auto raw = [&] {
    return peer_->AllGather(local_region.data(), raw_gathered.data(), size_t(local) * width, dtype);
  };
  const auto compare = [&]() -> absl::StatusOr<int64_t> {
    const size_t n = size_t(total) * width;
    DCP_ASSIGN_OR_RETURN(auto a, DownloadFloats(device, gathered.data(), dtype, n));
    DCP_ASSIGN_OR_RETURN(auto b, DownloadFloats(device, raw_gathered.data(), dtype, n));
    int64_t wrong = 0;
    for (size_t i = 0; i < n; ++i) wrong += std::memcmp(&a[i], &b[i], 4) != 0;
    return wrong;
  };
  return Versus("ws_fill", gathered_bytes, int(dtype_size(dtype)), double(world - 1) / world,
                pipeline, raw, compare);
}

absl::Status CollectiveBench::Combine(int64_t size, bool all_to_all) {
  Device& device = *env_.device;
  Communicator& comm = *env_.comm;
  const int world = env_.world_size, rank = env_.rank;
  const int heads = env_.options.heads.front(), dim = env_.dims.kv_lora_rank;
  const uint64_t seed = env_.options.seed;
  // n (token, head) rows per head block; the partial of this rank is [W, n, dim].
  const int64_t tokens = std::max<int64_t>(1, size / (int64_t{world} * heads * dim * 4));
  const int64_t n = tokens * heads;
  const size_t block = size_t(n) * dim;
  std::vector<float> partial(world * block), lse_part(size_t(world) * n);
  for (int q = 0; q < world; ++q) {
    const ValueStream out = PartialOutValues(seed, rank, q);
    for (size_t x = 0; x < block; ++x) partial[q * block + x] = out(x);
    for (int64_t x = 0; x < n; ++x) lse_part[q * size_t(n) + x] = PartialLse(seed, rank, q, x);
  }
  Buffer pristine, d_partial, d_lse, lse_all, lse_total, received, lse_received, combined, lse;
  const absl::Status prepared = [&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(pristine, UploadAs(device, partial, DType::kF32));
    DCP_ASSIGN_OR_RETURN(d_partial, device.Allocate(world * block * 4));
    DCP_ASSIGN_OR_RETURN(d_lse, UploadAs(device, lse_part, DType::kF32));
    DCP_ASSIGN_OR_RETURN(combined, device.Allocate(block * 4));
    if (all_to_all) {
      DCP_ASSIGN_OR_RETURN(received, device.Allocate(world * block * 4));
      DCP_ASSIGN_OR_RETURN(lse_received, device.Allocate(size_t(world) * n * 4));
      DCP_ASSIGN_OR_RETURN(lse, device.Allocate(size_t(n) * 4));
    } else {
      DCP_ASSIGN_OR_RETURN(lse_all, device.Allocate(size_t(world) * world * n * 4));
      DCP_ASSIGN_OR_RETURN(lse_total, device.Allocate(size_t(world) * n * 4));
    }
    return absl::OkStatus();
  }();
  partial.clear();
  partial.shrink_to_fit();
  const int64_t send_bytes = int64_t(world * block * 4);
  // DcpCorrect scales in place, so every iteration starts from the pristine partial.
  const auto setup = [&] {
    return device.Copy(d_partial.data(), pristine.data(), world * block * 4);
  };
  std::vector<StepRow> rows;
  std::vector<std::function<absl::Status()>> steps;
  if (all_to_all) {
    rows = {{"a2a", send_bytes, DType::kF32, true},
            {"all_to_all", send_bytes, DType::kF32, true},
            {"all_to_all_lse", int64_t(world) * n * 4, DType::kF32, true},
            {"dcp_combine", int64_t(block * 4), DType::kF32, false}};
    steps = {[&] { return comm.AllToAll(d_partial.data(), received.data(), block, DType::kF32); },
             [&] { return comm.AllToAll(d_lse.data(), lse_received.data(), n, DType::kF32); },
             [&] {
               DcpCombineParams p;
               p.outs = received.as<float>(), p.lses = lse_received.as<float>();
               p.out = combined.as<float>(), p.lse = lse.as<float>();
               p.world_size = world, p.num_tokens = static_cast<int>(tokens);
               p.num_heads = heads, p.dim = dim;
               return device.DcpCombine(p);
             }};
  } else {
    rows = {{"ag_rs", send_bytes, DType::kF32, true},
            {"all_gather_lse", int64_t(world) * world * n * 4, DType::kF32, true},
            {"dcp_correct", send_bytes, DType::kF32, false},
            {"reduce_scatter", send_bytes, DType::kF32, true}};
    steps = {[&] {
               return comm.AllGather(d_lse.data(), lse_all.data(), size_t(world) * n, DType::kF32);
             },
             [&] {
               DcpCorrectParams p;
               p.out = d_partial.as<float>(), p.lse_all = lse_all.as<float>();
               p.lse_total = lse_total.as<float>();
               p.world_size = world, p.rank = rank;
               p.num_tokens = static_cast<int>(tokens * world), p.num_heads = heads, p.dim = dim;
               return device.DcpCorrect(p);
             },
             [&] {
               return comm.ReduceScatterSum(d_partial.data(), combined.data(), block, DType::kF32);
             }};
  }
  // This rank's heads: the merge over every rank q of q's partial for block `rank`.
  const auto check = [&]() -> absl::StatusOr<int64_t> {
    DCP_ASSIGN_OR_RETURN(auto got, DownloadFloats(device, combined.data(), DType::kF32, block));
    const void* lse_data = all_to_all
                               ? lse.data()
                               : static_cast<const void*>(lse_total.as<float>() + size_t(rank) * n);
    DCP_ASSIGN_OR_RETURN(auto got_lse, DownloadFloats(device, lse_data, DType::kF32, n));
    std::vector<ValueStream> outs;
    for (int q = 0; q < world; ++q) outs.push_back(PartialOutValues(seed, q, rank));
    std::vector<double> row_lses(world), row_outs(size_t(world) * dim), want(dim);
    int64_t wrong = 0;
    for (int64_t x = 0; x < n; ++x) {
      for (int q = 0; q < world; ++q) {
        row_lses[q] = PartialLse(seed, q, rank, x);
        for (int d = 0; d < dim; ++d) row_outs[q * dim + d] = outs[q](uint64_t(x) * dim + d);
      }
      double want_lse = 0;
      MergeReference(row_lses, row_outs, dim, &want_lse, want.data());
      wrong += !Close(got_lse[x], want_lse, 1e-5, 1e-5);
      for (int d = 0; d < dim; ++d) wrong += !Close(got[x * dim + d], want[d], 1e-4, 1e-5);
    }
    return wrong;
  };
  return Run(all_to_all ? "a2a" : "ag_rs", rows, prepared, setup, steps, check);
}

ModeResult CollectiveBench::Finish() {
  table_.AddNote(absl::StrFormat(
      "%d ranks. size: bytes of the whole buffer (all-gather: gathered output; reduce-scatter, "
      "all-to-all: send buffer). busbw = algbw x (W-1)/W for collectives (nccl-tests); "
      "pipeline rows (ws_fill, ag_rs, a2a) use their collective's factor.",
      env_.world_size));
  table_.AddNote(
      "time: median of the slowest rank, steps cut by GPU timestamps inside one "
      "iteration; #wrong counts the pipeline's result on every rank.");
  ModeResult result;
  result.num_wrong = num_wrong_;
  result.num_failed = num_failed_;
  result.tables.push_back({"", std::move(table_)});
  if (has_peer()) {
    vs_table_.AddNote(
        "ours vs raw NCCL on the same bytes, stream, ranks and GPUs: time per call of a loop of "
        "back-to-back calls (median over iterations of the slowest rank). ours_us: "
        "Completion::kStream; host_us: Completion::kHost (a host wait per call). ratio = "
        "ours/raw (target <= 1.1); fill = raw/ours for the ws_fill pipeline (target >= 0.9 "
        "at >= 64 MB). busbw = size/time x (W-1)/W (nccl-tests). #wrong: elements where ours "
        "differs from raw, bit for bit.");
    result.tables.push_back({"nccl", std::move(vs_table_)});
  }
  return result;
}

}  // namespace

absl::StatusOr<ModeResult> RunCollectives(BenchEnv& env) {
  CollectiveBench bench(env);
  DCP_RETURN_IF_ERROR(bench.Start());
  const int world = env.world_size;
  const int64_t row_bytes =
      env.dims.latent_width() * int64_t(dtype_size(env.device->storage_dtype()));
  for (int64_t size : SweepSizes(env.options, row_bytes * world * env.options.interleave)) {
    DCP_RETURN_IF_ERROR(bench.WorkspaceFill(size));
  }
  const int64_t combine_granule =
      int64_t{world} * env.options.heads.front() * env.dims.kv_lora_rank * 4;
  for (int64_t size : SweepSizes(env.options, combine_granule)) {
    DCP_RETURN_IF_ERROR(bench.Combine(size, /*all_to_all=*/false));
  }
  for (int64_t size : SweepSizes(env.options, combine_granule)) {
    DCP_RETURN_IF_ERROR(bench.Combine(size, /*all_to_all=*/true));
  }
  if (bench.has_peer()) {
    for (const char* op : {"all_gather", "reduce_scatter", "all_to_all"}) {
      for (int64_t size : SweepSizes(env.options, int64_t{4} * world)) {
        DCP_RETURN_IF_ERROR(bench.VersusRaw(op, size));
      }
    }
  }
  return bench.Finish();
}

}  // namespace dcp::bench
