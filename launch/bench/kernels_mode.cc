// kernels: every Device kernel alone. Ceilings first (a device-to-device Copy of a large
// buffer, a large GEMM through Device::Gemm in the storage dtype), then per batch and per-rank
// head count the attention kernels and the up-projection GEMMs (TFLOP/s, % of the GEMM
// ceiling), then over the -b/-e/-f sweep the memory-bound kernels (GB/s counting bytes read +
// written, % of the copy ceiling). Row kernels, merges and top-k slots are checked (#wrong).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "launch/bench/bench_data.h"
#include "launch/bench/fp8_kernels.h"
#include "launch/bench/kernels_sweep.h"
#include "launch/bench/modes.h"
#include "core/kv_cache_format.h"
#include "core/status.h"
#if DCP_WITH_CUDA
#include "attention/cuda/gemm_cublas.h"
#include "attention/cuda/gemm_small_m.h"
#include "runtime/cuda/cuda_device.h"
#endif

namespace dcp::bench {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr uint64_t kStreamA = 11, kStreamB = 12, kStreamC = 13;

// The batches of the kernels mode when --batches is not given: the route comparison's
// shapes that matter for the targets (prefills at and beyond K, extends).
const std::vector<std::string>& DefaultKernelBatches() {
  static const std::vector<std::string>* batches = new std::vector<std::string>{
      "q1k", "q2k", "4q2k", "16q1k", "64q512", "q8k", "16q64kv128", "64q64kv128"};
  return *batches;
}

struct KernelRow {
  std::string kernel;
  const BatchShape* shape = nullptr;  // attention and GEMM rows
  int heads = 0;
  int64_t size_bytes = 0;  // sweep rows
  double flops = 0;        // per run; 0: memory-bound
  double bytes = 0;        // read + written per run
};

class KernelBench {
 public:
  explicit KernelBench(BenchEnv& env) : env_(env), table_(Columns(env)) {}

  // Rows go to stderr and the CSV as they are measured (BenchEnv::Stream).
  absl::Status Start() { return AgreeOnStatus(*env_.bootstrap, env_.Stream(&table_, "")); }

  // Times `run`; then, when `check` is given and -c 1, runs setup + run once more and counts
  // wrong elements. `prepared`: this rank's status of allocating the inputs (agreed here).
  absl::Status Measure(const KernelRow& row, const absl::Status& prepared, const Step& setup,
                       const Step& run, const Check& check);
  // CUDA ranks: `launches` calls of `launch(i)` captured once into a CUDA graph on the device's
  // stream and replayed, so a row is GPU time without the host's launch latency (row.flops and
  // row.bytes count all the launches; time_us is the replay's). One eager call first, so that
  // nothing is allocated or configured during the capture. Elsewhere a no-op.
  absl::Status MeasureReplayed(const KernelRow& row, const absl::Status& prepared, int launches,
                               const std::function<absl::Status(int)>& launch);
  absl::Status MeasureCeilings();
  absl::Status MeasureAttention(const BatchShape& shape, int heads);
  absl::Status MeasureSparseMqaShapes();
  absl::Status MeasureSmallMGemm();
  absl::Status MeasureSweep(int64_t size);

  ModeResult Finish();

 private:
  static std::vector<Column> Columns(const BenchEnv& env);
  bool Skipped(const KernelRow& row) const;
  void AddRow(const KernelRow& row, const StepTimes* times, int64_t wrong,
              const std::string& status);

