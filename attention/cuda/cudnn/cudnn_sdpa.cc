// CudnnSdpa (cudnn_sdpa.h): graph construction, the graph cache and the launch. Compiled with
// the cuDNN frontend headers when CMake found them (DCP_WITH_CUDNN_FRONTEND), as a stub that
// reports why not otherwise.
#include "attention/cuda/cudnn/cudnn_sdpa.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/environment.h"
#include "core/status.h"

#if DCP_WITH_CUDNN_FRONTEND

#include <dlfcn.h>

#include <exception>
#include <limits>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "attention/cuda/cudnn/sdpa_glue.h"
#include "cudnn_frontend.h"
#include "core/cuda/cuda_status.h"
#include "core/logging.h"

// The frontend's dynamic loading resolves every cuDNN call through this handle.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace dcp::cuda {
namespace fe = cudnn_frontend;

namespace {

enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kSeqQ, kSeqK, kQOffsets, kKOffsets, kVOffsets, kOOffsets,
  kStatsOffsets, kScale,
};

// Graph buckets: batch a power of two >= 4, lengths a power of two >= 256. Coarse on purpose:
// a graph serves every smaller batch and length (padding mask; cuDNN's CTAs past a sequence
// exit at once), and each build costs tens to hundreds of milliseconds.
constexpr int kMinBatchBucket = 4;
constexpr int kMinLengthBucket = 256;

// Power of two >= n, at least `floor`: a few graphs cover every batch.
int Bucket(int n, int floor) {
  int b = floor;
  while (b < n) b *= 2;
  return b;
}

int64_t Align(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// Loads libcudnn.so.9 once per process (DCP_CUDNN_LIBRARY names another file, e.g. to test
// the absent case); the error says what the loader said.
absl::Status LoadCudnn() {
  static const absl::Status loaded = []() -> absl::Status {
    const char* override_name = std::getenv("DCP_CUDNN_LIBRARY");
    std::vector<std::string> names;
    if (override_name != nullptr && *override_name != '\0') {
      names.push_back(override_name);
    } else {
      names = {"libcudnn.so.9", "libcudnn.so"};
    }
    std::string errors;
    for (const std::string& name : names) {
      void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle != nullptr) {
        fe::cudnn_dlhandle = handle;
        return absl::OkStatus();
      }
      const char* error = dlerror();
      errors += (errors.empty() ? "" : "; ") + std::string(error != nullptr ? error : name);
    }
    return DCP_ERROR(Unavailable, "cuDNN could not be loaded (%s)", errors);
  }();
  return loaded;
}

struct Graph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

// How a graph lays out its batch.
struct GraphForm {
  // Every sequence has the same (power-of-two) lengths: plain strided [b, h, s, d] tensors, no
  // ragged offsets, no padding mask (torch's configuration of the same call). Else ragged THD
  // with per-sequence lengths and the padding mask.
  bool uniform = false;
};

// Everything a graph depends on. Lengths and batch are bucketed (exact for uniform graphs); the
// rest is exact (the softmax scale is an input, not part of the graph).
using GraphKey = std::tuple<int, int, int, bool, int64_t, int64_t, int64_t, int64_t, int64_t,
                            int64_t, int, int, int, bool>;

bool PowerOfTwo(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

}  // namespace

struct CudnnSdpa::Impl {
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  size_t backend_version = 0;
  std::map<GraphKey, Graph> graphs;
  // Keys whose graph could not be built, with the reason: not rebuilt at every call (a build
  // that fails costs as much as one that succeeds).
  std::map<GraphKey, absl::Status> declined;
  void* scratch = nullptr;
  size_t scratch_bytes = 0;

  ~Impl() {
    if (scratch != nullptr) cudaFree(scratch);
    if (handle != nullptr) fe::detail::destroy_handle(handle);
  }

  absl::Status Reserve(size_t bytes) {
    if (bytes <= scratch_bytes) return absl::OkStatus();
    if (scratch != nullptr) {
      DCP_CUDA_CHECK(cudaFree(scratch));  // waits for launches still reading it
      scratch = nullptr;
      scratch_bytes = 0;
    }
    bytes = std::max(bytes, size_t{1} << 20);
    DCP_CUDA_CHECK(cudaMalloc(&scratch, bytes));
    scratch_bytes = bytes;
    return absl::OkStatus();
  }