  BenchEnv& env_;
  ResultTable table_;
  double copy_gbps_ = kNan, gemm_tflops_ = kNan;
  std::optional<StepTimes> last_times_;  // of the last Measure; empty when it failed
  int64_t num_wrong_ = 0, num_failed_ = 0;
};

std::vector<Column> KernelBench::Columns(const BenchEnv& env) {
  std::vector<Column> columns = env.MetaColumns();
  const std::vector<Column> main = {
      {"kernel", "kernel"}, {"batch", "shape"},       {"num_seqs", ""},
      {"query_len", ""},    {"seq_len", ""},          {"uniform", ""},
      {"has_context", ""},  {"heads", "heads"},       {"topk", ""},
      {"tokens", ""},       {"size_bytes", ""},       {"time_us", "time_us"},
      {"min_us", ""},       {"tflops", "TF/s"},       {"gbps", "GB/s"},
      {"bound", ""},        {"ceiling_pct", "%ceil"}, {"wrong", "#wrong"},
      {"status", "status"}};
  columns.insert(columns.end(), main.begin(), main.end());
  return columns;
}

void KernelBench::AddRow(const KernelRow& row, const StepTimes* times, int64_t wrong,
                         const std::string& status) {
  const double seconds = times ? times->total_s : kNan;
  const double tflops = row.flops > 0 ? row.flops / seconds * 1e-12 : kNan;
  const double gbps = row.bytes > 0 ? row.bytes / seconds * 1e-9 : kNan;
  const bool compute = row.flops > 0;
  const double pct = compute ? tflops / gemm_tflops_ * 100 : gbps / copy_gbps_ * 100;
  std::vector<std::string> cells = env_.MetaCells();
  const BatchShape* s = row.shape;
  bool uniform = s != nullptr;
  if (s) {
    for (const auto& r : s->requests) uniform = uniform && r == s->requests.front();
  }
  const std::vector<std::string> main = {row.kernel,
                                         s ? s->spec : FormatBytes(row.size_bytes),
                                         s ? FormatInt(s->requests.size()) : "-",
                                         s ? FormatInt(s->max_query_len) : "-",
                                         s ? FormatInt(s->max_seq_len) : "-",
                                         s ? (uniform ? "1" : "0") : "-",
                                         s ? (s->has_context ? "1" : "0") : "-",
                                         row.heads > 0 ? FormatInt(row.heads) : "-",
                                         s ? FormatInt(env_.options.index_topk) : "-",
                                         s ? FormatInt(s->num_tokens) : "-",
                                         row.size_bytes > 0 ? FormatInt(row.size_bytes) : "-",
                                         FormatSig(seconds * 1e6),
                                         FormatSig(times ? times->min_total_s * 1e6 : kNan),
                                         FormatSig(tflops),
                                         FormatSig(gbps),
                                         compute ? "compute" : "memory",
                                         FormatFixed(pct, 1),
                                         wrong >= 0 ? FormatInt(wrong) : "-",
                                         status};
  cells.insert(cells.end(), main.begin(), main.end());
  table_.AddRow(std::move(cells));
}

// --only: other kernels are skipped (the ceilings always run: the percentages need them).
bool KernelBench::Skipped(const KernelRow& row) const {
  return !env_.options.only.empty() && row.kernel.find("_ceiling") == std::string::npos &&
         std::none_of(env_.options.only.begin(), env_.options.only.end(),
                      [&](const std::string& prefix) { return row.kernel.rfind(prefix, 0) == 0; });
}

absl::Status KernelBench::Measure(const KernelRow& row, const absl::Status& prepared,
                                  const Step& setup, const Step& run, const Check& check) {
  last_times_.reset();
  if (Skipped(row)) return absl::OkStatus();
  const absl::Status agreed = AgreeOnStatus(*env_.bootstrap, prepared);
  if (!agreed.ok()) {
    ++num_failed_;
    AddRow(row, nullptr, -1, absl::StrCat("error: ", agreed.message()));
    return absl::OkStatus();
  }
  auto times = TimeSteps(env_, 1, setup, [&](const Mark& mark) -> absl::Status {
    DCP_RETURN_IF_ERROR(run());
    return mark();
  });
  if (!times.ok()) {
    // Unsupported shapes (a CUDA kernel compiled for DeepSeek widths only) are not failures.
    const bool unsupported = times.status().code() == absl::StatusCode::kUnimplemented;
    if (!unsupported) ++num_failed_;
    AddRow(row, nullptr, -1,
           absl::StrCat(unsupported ? "unsupported: " : "error: ", times.status().message()));
    return absl::OkStatus();
  }
  int64_t wrong = -1;
  if (check && env_.options.check) {
    absl::StatusOr<int64_t> local = [&]() -> absl::StatusOr<int64_t> {
      if (setup) DCP_RETURN_IF_ERROR(setup());
      DCP_RETURN_IF_ERROR(run());
      DCP_RETURN_IF_ERROR(env_.device->Synchronize());
      return check();
    }();
    const absl::Status checked = AgreeOnStatus(*env_.bootstrap, local.status());
    if (!checked.ok()) {
      ++num_failed_;
      AddRow(row, &*times, -1, absl::StrCat("check error: ", checked.message()));
      return absl::OkStatus();
    }
    DCP_ASSIGN_OR_RETURN(wrong, SumOverRanks(env_, *local));
    num_wrong_ += wrong;
  }
  AddRow(row, &*times, wrong, "ok");
  last_times_ = *times;
  return absl::OkStatus();
}

absl::Status KernelBench::MeasureReplayed(const KernelRow& row, const absl::Status& prepared,
                                          int launches,
                                          const std::function<absl::Status(int)>& launch) {
#if DCP_WITH_CUDA
  auto* cuda_device = dynamic_cast<CudaDevice*>(env_.device);
  if (cuda_device == nullptr || Skipped(row)) return absl::OkStatus();
  cudaStream_t stream = cuda_device->stream();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  absl::Status captured = prepared;
  if (captured.ok()) captured = launch(0);
  if (captured.ok()) captured = env_.device->Synchronize();
  if (captured.ok() &&
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    captured = DCP_ERROR(Internal, "cudaStreamBeginCapture failed");
  }
  if (captured.ok()) {
    for (int i = 0; i < launches && captured.ok(); ++i) captured = launch(i);
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (captured.ok() && ended != cudaSuccess) {
      captured = DCP_ERROR(Internal, "capture: %s", cudaGetErrorString(ended));
    }
    if (captured.ok() && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
      captured = DCP_ERROR(Internal, "cudaGraphInstantiate failed");
    }
  }
  cudaGetLastError();  // a refused capture is reported in the row, not by the next launch
  const absl::Status measured = Measure(
      row, captured, nullptr,
      [&]() -> absl::Status {
        const cudaError_t code = cudaGraphLaunch(exec, stream);
        if (code != cudaSuccess) {
          return DCP_ERROR(Internal, "cudaGraphLaunch: %s", cudaGetErrorString(code));
        }
        return absl::OkStatus();
      },
      nullptr);
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  return measured;
#else
  (void)row, (void)prepared, (void)launches, (void)launch;
  return absl::OkStatus();
#endif
}

absl::Status KernelBench::MeasureCeilings() {
  Device& device = *env_.device;
  const BenchOptions& o = env_.options;
  const bool gpu = env_.on_gpu();
  // Copy: 2 x bytes moved (read + write).
  const int64_t copy_bytes =
      o.copy_bytes > 0 ? o.copy_bytes : (gpu ? int64_t{1} << 30 : int64_t{64} << 20);
  {
    Buffer src, dst;
    const absl::Status prepared = [&]() -> absl::Status {
      DCP_ASSIGN_OR_RETURN(src, AllocateZeroed(device, copy_bytes));
      DCP_ASSIGN_OR_RETURN(dst, AllocateZeroed(device, copy_bytes));
      return absl::OkStatus();
    }();
    KernelRow row{"copy_ceiling", nullptr, 0, copy_bytes, 0, 2.0 * copy_bytes};
    DCP_RETURN_IF_ERROR(Measure(
        row, prepared, nullptr, [&] { return device.Copy(dst.data(), src.data(), copy_bytes); },
        nullptr));
    if (last_times_) copy_gbps_ = row.bytes / last_times_->total_s * 1e-9;
  }
  // GEMM: m = n = k, storage dtype in and out, fp32 accumulation.
  const int n = static_cast<int>(o.gemm_size > 0 ? o.gemm_size : (gpu ? 8192 : 1024));
  {
    const DType dtype = device.storage_dtype();
    const size_t count = size_t(n) * n;
    Buffer a, b, c;
    const absl::Status prepared = [&]() -> absl::Status {
      DCP_ASSIGN_OR_RETURN(a, device.Allocate(count * dtype_size(dtype)));
      DCP_ASSIGN_OR_RETURN(b, device.Allocate(count * dtype_size(dtype)));
      DCP_ASSIGN_OR_RETURN(c, device.Allocate(count * dtype_size(dtype)));
      DCP_RETURN_IF_ERROR(FillRandom(device, a.data(), dtype, count, o.seed, kStreamA));
      return FillRandom(device, b.data(), dtype, count, o.seed, kStreamB);
    }();
    GemmParams p;
    p.a = a.data(), p.b = b.data(), p.c = c.data();
    p.a_dtype = p.b_dtype = p.c_dtype = dtype;
    p.m = p.n = p.k = n;
    p.lda = p.ldb = p.ldc = n;
    KernelRow row{"gemm_ceiling",          nullptr, 0, int64_t(count * dtype_size(dtype)),
                  2.0 * n * n * double(n), 0};
    DCP_RETURN_IF_ERROR(Measure(
        row, prepared, nullptr, [&] { return device.Gemm(p); }, nullptr));
    if (last_times_) gemm_tflops_ = row.flops / last_times_->total_s * 1e-12;
  }
  // The floor of one link of a layer's kernel chain: a one-row cache write (ScatterRows, a
  // programmatic dependent with an early trigger on sm_90, as in a decode layer) launched 16
  // times from one CUDA graph, each waiting for the one before; time_us / 16 is what a
  // dependent kernel that moves next to nothing costs on the GPU. CUDA ranks only.
  if (gpu) {
    const int width = env_.dims.latent_width();
    const DType dtype = device.storage_dtype();
    const std::vector<int32_t> slot = {0};
    Buffer src, dst, index;
    const absl::Status prepared = [&]() -> absl::Status {
      DCP_ASSIGN_OR_RETURN(src, AllocateZeroed(device, size_t(width) * dtype_size(dtype)));
      DCP_ASSIGN_OR_RETURN(dst, AllocateZeroed(device, size_t(width) * dtype_size(dtype)));
      DCP_ASSIGN_OR_RETURN(index, device.Allocate(sizeof(int32_t)));
      return device.CopyFromHost(index.data(), slot.data(), sizeof(int32_t));
    }();
    ScatterRowsParams p;
    p.src = src.data(), p.dst = dst.data(), p.index = static_cast<const int32_t*>(index.data());
    p.dtype = dtype;
    p.num_rows = p.num_dst_rows = 1;
    p.width = width;
    p.src_row_stride = p.dst_row_stride = width;
    constexpr int kLaunches = 16;
    KernelRow row{absl::StrCat("dependent_launch_x", kLaunches), nullptr, 0, 0, 0,
                  2.0 * kLaunches * width * dtype_size(dtype)};
    DCP_RETURN_IF_ERROR(MeasureReplayed(row, prepared, kLaunches,
                                        [&](int) { return device.ScatterRows(p); }));
  }
  return absl::OkStatus();
}

absl::Status KernelBench::MeasureAttention(const BatchShape& shape, int heads) {
  Device& device = *env_.device;
  const BenchOptions& o = env_.options;
  const ModelDims& m = env_.dims;
  const DType dtype = device.storage_dtype();
  const size_t element = dtype_size(dtype);
  const int qk = m.qk_head_dim(), dv = m.v_head_dim, dn = m.qk_nope_head_dim;
  const int r = m.kv_lora_rank, width = m.latent_width(), topk = o.index_topk;
  const int64_t t = shape.num_tokens, keys = shape.num_keys;

  // Packed request offsets: queries and keys of request i.
  std::vector<int32_t> cu_q(1, 0), cu_k(1, 0);
  for (const auto& req : shape.requests) {
    cu_q.push_back(cu_q.back() + req.query_len);
    cu_k.push_back(cu_k.back() + req.seq_len);
  }

  // Dense MHA, bottom-right causal: the query tokens of each request over all its keys; one
  // row per --prefill_backend entry (the device's implementation chosen for it). The output in
  // --output_dtype (bf16: as torch's SDPA, the peer of these rows, writes it).
  const DType out_dtype = o.OutputDType();
  for (const std::string& backend : o.prefill_backends) {
    if (backend == "none") continue;
    std::string row_name = backend == "auto" ? "dense_mha" : "dense_mha_" + backend;
    KernelRow row{row_name.c_str(),
                  &shape,
                  heads,
                  0,
                  2.0 * heads * (qk + dv) * shape.SelectedKeys(std::numeric_limits<int>::max()),
                  0};
    const absl::Status support = device.SelectPrefillBackend(backend, heads, qk, dv);
    if (!support.ok()) {
      AddRow(row, nullptr, -1, absl::StrCat("unsupported: ", support.message()));
    } else {
      Buffer q, k, v, out, lse, d_cu_q, d_cu_k;
      const absl::Status prepared = [&]() -> absl::Status {
        DCP_ASSIGN_OR_RETURN(q, device.Allocate(size_t(t) * heads * qk * element));
        DCP_ASSIGN_OR_RETURN(k, device.Allocate(size_t(keys) * heads * qk * element));
        DCP_ASSIGN_OR_RETURN(v, device.Allocate(size_t(keys) * heads * dv * element));
        DCP_ASSIGN_OR_RETURN(out,
                             device.Allocate(size_t(t) * heads * dv * dtype_size(out_dtype)));
        DCP_ASSIGN_OR_RETURN(lse, device.Allocate(size_t(t) * heads * 4));
        DCP_ASSIGN_OR_RETURN(d_cu_q, UploadInts(device, cu_q));
        DCP_ASSIGN_OR_RETURN(d_cu_k, UploadInts(device, cu_k));
        DCP_RETURN_IF_ERROR(
            FillRandom(device, q.data(), dtype, size_t(t) * heads * qk, o.seed, kStreamA));
        DCP_RETURN_IF_ERROR(
            FillRandom(device, k.data(), dtype, size_t(keys) * heads * qk, o.seed, kStreamB));
        return FillRandom(device, v.data(), dtype, size_t(keys) * heads * dv, o.seed, kStreamC);
      }();
      DenseMhaParams p;
      p.q = q.data(), p.k = k.data(), p.v = v.data();
      p.out = out.data(), p.out_dtype = out_dtype, p.lse = lse.as<float>();
      p.cu_seqlens_q = d_cu_q.as<int32_t>(), p.cu_seqlens_k = d_cu_k.as<int32_t>();
      p.host_cu_seqlens_q = cu_q.data(), p.host_cu_seqlens_k = cu_k.data();  // as the worker
      p.dtype = dtype;
      p.num_seqs = static_cast<int>(shape.requests.size());
      p.num_heads = heads, p.qk_dim = qk, p.v_dim = dv;
      p.max_seqlen_q = shape.max_query_len, p.max_seqlen_k = shape.max_seq_len;
      p.q_token_stride = p.k_token_stride = int64_t{heads} * qk;
      p.q_head_stride = p.k_head_stride = qk;
      p.v_token_stride = p.out_token_stride = int64_t{heads} * dv;
      p.v_head_stride = p.out_head_stride = dv;
      p.lse_token_stride = heads;
      p.causal = true;
      p.scale = m.scale();
      DCP_RETURN_IF_ERROR(Measure(
          row, prepared, nullptr, [&] { return device.DenseMha(p); }, nullptr));
    }
  }

  // Sparse MQA over the batch's rows: request i's keys are cache rows [cu_k[i], cu_k[i+1]).
  {
    KernelRow row{
        "sparse_mqa", &shape, heads, 0, 2.0 * heads * (width + r) * shape.SelectedKeys(topk), 0};
    Buffer q, cache, indices, out, lse;
    const absl::Status prepared = [&]() -> absl::Status {
      std::vector<int32_t> host(size_t(t) * topk);
      int64_t token = 0;
      for (size_t i = 0; i < shape.requests.size(); ++i) {
        const auto& req = shape.requests[i];
        for (int32_t x = 0; x < req.query_len; ++x, ++token) {
          int32_t* row_indices = &host[size_t(token) * topk];
          FillTopkRow(req.seq_len - req.query_len + x, topk, row_indices);
          for (int j = 0; j < topk; ++j) {
            if (row_indices[j] >= 0) row_indices[j] += cu_k[i];
          }
        }
      }
      DCP_ASSIGN_OR_RETURN(indices, UploadInts(device, host));
      DCP_ASSIGN_OR_RETURN(q, device.Allocate(size_t(t) * heads * width * element));
      DCP_ASSIGN_OR_RETURN(cache, device.Allocate(size_t(keys) * width * element));
      DCP_ASSIGN_OR_RETURN(out, device.Allocate(size_t(t) * heads * r * 4));
      DCP_ASSIGN_OR_RETURN(lse, device.Allocate(size_t(t) * heads * 4));
      DCP_RETURN_IF_ERROR(
          FillRandom(device, q.data(), dtype, size_t(t) * heads * width, o.seed, kStreamA));
      return FillRandom(device, cache.data(), dtype, size_t(keys) * width, o.seed, kStreamB);
    }();
    SparseMqaParams p;
    p.q = q.data(), p.kv_cache = cache.data(), p.indices = indices.as<int32_t>();
    p.out = out.as<float>(), p.lse = lse.as<float>();
    p.dtype = dtype;
    p.num_tokens = static_cast<int>(t), p.num_heads = heads;
    p.head_dim = width, p.v_dim = r, p.topk = topk, p.num_slots = keys;
    p.q_token_stride = int64_t{heads} * width, p.q_head_stride = width;
    p.kv_row_stride = width, p.indices_token_stride = topk;
    p.out_token_stride = int64_t{heads} * r, p.out_head_stride = r;
    p.lse_token_stride = heads;
    p.scale = m.scale();
    DCP_RETURN_IF_ERROR(Measure(
        row, prepared, nullptr, [&] { return device.SparseMqa(p); }, nullptr));

    // The same selection over the same rows quantized to fp8_ds_mla (656 bytes instead of
    // width x element): the kernel dequantizes them on the way in.
    if (r == fp8_ds_mla::kLatentDim && m.qk_rope_head_dim == fp8_ds_mla::kRopeDim) {
      KernelRow fp8_row = row;
      fp8_row.kernel = "sparse_mqa_fp8";
      Buffer fp8_cache, all_slots;
      const absl::Status fp8_prepared = [&]() -> absl::Status {
        DCP_RETURN_IF_ERROR(prepared);
        std::vector<int32_t> identity(keys);
        for (int64_t i = 0; i < keys; ++i) identity[i] = static_cast<int32_t>(i);
        DCP_ASSIGN_OR_RETURN(all_slots, UploadInts(device, identity));
        DCP_ASSIGN_OR_RETURN(fp8_cache, device.Allocate(size_t(keys) * fp8_ds_mla::kRowBytes));
        Fp8DsMlaWriteParams w;
        w.kv_c = cache.data();
        w.k_pe = static_cast<const std::byte*>(cache.data()) + size_t(r) * element;
        w.slot_mapping = all_slots.as<int32_t>();
        w.cache = fp8_cache.as<uint8_t>();
        w.dtype = dtype;
        w.num_rows = w.num_slots = keys;
        w.kv_c_row_stride = w.k_pe_row_stride = width;
        return WriteFp8DsMlaRowsOn(device, w);
      }();
      SparseMqaParams f = p;
      f.kv_format = KvCacheDType::kFp8DsMla;
      f.kv_cache = fp8_cache.data();
      f.kv_row_stride = fp8_ds_mla::kRowBytes;
      DCP_RETURN_IF_ERROR(Measure(
          fp8_row, fp8_prepared, nullptr, [&] { return device.SparseMqa(f); }, nullptr));
    }
  }

  // The layer's GEMMs, batched over heads as the worker issues them.
  struct GemmCase {
    const char* name;
    int64_t m;
    int n, k;
    int64_t a_count, b_count, c_count;
    DType c_dtype;
  };
  const GemmCase cases[] = {
      // rows [keys, R+Dr] x w_uk[h]^T -> k_nope [keys, H, qk]; x w_uv[h] -> v [keys, H, Dv]
      {"gemm_up_k", keys, dn, r, keys * width, int64_t{heads} * dn * r, keys * heads * qk, dtype},
      {"gemm_up_v", keys, dv, r, keys * width, int64_t{heads} * r * dv, keys * heads * dv, dtype},
      // the dense route's one GEMM: x w_kv_b[h]^T -> [k_nope | v] inside kv [keys, H, Dr+Dn+Dv]
      {"gemm_up_kv", keys, dn + dv, r, keys * width, int64_t{heads} * (dn + dv) * r,
       keys * heads * (qk + dv), dtype},
      // q_nope [T, H, Dn] x w_uk[h] -> q' [T, H, R+Dr]
      {"gemm_absorb", t, r, dn, t * heads * dn, int64_t{heads} * dn * r, t * heads * width, dtype},
      // o_lat [T, H, R] x w_uv[h] -> out [T, H, Dv] F32
      {"gemm_out", t, dv, r, t * heads * r, int64_t{heads} * r * dv, t * heads * dv, DType::kF32},
  };
  for (const GemmCase& c : cases) {
    KernelRow row{c.name, &shape, heads, 0, 2.0 * double(c.m) * c.n * c.k * heads, 0};
    Buffer a, b, out;
    const absl::Status prepared = [&]() -> absl::Status {
      DCP_ASSIGN_OR_RETURN(a, device.Allocate(size_t(c.a_count) * element));
      DCP_ASSIGN_OR_RETURN(b, device.Allocate(size_t(c.b_count) * element));
      DCP_ASSIGN_OR_RETURN(out, device.Allocate(size_t(c.c_count) * dtype_size(c.c_dtype)));
      DCP_RETURN_IF_ERROR(FillRandom(device, a.data(), dtype, c.a_count, o.seed, kStreamA));
      return FillRandom(device, b.data(), dtype, c.b_count, o.seed, kStreamB, 0.05f);
    }();
    GemmParams p;
    p.a = a.data(), p.b = b.data(), p.c = out.data();
    p.a_dtype = p.b_dtype = dtype;
    p.c_dtype = c.c_dtype;
    p.m = static_cast<int>(c.m), p.n = c.n, p.k = c.k, p.batch = heads;
    const std::string name = c.name;
    if (name == "gemm_up_kv") {
      p.trans_b = true;  // w_kv_b[h] is stored [Dn + Dv, R]
      p.lda = width, p.stride_a = 0;
      p.ldb = r, p.stride_b = int64_t{r} * c.n;
      p.ldc = int64_t{heads} * (qk + dv), p.stride_c = qk + dv;
    } else if (name == "gemm_up_k" || name == "gemm_up_v") {
      p.trans_b = name == "gemm_up_k";  // w_uk[h] is stored [Dn, R]
      p.lda = width, p.stride_a = 0;
      p.ldb = p.trans_b ? r : dv;
      p.stride_b = int64_t{r} * c.n;
      p.ldc = int64_t{heads} * (p.trans_b ? qk : dv);
      p.stride_c = p.trans_b ? qk : dv;
    } else if (name == "gemm_absorb") {
      p.lda = int64_t{heads} * dn, p.stride_a = dn;
      p.ldb = r, p.stride_b = int64_t{dn} * r;
      p.ldc = int64_t{heads} * width, p.stride_c = width;
    } else {
      p.lda = int64_t{heads} * r, p.stride_a = r;
      p.ldb = dv, p.stride_b = int64_t{r} * dv;
      p.ldc = int64_t{heads} * dv, p.stride_c = dv;
    }
    if (name != "gemm_up_kv") {
      DCP_RETURN_IF_ERROR(Measure(
          row, prepared, nullptr, [&] { return device.Gemm(p); }, nullptr));
      continue;
    }
    // The up-projection as the dense route runs it (its class tuned at plan time:
    // Device::PrepareGemm), and beside it cuBLAS's default algorithm on CUDA ranks.
    // The "_x16" rows replay 16 launches from one CUDA graph (time_us is theirs): GPU time
    // without the host's launch latency, which is a third of a 1k-row GEMM's single launch.
    constexpr int kLaunches = 16;
    auto replayed = [&](const char* kernel) {
      KernelRow r = row;
      r.kernel = absl::StrCat(kernel, "_x", kLaunches);
      r.flops *= kLaunches;
      return r;
    };
    const absl::Status tuned = prepared.ok() ? device.PrepareGemm(p) : prepared;
    DCP_RETURN_IF_ERROR(Measure(
        row, tuned, nullptr, [&] { return device.Gemm(p); }, nullptr));
    DCP_RETURN_IF_ERROR(MeasureReplayed(replayed("gemm_up_kv"), tuned, kLaunches,
                                        [&](int) { return device.Gemm(p); }));
#if DCP_WITH_CUDA
    if (auto* cuda_device = dynamic_cast<CudaDevice*>(&device); cuda_device != nullptr) {
      KernelRow fallback = row;
      fallback.kernel = "gemm_up_kv_default";
      auto run_default = [&] {
        return cuda::GemmCublas(cuda_device->cublas(), p, cuda_device->stream());
      };
      DCP_RETURN_IF_ERROR(Measure(fallback, prepared, nullptr, run_default, nullptr));
      DCP_RETURN_IF_ERROR(MeasureReplayed(replayed("gemm_up_kv_default"), prepared, kLaunches,
                                          [&](int) { return run_default(); }));
    }
#endif
  }

  // The dense route's one copy launch (Device::CopyRows): q [T, H, Dr + Dn] = [q_rope | q_nope]
  // and k_pe of each latent row [T, R + Dr] broadcast in front of every head of kv [T, H, Dr +
  // Dn + Dv]. Memory-bound: bytes = q read and written + k_pe written (+ its rows read).
  {
    const int dr = m.qk_rope_head_dim, kv_width = dr + dn + dv;
    const int64_t rows = t * heads;
    KernelRow row{"copy_rows", &shape, heads, 0, 0,
                  double(element) * (2.0 * rows * qk + double(rows) * dr + double(t) * dr)};
    Buffer q_nope, q_rope, latent, q, kv;
    const absl::Status prepared = [&]() -> absl::Status {
      DCP_ASSIGN_OR_RETURN(q_nope, device.Allocate(size_t(rows) * dn * element));
      DCP_ASSIGN_OR_RETURN(q_rope, device.Allocate(size_t(rows) * dr * element));
      DCP_ASSIGN_OR_RETURN(latent, device.Allocate(size_t(t) * width * element));
      DCP_ASSIGN_OR_RETURN(q, device.Allocate(size_t(rows) * qk * element));
      DCP_ASSIGN_OR_RETURN(kv, device.Allocate(size_t(rows) * kv_width * element));
      DCP_RETURN_IF_ERROR(FillRandom(device, q_nope.data(), dtype, rows * dn, o.seed, kStreamA));
      DCP_RETURN_IF_ERROR(FillRandom(device, q_rope.data(), dtype, rows * dr, o.seed, kStreamB));
      return FillRandom(device, latent.data(), dtype, t * width, o.seed, kStreamA);
    }();
    CopyRowsParams p;
    p.dtype = dtype;
    p.num_copies = 3;
    p.copies[0] = {static_cast<const std::byte*>(latent.data()) + size_t(r) * element, kv.data(),
                   rows, dr, width, kv_width, heads};
    p.copies[1] = {q_rope.data(), q.data(), rows, dr, dr, qk, 1};
    p.copies[2] = {q_nope.data(), static_cast<std::byte*>(q.data()) + size_t(dr) * element, rows,
                   dn, dn, qk, 1};
    DCP_RETURN_IF_ERROR(Measure(
        row, prepared, nullptr, [&] { return device.CopyRows(p); }, nullptr));
  }
  return absl::OkStatus();
}

ModeResult KernelBench::Finish() {
  table_.AddNote(absl::StrFormat(
      "ceilings measured in this run: copy %s GB/s (read + write), GEMM %s TFLOP/s (%s). "
      "%%ceil: TF/s of the GEMM ceiling (compute rows) or GB/s of the copy ceiling (memory rows).",
      FormatSig(copy_gbps_), FormatSig(gemm_tflops_), dtype_name(env_.device->storage_dtype())));
  table_.AddNote(
      "Attention TF/s count useful FLOPs: dense causal keys x 2(qk + v); sparse "
      "selected keys x 2(2R + Dr). sparse_mqa_fp8: the same selection over the rows quantized "
      "to fp8_ds_mla (656 bytes a row), dequantized in the kernel. Times: median of the slowest "
      "rank.");
  ModeResult result;
  result.num_wrong = num_wrong_;
  result.num_failed = num_failed_;
  result.tables.push_back({"", std::move(table_)});
  return result;
}

}  // namespace

// Sparse MQA alone at the shapes of its targets (GPU only): T tokens x H heads, every token
// with the same number of valid keys in a compacted row (valid_counts), random distinct rows of
// a cache larger than L2 (rows ending " c8k": of its first 8192 rows, 9 MiB, which L2 holds:
// a rank's share of a 32k-token context at W = 4, and the short-context cases of FlashMLA's
// published sparse figures). Each kernel (sm90 = wgmma, sm80 = mma.sync) with the launcher's split
// choice, and the one-token decode at forced split counts. TF/s count the valid keys'
// 2 H (576 + 512) FLOPs, GB/s the gathered rows (576 x 2 bytes per valid key and token; 656
// for the sparse_mqa_sm90_fp8 rows: the same selections over the rows quantized to fp8_ds_mla).
absl::Status KernelBench::MeasureSparseMqaShapes() {
  Device& device = *env_.device;
  const BenchOptions& o = env_.options;
  if (!env_.on_gpu() || device.storage_dtype() != DType::kBF16) return absl::OkStatus();
  constexpr int kWidth = 576, kValue = 512, kTopk = 2048;
  constexpr int64_t kSlots = int64_t{1} << 17;  // 144 MiB of rows: beyond L2
  constexpr int64_t kResidentSlots = 8192;        // 9 MiB: held in L2
  struct Shape {
    int tokens, heads, keys;
    bool resident = false;  // indices into the first kResidentSlots rows only
  };
  const Shape shapes[] = {{1, 128, 2048},   {64, 128, 2048},   {1024, 128, 2048},
                          {4096, 128, 2048}, {1024, 128, 512}, {4096, 128, 512},
                          {1, 128, 512},     {64, 128, 512},   {1024, 16, 2048},
                          {1024, 32, 2048},  {1024, 64, 2048}, {4096, 16, 2048}};
  int max_tokens = 0;
  for (const Shape& shape : shapes) max_tokens = std::max(max_tokens, shape.tokens);
  Buffer q, cache, indices, resident_indices, counts, out, lse;
  const absl::Status prepared = [&]() -> absl::Status {
    // Token t's row: kTopk distinct slots (an odd stride through a power of two).
    auto rows_of = [&](int64_t slots) {
      std::vector<int32_t> host(size_t(max_tokens) * kTopk);
      for (int t = 0; t < max_tokens; ++t) {
        const int64_t start = (int64_t{t} * 7919) % slots, stride = 2 * ((t * 31) % 4096) + 1;
        for (int j = 0; j < kTopk; ++j) {
          host[size_t(t) * kTopk + j] = static_cast<int32_t>((start + j * stride) % slots);
        }
      }
      return host;
    };
    DCP_ASSIGN_OR_RETURN(indices, UploadInts(device, rows_of(kSlots)));
    DCP_ASSIGN_OR_RETURN(resident_indices, UploadInts(device, rows_of(kResidentSlots)));
    DCP_ASSIGN_OR_RETURN(counts, device.Allocate(size_t(max_tokens) * 4));
    DCP_ASSIGN_OR_RETURN(q, device.Allocate(size_t(max_tokens) * 128 * kWidth * 2));
    DCP_ASSIGN_OR_RETURN(cache, device.Allocate(size_t(kSlots) * kWidth * 2));
    DCP_ASSIGN_OR_RETURN(out, device.Allocate(size_t(max_tokens) * 128 * kValue * 4));
    DCP_ASSIGN_OR_RETURN(lse, device.Allocate(size_t(max_tokens) * 128 * 4));
    DCP_RETURN_IF_ERROR(FillRandom(device, q.data(), DType::kBF16,
                                   size_t(max_tokens) * 128 * kWidth, o.seed, kStreamA));
    return FillRandom(device, cache.data(), DType::kBF16, size_t(kSlots) * kWidth, o.seed,
                      kStreamB);
  }();
  // The same rows quantized to fp8_ds_mla (656 bytes a row): the sparse_mqa_sm90_fp8 rows run
  // the same selections over them (bf16 / fp8 ratios: scripts/sparse_mqa_device.sh).
  Buffer fp8_cache, all_slots;
  const absl::Status fp8_prepared = [&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(prepared);
    std::vector<int32_t> identity(kSlots);
    for (int64_t i = 0; i < kSlots; ++i) identity[i] = static_cast<int32_t>(i);
    DCP_ASSIGN_OR_RETURN(all_slots, UploadInts(device, identity));
    DCP_ASSIGN_OR_RETURN(fp8_cache, device.Allocate(size_t(kSlots) * fp8_ds_mla::kRowBytes));
    Fp8DsMlaWriteParams w;
    w.kv_c = cache.data();
    w.k_pe = static_cast<const std::byte*>(cache.data()) + size_t(kValue) * 2;
    w.slot_mapping = all_slots.as<int32_t>();
    w.cache = fp8_cache.as<uint8_t>();
    w.dtype = DType::kBF16;
    w.num_rows = w.num_slots = kSlots;
    w.kv_c_row_stride = w.k_pe_row_stride = kWidth;
    return WriteFp8DsMlaRowsOn(device, w);
  }();
  // `replays` > 0: that many launches replayed from one CUDA graph (MeasureReplayed; the row's
  // name ends in " x<replays>", time_us is theirs). `bf16_out`: the output rows in bf16
  // (SparseMqaParams::out_bf16, as the sparse route writes them where they feed the output
  // projection directly, and as FlashMLA's published figures do): kernel "sparse_mqa_sm90_obf16".
  auto run_shape = [&](const Shape& shape, int kernel, int splits, bool fp8 = false,
                       int block_heads = 0, int replays = 0, bool bf16_out = false) -> absl::Status {
    const std::string name =
        absl::StrCat("sparse_mqa_", kernel == 2 ? "sm90" : "sm80", fp8 ? "_fp8" : "",
                     bf16_out ? "_obf16" : "", " t",
                     shape.tokens, " h", shape.heads, " k", shape.keys,
                     splits > 0 ? absl::StrCat(" s", splits) : "",
                     block_heads > 0 ? absl::StrCat(" b", block_heads) : "",
                     replays > 0 ? absl::StrCat(" x", replays) : "", shape.resident ? " c8k" : "");
    const double keys = double(shape.tokens) * shape.keys * std::max(replays, 1);
    const double row_bytes = fp8 ? fp8_ds_mla::kRowBytes : kWidth * 2;
    KernelRow row{name, nullptr, shape.heads, static_cast<int64_t>(keys * row_bytes),
                  2.0 * shape.heads * (kWidth + kValue) * keys, keys * row_bytes};
    SparseMqaParams p;
    p.q = q.data(), p.kv_cache = cache.data();
    p.indices = (shape.resident ? resident_indices : indices).as<int32_t>();
    if (fp8) {
      p.kv_format = KvCacheDType::kFp8DsMla;
      p.kv_cache = fp8_cache.data();
    }
    p.valid_counts = counts.as<int32_t>();
    p.out = out.as<float>(), p.lse = lse.as<float>();
    if (bf16_out) p.out = nullptr, p.out_bf16 = out.data();
    p.dtype = DType::kBF16;
    p.num_tokens = shape.tokens, p.num_heads = shape.heads;
    p.head_dim = kWidth, p.v_dim = kValue, p.topk = kTopk, p.num_slots = kSlots;
    p.q_token_stride = int64_t{shape.heads} * kWidth, p.q_head_stride = kWidth;
    p.kv_row_stride = fp8 ? fp8_ds_mla::kRowBytes : kWidth, p.indices_token_stride = kTopk;
    p.out_token_stride = int64_t{shape.heads} * kValue, p.out_head_stride = kValue;
    p.lse_token_stride = shape.heads;
    p.scale = 0.1352f;
    p.kernel = kernel;
    p.num_splits = splits;
    p.block_heads = block_heads;
    p.expected_keys = shape.keys;  // as the sparse route plans a rank's share
    absl::Status ready = fp8 ? fp8_prepared : prepared;
    if (ready.ok()) {
      const std::vector<int32_t> host(shape.tokens, shape.keys);
      ready = device.CopyFromHost(counts.data(), host.data(), host.size() * 4);
    }
    if (replays > 0) {
      return MeasureReplayed(row, ready, replays, [&](int) { return device.SparseMqa(p); });
    }
    return Measure(row, ready, nullptr, [&] { return device.SparseMqa(p); }, nullptr);
  };
  for (const Shape& shape : shapes) {
    for (int kernel : {2, 1}) DCP_RETURN_IF_ERROR(run_shape(shape, kernel, 0));
    DCP_RETURN_IF_ERROR(run_shape(shape, 2, 0, /*fp8=*/true));
    if (shape.tokens >= 1024 && shape.heads == 128) {
      DCP_RETURN_IF_ERROR(run_shape(shape, 2, 0, /*fp8=*/false, 0, 0, /*bf16_out=*/true));
    }
  }
  for (int splits : {1, 4, 8, 16, 32}) {
    for (int kernel : {2, 1}) DCP_RETURN_IF_ERROR(run_shape({1, 128, 2048}, kernel, splits));
  }
  for (int splits : {1, 2, 4}) {
    DCP_RETURN_IF_ERROR(run_shape({64, 128, 2048}, 2, splits));
  }
  for (int splits : {8, 16, 32}) {
    DCP_RETURN_IF_ERROR(run_shape({1, 128, 2048}, 2, splits, /*fp8=*/true));
  }
  // Heads per CTA (the wgmma kernel's block_heads) against splits for a few decode tokens.
  for (int tokens : {1, 4, 16}) {
    for (int block_heads : {64, 32, 16}) {
      for (int splits : {2, 4, 8, 16, 32}) {
        if (int64_t{tokens} * (128 / block_heads) * splits > 4 * 132) continue;
        DCP_RETURN_IF_ERROR(
            run_shape({tokens, 128, 2048}, 2, splits, /*fp8=*/false, block_heads));
      }
      DCP_RETURN_IF_ERROR(run_shape({tokens, 128, 2048}, 2, 0, /*fp8=*/false, block_heads));
    }
  }
  // The decode shapes as a captured engine step runs them: 16 launches (the attention kernel
  // and, when it splits, the merge) replayed from one graph, so a row is GPU time without an
  // idle GPU's launch latency (the rows above include it: ~5-7 us). Per launch: time_us / 16.
  // With bf16 output too (_obf16: what a one-rank layer's kernel, or its split merge, writes).
  for (const Shape& shape : {Shape{1, 128, 2048}, Shape{64, 128, 2048}, Shape{1, 128, 512}}) {
    for (bool fp8 : {false, true}) {
      DCP_RETURN_IF_ERROR(run_shape(shape, 2, 0, fp8, /*block_heads=*/0, /*replays=*/16));
    }
    DCP_RETURN_IF_ERROR(run_shape(shape, 2, 0, /*fp8=*/false, 0, 16, /*bf16_out=*/true));
  }
  // The same kernels over rows that L2 holds (" c8k").
  for (const Shape& shape : {Shape{64, 128, 2048, true}, Shape{1024, 128, 2048, true},
                             Shape{4096, 128, 2048, true}, Shape{1024, 128, 512, true}}) {
    for (bool fp8 : {false, true}) {
      DCP_RETURN_IF_ERROR(run_shape(shape, 2, 0, fp8, 0, shape.tokens <= 64 ? 16 : 0));
    }
    if (shape.tokens >= 1024) {
      DCP_RETURN_IF_ERROR(run_shape(shape, 2, 0, /*fp8=*/false, 0, 0, /*bf16_out=*/true));
    }
  }
  return absl::OkStatus();
}