  absl::StatusOr<const Graph*> GetGraph(const DenseMhaParams& p, int batch, int max_q,
                                        int max_k, const GraphForm& form);
  // DCP_CUDNN_SDPA_RAGGED=1: every batch through ragged graphs (measures the uniform form).
  bool ragged_only = false;
};

absl::StatusOr<const Graph*> CudnnSdpa::Impl::GetGraph(const DenseMhaParams& p, int batch,
                                                        int max_q, int max_k,
                                                        const GraphForm& form) {
  const GraphKey key{p.num_heads,      p.qk_dim,         p.v_dim,          p.causal,
                     p.q_token_stride, p.q_head_stride,  p.k_token_stride, p.k_head_stride,
                     p.v_token_stride, p.v_head_stride,  batch,            max_q,
                     max_k,            form.uniform};
  if (auto it = graphs.find(key); it != graphs.end()) return &it->second;
  if (auto it = declined.find(key); it != declined.end()) return it->second;

  const int64_t b = batch, h = p.num_heads, sq = max_q, skv = max_k, dqk = p.qk_dim,
                dv = p.v_dim;
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto index = [&](const char* name, int64_t uid, int64_t n) {
    return graph->tensor(fe::graph::Tensor_attributes()
                             .set_name(name)
                             .set_uid(uid)
                             .set_dim({n, 1, 1, 1})
                             .set_stride({1, 1, 1, 1})
                             .set_data_type(fe::DataType_t::INT32));
  };
  std::shared_ptr<fe::graph::Tensor_attributes> seq_q, seq_k, q_offsets, k_offsets, v_offsets,
      o_offsets, stats_offsets;
  if (!form.uniform) {
    seq_q = index("seq_q", kSeqQ, b);
    seq_k = index("seq_k", kSeqK, b);
    q_offsets = index("q_offsets", kQOffsets, b + 1);
    k_offsets = index("k_offsets", kKOffsets, b + 1);
    v_offsets = index("v_offsets", kVOffsets, b + 1);
    o_offsets = index("o_offsets", kOOffsets, b + 1);
    stats_offsets = index("stats_offsets", kStatsOffsets, b + 1);
  }
  // [b, h, s, d] views of the packed [tokens, h, d] tensors. Ragged: sequence b starts at its
  // ragged offset (elements), so the batch stride is never used for addressing. Uniform:
  // sequence b starts at token b * s, which the batch stride says.
  auto view = [&](const char* name, int64_t uid, int64_t s, int64_t d, int64_t token_stride,
                  int64_t head_stride, std::shared_ptr<fe::graph::Tensor_attributes> offsets) {
    auto t = graph->tensor(fe::graph::Tensor_attributes()
                               .set_name(name)
                               .set_uid(uid)
                               .set_dim({b, h, s, d})
                               .set_stride({s * token_stride, head_stride, token_stride, 1}));
    if (!form.uniform) t->set_ragged_offset(offsets);
    return t;
  };
  auto q = view("Q", kQ, sq, dqk, p.q_token_stride, p.q_head_stride, q_offsets);
  auto k = view("K", kK, skv, dqk, p.k_token_stride, p.k_head_stride, k_offsets);
  auto v = view("V", kV, skv, dv, p.v_token_stride, p.v_head_stride, v_offsets);
  auto scale = graph->tensor(fe::graph::Tensor_attributes()
                                 .set_name("attn_scale")
                                 .set_uid(kScale)
                                 .set_dim({1, 1, 1, 1})
                                 .set_stride({1, 1, 1, 1})
                                 .set_is_pass_by_value(true)
                                 .set_data_type(fe::DataType_t::FLOAT));
  auto options = fe::graph::SDPA_attributes()
                     .set_name("dcp_dense_mha")
                     .set_generate_stats(true)
                     .set_attn_scale(scale);
  if (!form.uniform) {
    options.set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_k);
  }
  if (p.causal) {
    // Uniform with as many queries as keys: the top-left diagonal is the bottom-right one.
    if (form.uniform && sq == skv) {
      options.set_causal_mask(true);
    } else {
      options.set_causal_mask_bottom_right(true);
    }
  }
  auto [o, stats] = graph->sdpa(q, k, v, options);
  o->set_output(true)
      .set_uid(kO)
      .set_dim({b, h, sq, dv})
      .set_stride({sq * h * dv, dv, h * dv, 1});
  stats->set_output(true)
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({b, h, sq, 1})
      .set_stride({sq * h, 1, h, 1});
  if (!form.uniform) {
    o->set_ragged_offset(o_offsets);
    stats->set_ragged_offset(stats_offsets);
  }

  auto fail = [&](const char* step, fe::error_t error) {
    absl::Status status = DCP_ERROR(
        Unimplemented,
        "cuDNN SDPA graph (heads %d, qk %d, v %d, %s, batch %d, s_q %d, s_kv %d, %s) failed at "
        "%s: %s",
        p.num_heads, p.qk_dim, p.v_dim, p.causal ? "causal" : "non-causal", batch, max_q, max_k,
        form.uniform ? "uniform" : "ragged", step, error.get_message());
    declined.emplace(key, status);
    return status;
  };
  if (auto e = graph->validate(); !e.is_good()) return fail("validate", e);
  if (auto e = graph->build_operation_graph(handle); !e.is_good()) {
    return fail("build_operation_graph", e);
  }
  if (auto e = graph->create_execution_plans({fe::HeurMode_t::A}); !e.is_good()) {
    return fail("create_execution_plans", e);
  }
  if (auto e = graph->check_support(handle); !e.is_good()) return fail("check_support", e);
  if (auto e = graph->build_plans(handle); !e.is_good()) return fail("build_plans", e);
  Graph built;
  built.graph = graph;
  if (auto e = graph->get_workspace_size(built.workspace_bytes); !e.is_good()) {
    return fail("get_workspace_size", e);
  }
  DCP_LOG(INFO) << "cuDNN SDPA graph built: heads " << p.num_heads << ", qk " << p.qk_dim
                << ", v " << p.v_dim << (p.causal ? ", causal" : ", non-causal") << ", batch "
                << batch << ", s_q " << max_q << ", s_kv " << max_k
                << (form.uniform ? ", uniform" : ", ragged") << ", workspace "
                << built.workspace_bytes << " B";
  return &graphs.emplace(key, std::move(built)).first->second;
}