// The decode projections at 128 heads (DeepSeek-V3.2: Dn 128, R 512, Dv 128) with M rows per
// head, the small-M kernels (gemm_small_m.h: CUDA cores "small", tensor cores "tc") against cuBLAS
// in the same run: memory rows (bytes =
// weights + A + C), the weights rotated over enough copies to miss L2 (60 MB on the H200) as a
// model's 61 layers would, 16 launches per timed CUDA-graph replay (time_us is theirs: divide
// by 16). CUDA ranks with bf16 storage only.
absl::Status KernelBench::MeasureSmallMGemm() {
#if DCP_WITH_CUDA
  auto* cuda_device = dynamic_cast<CudaDevice*>(env_.device);
  if (cuda_device == nullptr || cuda_device->storage_dtype() != DType::kBF16) {
    return absl::OkStatus();
  }
  constexpr int kHeads = 128, kDn = 128, kR = 512, kDv = 128, kWidth = 576, kCopies = 8;
  constexpr int kMaxM = 64, kLaunches = 16;
  struct Shape {
    const char* name;
    int n, k;
    bool trans_b, bf16_out;
  };
  const Shape shapes[] = {{"absorb", kR, kDn, false, true},  // q_nope x w_uk[h] -> q'
                          {"out", kDv, kR, false, false},   // o_lat x w_uv[h] -> out (fp32)
                          {"up_k", kDn, kR, true, true}};   // kv_c x w_uk[h]^T -> k_nope
  const size_t weight_count = size_t(kHeads) * kDn * kR;  // every shape's weights: 16.8 MB
  Buffer weights, a, c;
  const absl::Status prepared = [&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(weights, env_.device->Allocate(weight_count * kCopies * 2));
    DCP_ASSIGN_OR_RETURN(a, env_.device->Allocate(size_t(kMaxM) * kHeads * kWidth * 2));
    DCP_ASSIGN_OR_RETURN(c, env_.device->Allocate(size_t(kMaxM) * kHeads * kWidth * 4));
    DCP_RETURN_IF_ERROR(FillRandom(*env_.device, weights.data(), DType::kBF16,
                                   weight_count * kCopies, env_.options.seed, kStreamB, 0.05f));
    return FillRandom(*env_.device, a.data(), DType::kBF16, size_t(kMaxM) * kHeads * kWidth,
                      env_.options.seed, kStreamA);
  }();
  for (const Shape& shape : shapes) {
    for (int m : {1, 2, 4, 8, 16, 32, 64}) {
      GemmParams p;
      p.a = a.data(), p.c = c.data();
      p.a_dtype = p.b_dtype = DType::kBF16;
      p.c_dtype = shape.bf16_out ? DType::kBF16 : DType::kF32;
      p.trans_b = shape.trans_b;
      p.m = m, p.n = shape.n, p.k = shape.k, p.batch = kHeads;
      p.lda = shape.trans_b ? kWidth : int64_t{kHeads} * shape.k;
      p.stride_a = shape.trans_b ? 0 : shape.k;
      p.ldb = shape.trans_b ? shape.k : shape.n;
      p.stride_b = int64_t{shape.n} * shape.k;
      p.ldc = int64_t{kHeads} * (shape.trans_b ? kDn + 64 : shape.n);
      p.stride_c = shape.trans_b ? kDn + 64 : shape.n;
      const double bytes = double(weight_count) * 2 +
                           double(m) * (shape.trans_b ? 1 : kHeads) * shape.k * 2 +
                           double(m) * kHeads * shape.n * (shape.bf16_out ? 2 : 4);
      // "_hot": one copy of the weights, L2-resident after the first run (a benchmark that
      // repeats one layer's weights, as dcp_bench --mode engine does), at M = 1 only.
      for (int copies : {kCopies, 1}) {
        for (const char* kernel : {"small", "tc", "cublas"}) {
          const std::string_view which = kernel;
          p.b = weights.data();
          if ((which == "small" && !cuda::SmallMGemmFits(p)) ||
              (which == "tc" && !cuda::SmallMTcGemmFits(p)) || (copies == 1 && m > 1)) {
            continue;
          }
          const KernelRow row{
              absl::StrCat("gemm_", shape.name, "_m", m, "_", kernel,
                           copies == 1 ? "_hot" : "", "_x", kLaunches),
              nullptr, kHeads, int64_t(weight_count) * 2, 0, bytes * kLaunches};
          // Replayed from a graph: an eager launch per timed step would add the host's launch
          // latency, which is most of a 4-us kernel and all of cuBLAS's call overhead.
          cudaStream_t stream = cuda_device->stream();
          DCP_RETURN_IF_ERROR(MeasureReplayed(row, prepared, kLaunches, [&](int launch) {
            p.b = static_cast<const std::byte*>(weights.data()) +
                  weight_count * 2 * (launch % copies);
            return which == "small" ? cuda::GemmSmallM(p, stream)
                   : which == "tc"  ? cuda::GemmSmallMTc(p, stream)
                                    : cuda::GemmCublas(cuda_device->cublas(), p, stream);
          }));
        }
      }
    }
  }
#endif
  return absl::OkStatus();
}

absl::Status KernelBench::MeasureSweep(int64_t size) {
  return ForEachSweepKernel(env_, size, [&](const KernelCase& c) {
    KernelRow row{c.kernel, nullptr, 0, c.size_bytes, 0, c.bytes};
    return Measure(row, c.prepared, c.setup, c.run, c.check);
  });
}

absl::StatusOr<ModeResult> RunKernels(BenchEnv& env) {
  const BenchOptions& o = env.options;
  std::vector<BatchShape> shapes;
  for (const std::string& spec : o.batches.empty() ? DefaultKernelBatches() : o.batches) {
    DCP_ASSIGN_OR_RETURN(BatchShape shape, ParseShape(spec));
    shapes.push_back(std::move(shape));
  }
  KernelBench bench(env);
  DCP_RETURN_IF_ERROR(bench.Start());
  DCP_RETURN_IF_ERROR(bench.MeasureCeilings());
  DCP_RETURN_IF_ERROR(bench.MeasureSparseMqaShapes());
  DCP_RETURN_IF_ERROR(bench.MeasureSmallMGemm());
  for (const BatchShape& shape : shapes) {
    if (shape.num_tokens > o.max_tokens) continue;
    for (int heads : o.heads) DCP_RETURN_IF_ERROR(bench.MeasureAttention(shape, heads));
  }
  for (int64_t size : SweepSizes(o, 4096)) DCP_RETURN_IF_ERROR(bench.MeasureSweep(size));
  return bench.Finish();
}

}  // namespace dcp::bench