CudnnSdpa::CudnnSdpa(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnSdpa::~CudnnSdpa() = default;

absl::Status CudnnSdpa::SetStream(cudaStream_t stream) {
  if (stream == impl_->stream) return absl::OkStatus();
  if (const cudnnStatus_t s = fe::detail::set_stream(impl_->handle, stream);
      s != CUDNN_STATUS_SUCCESS) {
    return DCP_ERROR(Internal, "cudnnSetStream failed (status %d)", static_cast<int>(s));
  }
  impl_->stream = stream;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudnnSdpa>> CudnnSdpa::Create(cudaStream_t stream) {
  DCP_RETURN_IF_ERROR(LoadCudnn());
  auto impl = std::make_unique<Impl>();
  try {
    impl->backend_version = fe::detail::get_backend_version();
    // 9.6 has ragged bottom-right causal SDPA; the uniform graphs' Stats at the layout the
    // caller's lse rows need (not packed BHSD) is honoured from 9.12 on (the frontend refuses
    // it below, at every uniform batch's graph).
    if (impl->backend_version < 91200) {
      return DCP_ERROR(Unavailable,
                       "cuDNN %d.%d.%d is too old: dcp's SDPA graphs need cuDNN >= 9.12",
                       impl->backend_version / 10000, impl->backend_version / 100 % 100,
                       impl->backend_version % 100);
    }
    if (const cudnnStatus_t s = fe::detail::create_handle(&impl->handle);
        s != CUDNN_STATUS_SUCCESS) {
      impl->handle = nullptr;
      return DCP_ERROR(Unavailable, "cudnnCreate failed (status %d)", static_cast<int>(s));
    }
    if (const cudnnStatus_t s = fe::detail::set_stream(impl->handle, stream);
        s != CUDNN_STATUS_SUCCESS) {
      return DCP_ERROR(Internal, "cudnnSetStream failed (status %d)", static_cast<int>(s));
    }
  } catch (const std::exception& e) {
    return DCP_ERROR(Unavailable, "cuDNN could not be initialised: %s", e.what());
  }
  impl->stream = stream;
  impl->ragged_only = EnvSwitch("DCP_CUDNN_SDPA_RAGGED", false);
  return std::unique_ptr<CudnnSdpa>(new CudnnSdpa(std::move(impl)));
}

std::string CudnnSdpa::version() const {
  const size_t v = impl_->backend_version;
  return absl::StrFormat("cuDNN %d.%d.%d (frontend %d.%d.%d)", v / 10000, v / 100 % 100, v % 100,
                         CUDNN_FRONTEND_MAJOR_VERSION, CUDNN_FRONTEND_MINOR_VERSION,
                         CUDNN_FRONTEND_PATCH_VERSION);
}

int CudnnSdpa::num_graphs() const { return static_cast<int>(impl_->graphs.size()); }
size_t CudnnSdpa::scratch_bytes() const { return impl_->scratch_bytes; }

absl::Status CudnnSdpa::Supports(int num_heads, int qk_dim, int v_dim) {
  DenseMhaParams p;
  p.dtype = DType::kBF16;
  p.num_heads = num_heads;
  p.qk_dim = qk_dim;
  p.v_dim = v_dim;
  p.q_token_stride = p.k_token_stride = int64_t{num_heads} * qk_dim;
  p.q_head_stride = p.k_head_stride = qk_dim;
  p.v_token_stride = int64_t{num_heads} * v_dim;
  p.v_head_stride = v_dim;
  p.scale = 1.0f;
  const GraphForm form;  // ragged
  try {
    for (const bool causal : {true, false}) {
      p.causal = causal;
      DCP_RETURN_IF_ERROR(
          impl_->GetGraph(p, kMinBatchBucket, kMinLengthBucket, kMinLengthBucket, form).status());
    }
  } catch (const std::exception& e) {
    return DCP_ERROR(Unavailable, "cuDNN SDPA check failed: %s", e.what());
  }
  return absl::OkStatus();
}

// Everything a call decides before enqueueing: the checks, the graph's form and buckets, the
// graph itself (built and cached on first sight). graph is null when there is nothing to run.
struct CudnnSdpa::Shape {
  int max_q = 0, max_k = 0, batch = 0;
  int64_t total_q = 0;
  GraphForm form;
  const Graph* graph = nullptr;
};

absl::StatusOr<CudnnSdpa::Shape> CudnnSdpa::Analyze(const CudnnSdpaParams& params,
                                                    bool need_pointers) {
  Shape shape;
  const DenseMhaParams& p = params.mha;
  DCP_CHECK_ARG(p.dtype == DType::kBF16, "DenseMha (cuDNN): dtype must be BF16, got %s",
                dtype_name(p.dtype));
  DCP_CHECK_ARG(p.out_dtype == DType::kF32 || p.out_dtype == DType::kBF16,
                "DenseMha (cuDNN): out dtype must be F32 or BF16, got %s",
                dtype_name(p.out_dtype));
  DCP_CHECK_ARG(p.num_seqs >= 0 && p.num_heads >= 0, "DenseMha (cuDNN): negative size");
  if (p.num_seqs == 0 || p.num_heads == 0) return shape;
  DCP_CHECK_ARG(params.host_cu_seqlens_q != nullptr && params.host_cu_seqlens_k != nullptr,
                "DenseMha (cuDNN): host copies of cu_seqlens are required");
  DCP_CHECK_ARG(
      !need_pointers || (p.cu_seqlens_q != nullptr && p.cu_seqlens_k != nullptr && p.q != nullptr &&
                         p.k != nullptr && p.v != nullptr && p.out != nullptr),
      "DenseMha (cuDNN): null pointer among q, k, v, out, cu_seqlens");
  const int32_t* cu_q = params.host_cu_seqlens_q;
  const int32_t* cu_k = params.host_cu_seqlens_k;
  int max_q = 0, max_k = 0;
  for (int s = 0; s < p.num_seqs; ++s) {
    const int lq = cu_q[s + 1] - cu_q[s], lk = cu_k[s + 1] - cu_k[s];
    DCP_CHECK_ARG(lq >= 0 && lk >= 0, "DenseMha (cuDNN): sequence %d has a negative length", s);
    max_q = std::max(max_q, lq);
    max_k = std::max(max_k, lk);
  }
  const int64_t total_q = cu_q[p.num_seqs] - cu_q[0], total_k = cu_k[p.num_seqs] - cu_k[0];
  if (total_q == 0) return shape;
  const int64_t h = p.num_heads, dv = p.v_dim;
  // Ragged offsets are int32 element counts (Unimplemented: auto runs such a shape natively).
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (total_q * std::max<int64_t>({p.q_token_stride, h * dv}) >= kMax ||
      total_k * std::max(p.k_token_stride, p.v_token_stride) >= kMax) {
    return DCP_ERROR(Unimplemented,
                     "DenseMha (cuDNN): %d queries / %d keys exceed cuDNN's int32 ragged offsets",
                     total_q, total_k);
  }

  // The graph's form. Uniform: every sequence has the same power-of-two lengths (a few graphs
  // cover them, as the buckets do) and every query sees a key: plain strided tensors, no
  // ragged offsets, no padding mask, no index kernel.
  GraphForm form;
  form.uniform = !impl_->ragged_only && PowerOfTwo(p.num_seqs) && PowerOfTwo(max_q) &&
                 PowerOfTwo(max_k) && max_q >= 64 && max_k >= 64 && (!p.causal || max_q <= max_k);
  for (int s = 0; s < p.num_seqs && form.uniform; ++s) {
    form.uniform = cu_q[s + 1] - cu_q[s] == max_q && cu_k[s + 1] - cu_k[s] == max_k;
  }
  const int batch = form.uniform ? p.num_seqs : Bucket(p.num_seqs, kMinBatchBucket);
  // cuDNN's SDPA kernels put the batch in a grid dimension that may hold 65535: a larger
  // (padded) batch is declined (Unimplemented: auto runs it natively, which splits it over
  // launches).
  if (batch > 65535) {
    return DCP_ERROR(Unimplemented,
                     "DenseMha (cuDNN): %d sequences (a batch of %d), at most 65535 a launch",
                     p.num_seqs, batch);
  }
  const int bucket_q = form.uniform ? max_q : Bucket(max_q, kMinLengthBucket);
  const int bucket_k = form.uniform ? max_k : Bucket(max_k, kMinLengthBucket);
  try {
    DCP_ASSIGN_OR_RETURN(shape.graph, impl_->GetGraph(p, batch, bucket_q, bucket_k, form));
  } catch (const std::exception& e) {
    return DCP_ERROR(Internal, "cuDNN SDPA graph build threw: %s", e.what());
  }
  shape.max_q = max_q;
  shape.max_k = max_k;
  shape.batch = batch;
  shape.total_q = total_q;
  shape.form = form;
  return shape;
}

// Scratch of a call: index arrays (ragged) | O bf16 [total_q, h, dv] | Stats fp32 [total_q, h] |
// workspace; `direct` (O is the caller's out) and `direct_lse` (Stats is the caller's lse)
// leave parts out.
struct CudnnSdpa::ScratchLayout {
  int64_t index_bytes = 0, o_bytes = 0, stats_bytes = 0, workspace_bytes = 0;
  int64_t total() const { return index_bytes + o_bytes + stats_bytes + workspace_bytes; }
};

CudnnSdpa::ScratchLayout CudnnSdpa::Scratch(const Shape& shape, int num_heads, int v_dim,
                                            bool direct, bool direct_lse) {
  const int64_t h = num_heads, dv = v_dim;
  ScratchLayout layout;
  layout.index_bytes = shape.form.uniform ? 0 : Align(int64_t{7} * (shape.batch + 1) * 4);
  layout.o_bytes = direct ? 0 : Align(shape.total_q * h * dv * 2);
  layout.stats_bytes = direct_lse ? 0 : Align(shape.total_q * h * 4);
  layout.workspace_bytes = Align(shape.graph->workspace_bytes);
  return layout;
}

absl::Status CudnnSdpa::Prepare(const CudnnSdpaParams& params) {
  DCP_ASSIGN_OR_RETURN(const Shape shape, Analyze(params, /*need_pointers=*/false));
  if (shape.graph == nullptr) return absl::OkStatus();
  // The most a call of this shape can use (not direct: that depends on the pointers).
  return impl_->Reserve(
      size_t(Scratch(shape, params.mha.num_heads, params.mha.v_dim, false, false).total()));
}

absl::Status CudnnSdpa::Run(const CudnnSdpaParams& params) {
  DCP_ASSIGN_OR_RETURN(const Shape shape, Analyze(params, /*need_pointers=*/true));
  if (shape.graph == nullptr) return absl::OkStatus();
  const DenseMhaParams& p = params.mha;
  const int32_t* cu_q = params.host_cu_seqlens_q;
  const int32_t* cu_k = params.host_cu_seqlens_k;
  const int max_k = shape.max_k, batch = shape.batch;
  const int64_t total_q = shape.total_q, h = p.num_heads, dv = p.v_dim;
  const GraphForm form = shape.form;
  const Graph* graph = shape.graph;

  // Direct: cuDNN writes the caller's bf16 out and lse itself, no finish pass (at 2 x 2k tokens
  // and 128 heads the pass moved ~400 MB, ~100 us). That needs the packed [T, H, v_dim] out
  // and [T, H] lse of cuDNN's O and Stats, and a uniform graph in which every query sees a key
  // (the finish writes 0 / -inf for one that does not, which cuDNN leaves undefined).
  const auto* out_base = static_cast<std::byte*>(p.out) +
                         int64_t{cu_q[0]} * p.out_token_stride * dtype_size(p.out_dtype);
  float* lse_base = p.lse != nullptr ? p.lse + int64_t{cu_q[0]} * p.lse_token_stride : nullptr;
  const bool direct = p.out_dtype == DType::kBF16 && form.uniform && max_k > 0 &&
                      p.out_token_stride == h * dv && p.out_head_stride == dv &&
                      reinterpret_cast<uintptr_t>(out_base) % 16 == 0 &&
                      (p.lse == nullptr || (p.lse_token_stride == h &&
                                            reinterpret_cast<uintptr_t>(lse_base) % 16 == 0));

  // Scratch (direct: O and, with an lse, Stats are the caller's). Prepare has reserved it for
  // the shape when the caller planned it; else it grows here.
  const ScratchLayout scratch =
      Scratch(shape, p.num_heads, p.v_dim, direct, direct && lse_base != nullptr);
  const int64_t index_bytes = scratch.index_bytes, o_bytes = scratch.o_bytes,
                stats_bytes = scratch.stats_bytes;
  DCP_RETURN_IF_ERROR(impl_->Reserve(size_t(scratch.total())));
  auto* base = static_cast<std::byte*>(impl_->scratch);
  auto* index = reinterpret_cast<int32_t*>(base);
  auto* o = direct ? reinterpret_cast<__nv_bfloat16*>(const_cast<std::byte*>(out_base))
                   : reinterpret_cast<__nv_bfloat16*>(base + index_bytes);
  auto* stats = stats_bytes == 0 ? lse_base
                                 : reinterpret_cast<float*>(base + index_bytes + o_bytes);
  void* workspace = base + index_bytes + o_bytes + stats_bytes;

  // Base pointers at token cu_seqlens[0] (the offsets count from there).
  const auto* q = static_cast<const __nv_bfloat16*>(p.q) + int64_t{cu_q[0]} * p.q_token_stride;
  const auto* k = static_cast<const __nv_bfloat16*>(p.k) + int64_t{cu_k[0]} * p.k_token_stride;
  const auto* v = static_cast<const __nv_bfloat16*>(p.v) + int64_t{cu_k[0]} * p.v_token_stride;
  float scale = p.scale;  // pass-by-value: read during execute
  std::unordered_map<int64_t, void*> pack = {
      {kQ, const_cast<__nv_bfloat16*>(q)},
      {kK, const_cast<__nv_bfloat16*>(k)},
      {kV, const_cast<__nv_bfloat16*>(v)},
      {kO, o},
      {kStats, stats},
      {kScale, &scale},
  };
  if (!form.uniform) {
    SdpaIndexParams ip;
    ip.cu_seqlens_q = p.cu_seqlens_q;
    ip.cu_seqlens_k = p.cu_seqlens_k;
    ip.num_seqs = p.num_seqs;
    ip.padded_seqs = batch;
    ip.q_token_stride = p.q_token_stride;
    ip.k_token_stride = p.k_token_stride;
    ip.v_token_stride = p.v_token_stride;
    ip.o_token_stride = h * dv;
    ip.stats_token_stride = h;
    ip.seq_len_q = index;
    ip.seq_len_k = index + batch;
    ip.q_offsets = index + 2 * batch;
    ip.k_offsets = ip.q_offsets + (batch + 1);
    ip.v_offsets = ip.k_offsets + (batch + 1);
    ip.o_offsets = ip.v_offsets + (batch + 1);
    ip.stats_offsets = ip.o_offsets + (batch + 1);
    DCP_RETURN_IF_ERROR(LaunchSdpaIndex(ip, impl_->stream));
    pack.insert({{kSeqQ, ip.seq_len_q},
                 {kSeqK, ip.seq_len_k},
                 {kQOffsets, ip.q_offsets},
                 {kKOffsets, ip.k_offsets},
                 {kVOffsets, ip.v_offsets},
                 {kOOffsets, ip.o_offsets},
                 {kStatsOffsets, ip.stats_offsets}});
  }
  try {
    if (auto e = graph->graph->execute(impl_->handle, pack, workspace); !e.is_good()) {
      return DCP_ERROR(Internal, "cuDNN SDPA execute failed: %s", e.get_message());
    }
  } catch (const std::exception& e) {
    return DCP_ERROR(Internal, "cuDNN SDPA execute threw: %s", e.what());
  }

  if (direct) return absl::OkStatus();

  SdpaFinishParams fp;
  fp.o = o;
  fp.stats = stats;
  fp.cu_seqlens_q = p.cu_seqlens_q;
  fp.cu_seqlens_k = p.cu_seqlens_k;
  fp.num_seqs = p.num_seqs;
  fp.num_heads = p.num_heads;
  fp.v_dim = p.v_dim;
  fp.total_q = total_q;
  fp.first_q = cu_q[0];
  fp.out = const_cast<std::byte*>(out_base);
  fp.out_dtype = p.out_dtype;
  fp.out_token_stride = p.out_token_stride;
  fp.out_head_stride = p.out_head_stride;
  fp.lse = lse_base;
  fp.lse_token_stride = p.lse_token_stride;
  fp.causal = p.causal;
  return LaunchSdpaFinish(fp, impl_->stream);
}

}  // namespace dcp::cuda

#else  // !DCP_WITH_CUDNN_FRONTEND

namespace dcp::cuda {

struct CudnnSdpa::Impl {};

CudnnSdpa::CudnnSdpa(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnSdpa::~CudnnSdpa() = default;

absl::StatusOr<std::unique_ptr<CudnnSdpa>> CudnnSdpa::Create(cudaStream_t) {
  return DCP_ERROR(Unimplemented,
                   "dcp was built without the cuDNN frontend headers (run scripts/setup.sh, or "
                   "set DCP_CUDNN_FRONTEND_INCLUDE_DIR, and reconfigure)");
}
absl::Status CudnnSdpa::SetStream(cudaStream_t) {
  return DCP_ERROR(Unimplemented, "dcp was built without the cuDNN frontend headers");
}
absl::Status CudnnSdpa::Supports(int, int, int) {
  return DCP_ERROR(Unimplemented, "dcp was built without the cuDNN frontend headers");
}
absl::Status CudnnSdpa::Prepare(const CudnnSdpaParams&) {
  return DCP_ERROR(Unimplemented, "dcp was built without the cuDNN frontend headers");
}
absl::Status CudnnSdpa::Run(const CudnnSdpaParams&) {
  return DCP_ERROR(Unimplemented, "dcp was built without the cuDNN frontend headers");
}
std::string CudnnSdpa::version() const { return "none"; }
int CudnnSdpa::num_graphs() const { return 0; }
size_t CudnnSdpa::scratch_bytes() const { return 0; }

}  // namespace dcp::cuda

#endif  // DCP_WITH_CUDNN_FRONTEND
