#include "attention/cuda/gemm_tuner.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <random>
#include <string_view>
#include <utility>
#include <vector>

#include "attention/cuda/cublas_status.h"
#include "attention/cuda/gemm_cublas.h"
#include "core/cuda/cuda_status.h"
#include "core/environment.h"

namespace dcp::cuda {
namespace {

constexpr int64_t kMinAlignment = 16;  // bytes: base pointers and batch strides (TMA's rule)
constexpr int64_t kMaxAlignment = 256;  // cudaMalloc's; cuBLASLt asks no more

// The alignment every batch entry of an operand has: the largest power of two <= 256 dividing
// its base address and its batch stride in bytes.
int64_t AlignmentOf(const void* pointer, int64_t stride_bytes) {
  const uint64_t bits = (reinterpret_cast<uintptr_t>(pointer) | uint64_t(stride_bytes)) %
                        uint64_t(kMaxAlignment);
  return bits == 0 ? kMaxAlignment : int64_t(bits & (~bits + 1));
}

// Elements a row-major operand spans over the batch: rows x cols with leading dimension ld.
int64_t Span(int batch, int64_t stride, int64_t rows, int64_t cols, int64_t ld) {
  if (rows == 0 || cols == 0) return 0;
  return int64_t(batch - 1) * stride + (rows - 1) * ld + cols;
}

struct Operands {
  int64_t a = 0, b = 0, c = 0;  // bytes
  int64_t total() const { return a + b + c; }
};

Operands OperandBytes(const GemmParams& p) {
  Operands o;
  const auto size = [](DType d) { return int64_t(dtype_size(d)); };
  o.a = Span(p.batch, p.stride_a, p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k, p.lda) *
        size(p.a_dtype);
  o.b = Span(p.batch, p.stride_b, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, p.ldb) *
        size(p.b_dtype);
  o.c = Span(p.batch, p.stride_c, p.m, p.n, p.ldc) * size(p.c_dtype);
  return o;
}

struct Alignments {
  int64_t a, b, c;
};

Alignments AlignmentsOf(const GemmParams& p) {
  return {AlignmentOf(p.a, p.stride_a * int64_t(dtype_size(p.a_dtype))),
          AlignmentOf(p.b, p.stride_b * int64_t(dtype_size(p.b_dtype))),
          AlignmentOf(p.c, p.stride_c * int64_t(dtype_size(p.c_dtype)))};
}

// The events and the device memory of one tuning pass, released on every path.
struct TuningScratch {
  cudaEvent_t start = nullptr, stop = nullptr;
  std::vector<void*> buffers;
  ~TuningScratch() {
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
    for (void* b : buffers) cudaFree(b);
  }
  // Device memory of `bytes` at `offset` bytes past a 256-byte boundary (the operand's
  // alignment class), filled with random values in [-1, 1) of `dtype` (tensor cores draw more
  // power, and may run slower, on random data than on a constant).
  absl::StatusOr<void*> Operand(int64_t bytes, int64_t offset, DType dtype, uint64_t seed,
                                cudaStream_t stream) {
    void* base = nullptr;
    const int64_t total = bytes + offset;
    const cudaError_t allocated = cudaMalloc(&base, size_t(total));
    if (allocated == cudaErrorMemoryAllocation) {  // the caller keeps the default
      cudaGetLastError();
      return nullptr;
    }
    DCP_CUDA_CHECK(allocated);
    buffers.push_back(base);
    // One MiB of random values from the host, doubled on the device until the buffer is full.
    const int64_t pattern = std::min<int64_t>(total, int64_t{1} << 20);
    std::vector<uint8_t> host(size_t(pattern) + 4);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> value(-1.f, 1.f);
    for (int64_t at = 0; at < pattern; at += int64_t(dtype_size(dtype))) {
      const float x = value(rng);
      uint32_t bits = 0;
      std::memcpy(&bits, &x, 4);
      if (dtype == DType::kBF16) {
        const uint16_t half = uint16_t(bits >> 16);
        std::memcpy(&host[size_t(at)], &half, 2);
      } else {
        std::memcpy(&host[size_t(at)], &bits, 4);
      }
    }
    DCP_CUDA_CHECK(cudaMemcpyAsync(base, host.data(), size_t(pattern), cudaMemcpyHostToDevice,
                                   stream));
    for (int64_t filled = pattern; filled < total; filled *= 2) {
      DCP_CUDA_CHECK(cudaMemcpyAsync(static_cast<std::byte*>(base) + filled, base,
                                     size_t(std::min(filled, total - filled)),
                                     cudaMemcpyDeviceToDevice, stream));
    }
    DCP_CUDA_CHECK(cudaStreamSynchronize(stream));  // `host` goes out of scope
    return static_cast<std::byte*>(base) + offset;
  }
};

}  // namespace

// The layouts of one exact m and whether the chosen algorithm takes them.
struct GemmTuner::Layouts {
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  bool usable = false;
  ~Layouts() {
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
  }
};

struct GemmTuner::Choice {
  bool lt = false;  // false: the default (cublasGemmStridedBatchedEx) was fastest
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::map<int, std::unique_ptr<Layouts>> by_m;
  ~Choice() {
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

namespace {

// cuBLASLt sees the row-major C = op(A) op(B) as the column-major C^T = op(B)^T op(A)^T, as the
// default path does: its "A" is our B, its "B" is our A.
absl::Status CreateDesc(const GemmParams& p, cublasLtMatmulDesc_t* desc) {
  DCP_CUBLAS_CHECK(cublasLtMatmulDescCreate(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_b = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  DCP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b,
                                                  sizeof(op_b)));
  DCP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a,
                                                  sizeof(op_a)));
  return absl::OkStatus();
}

absl::Status CreateLayout(cublasLtMatrixLayout_t* layout, DType dtype, int64_t rows, int64_t cols,
                          int64_t ld, int batch, int64_t stride) {
  DCP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(layout, CublasType(dtype), uint64_t(rows),
                                              uint64_t(cols), ld));
  if (batch > 1) {
    DCP_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        *layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
    DCP_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        *layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return absl::OkStatus();
}

// Column-major layouts of the swapped problem (see CreateDesc) for p's m.
absl::Status CreateLayouts(const GemmParams& p, cublasLtMatrixLayout_t* lt_a,
                           cublasLtMatrixLayout_t* lt_b, cublasLtMatrixLayout_t* lt_c) {
  // Our B stored row-major [k, n] (or [n, k] when trans_b) is column-major [n, k] ([k, n]).
  DCP_RETURN_IF_ERROR(CreateLayout(lt_a, p.b_dtype, p.trans_b ? p.k : p.n, p.trans_b ? p.n : p.k,
                                   p.ldb, p.batch, p.stride_b));
  DCP_RETURN_IF_ERROR(CreateLayout(lt_b, p.a_dtype, p.trans_a ? p.m : p.k, p.trans_a ? p.k : p.m,
                                   p.lda, p.batch, p.stride_a));
  return CreateLayout(lt_c, p.c_dtype, p.n, p.m, p.ldc, p.batch, p.stride_c);
}

}  // namespace

GemmTuner::Options GemmTuner::FromEnvironment() {
  Options options;
  options.enabled = EnvSwitch("DCP_GEMM_TUNE", true);
  return options;
}

GemmTuner::GemmTuner(cublasHandle_t cublas, Options options)
    : cublas_(cublas), options_(options) {}

GemmTuner::~GemmTuner() {
  classes_.clear();
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (lt_ != nullptr) cublasLtDestroy(lt_);
}

GemmTuner::Key GemmTuner::KeyOf(const GemmParams& p) {
  const int bucket = static_cast<int>(std::bit_ceil(static_cast<uint32_t>(std::max(p.m, 1))));
  return {bucket,
          p.n,
          p.k,
          p.batch,
          int(p.a_dtype),
          int(p.b_dtype),
          int(p.c_dtype),
          int(p.trans_a),
          int(p.trans_b),
          p.lda,
          p.ldb,
          p.ldc,
          p.stride_a,
          p.stride_b,
          p.stride_c,
          AlignmentOf(p.a, p.stride_a * int64_t(dtype_size(p.a_dtype))),
          AlignmentOf(p.b, p.stride_b * int64_t(dtype_size(p.b_dtype))),
          AlignmentOf(p.c, p.stride_c * int64_t(dtype_size(p.c_dtype)))};
}

bool GemmTuner::Aligned(const GemmParams& p) {
  const Alignments align = AlignmentsOf(p);
  return std::min({align.a, align.b, align.c}) >= kMinAlignment;
}

GemmTuner::Choice* GemmTuner::Find(const GemmParams& p) const {
  if (p.m < kMinRows || p.merge_a.splits > 1) return nullptr;
  const auto it = classes_.find(KeyOf(p));
  if (it == classes_.end() || !it->second->lt) return nullptr;
  return it->second.get();
}

bool GemmTuner::Takes(const GemmParams& p) const { return Find(p) != nullptr && Aligned(p); }

int GemmTuner::lt_classes() const {
  return static_cast<int>(
      std::count_if(classes_.begin(), classes_.end(), [](const auto& c) { return c.second->lt; }));
}

absl::StatusOr<bool> GemmTuner::EnsureWorkspace() {
  if (lt_ == nullptr) DCP_CUBLAS_CHECK(cublasLtCreate(&lt_));
  if (workspace_ == nullptr) {
    const cudaError_t allocated = cudaMalloc(&workspace_, kWorkspaceBytes);
    if (allocated == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      workspace_ = nullptr;
      return false;
    }
    DCP_CUDA_CHECK(allocated);
  }
  return true;
}

absl::Status GemmTuner::Tune(const GemmParams& shape, cudaStream_t stream) {
  if (!options_.enabled || shape.m < kMinRows || shape.n <= 0 || shape.k <= 0 ||
      shape.batch <= 0 || shape.merge_a.splits > 1 || shape.a_dtype != shape.b_dtype ||
      !Aligned(shape)) {
    return absl::OkStatus();
  }
  const Key key = KeyOf(shape);
  if (classes_.count(key) != 0) return absl::OkStatus();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  DCP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return absl::OkStatus();
  DCP_ASSIGN_OR_RETURN(const bool room, EnsureWorkspace());
  if (!room) {
    classes_.emplace(key, std::make_unique<Choice>());
    return absl::OkStatus();
  }

  // The class's m (a power of two), fewer rows while the operands would exceed the budget.
  GemmParams p = shape;
  p.m = std::get<0>(key);
  p.side = {};
  while (p.m > kMinRows && OperandBytes(p).total() > int64_t(kMaxTuneBytes)) p.m /= 2;
  TuningScratch scratch;
  const Operands bytes = OperandBytes(p);
  const auto offset = [](const void* pointer) {
    return int64_t(reinterpret_cast<uintptr_t>(pointer) % uint64_t(kMaxAlignment));
  };
  DCP_ASSIGN_OR_RETURN(void* a, scratch.Operand(bytes.a, offset(p.a), p.a_dtype, 1, stream));
  DCP_ASSIGN_OR_RETURN(void* b, scratch.Operand(bytes.b, offset(p.b), p.b_dtype, 2, stream));
  DCP_ASSIGN_OR_RETURN(void* c, scratch.Operand(bytes.c, offset(p.c), p.c_dtype, 3, stream));
  if (a == nullptr || b == nullptr || c == nullptr) {
    // No room for the timing operands (an engine's KV cache may hold nearly all the memory):
    // the class keeps the default rather than failing the plan.
    classes_.emplace(key, std::make_unique<Choice>());
    return absl::OkStatus();
  }
  p.a = a;
  p.b = b;
  p.c = c;
  DCP_CUDA_CHECK(cudaEventCreate(&scratch.start));
  DCP_CUDA_CHECK(cudaEventCreate(&scratch.stop));

  // Microseconds a launch of `run` takes: the median of 7 launches timed one by one after 3
  // warm-up launches. A launch that fails (`run` returns false: a candidate the shape does not
  // suit after all) is +inf.
  const auto time = [&](auto run) -> absl::StatusOr<float> {
    constexpr int kWarmup = 3, kTimed = 7;
    for (int i = 0; i < kWarmup; ++i) {
      if (!run()) return 1e30f;
    }
    std::vector<float> us(kTimed);
    for (float& each : us) {
      DCP_CUDA_CHECK(cudaEventRecord(scratch.start, stream));
      if (!run()) return 1e30f;
      DCP_CUDA_CHECK(cudaEventRecord(scratch.stop, stream));
      DCP_CUDA_CHECK(cudaEventSynchronize(scratch.stop));
      float ms = 0;
      DCP_CUDA_CHECK(cudaEventElapsedTime(&ms, scratch.start, scratch.stop));
      each = ms * 1e3f;
    }
    std::nth_element(us.begin(), us.begin() + kTimed / 2, us.end());
    return us[kTimed / 2];
  };

  p.alpha = 1.0f;
  p.beta = 0.0f;
  DCP_ASSIGN_OR_RETURN(const float default_us,
                       time([&] { return GemmCublas(cublas_, p, stream).ok(); }));

  auto choice = std::make_unique<Choice>();
  DCP_RETURN_IF_ERROR(CreateDesc(p, &choice->desc));
  Layouts layouts;
  DCP_RETURN_IF_ERROR(CreateLayouts(p, &layouts.a, &layouts.b, &layouts.c));
  cublasLtMatmulPreference_t preference = nullptr;
  DCP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, decltype(&cublasLtMatmulPreferenceDestroy)>
      preference_owner(preference, &cublasLtMatmulPreferenceDestroy);
  const uint64_t workspace = kWorkspaceBytes;
  DCP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
  // cuBLASLt's "A" is our B and its "B" our A (CreateDesc); C and D are one buffer.
  const Alignments align = AlignmentsOf(p);
  const std::pair<cublasLtMatmulPreferenceAttributes_t, int64_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align.b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align.a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align.c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align.c}};
  for (const auto& [attribute, bytes_aligned] : alignments) {
    const uint32_t value = uint32_t(bytes_aligned);
    DCP_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof(value)));
  }
  cublasLtMatmulHeuristicResult_t results[kMaxCandidates];
  int found = 0;
  // No candidate (CUBLAS_STATUS_NOT_SUPPORTED) leaves the default; other failures are errors.
  const cublasStatus_t heuristic =
      cublasLtMatmulAlgoGetHeuristic(lt_, choice->desc, layouts.a, layouts.b, layouts.c,
                                     layouts.c, preference, kMaxCandidates, results, &found);
  if (heuristic != CUBLAS_STATUS_NOT_SUPPORTED) DCP_CUBLAS_CHECK(heuristic);

  // A candidate must beat the default by kMinGain to be kept: two algorithms within timing
  // noise of each other are not worth a second code path.
  float best_us = options_.force_lt ? 1e30f : default_us * (1.0f - kMinGain);
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS || results[i].workspaceSize > workspace) {
      continue;
    }
    DCP_ASSIGN_OR_RETURN(const float us, time([&] {
      return cublasLtMatmul(lt_, choice->desc, &p.alpha, p.b, layouts.a, p.a, layouts.b, &p.beta,
                            p.c, layouts.c, p.c, layouts.c, &results[i].algo, workspace_,
                            kWorkspaceBytes, stream) == CUBLAS_STATUS_SUCCESS;
    }));
    if (us < best_us) {
      best_us = us;
      choice->lt = true;
      choice->algo = results[i].algo;
    }
  }
  DCP_CUDA_CHECK(cudaStreamSynchronize(stream));
  classes_.emplace(key, std::move(choice));
  return absl::OkStatus();
}

absl::StatusOr<bool> GemmTuner::TryRun(const GemmParams& p, cudaStream_t stream) {
  Choice* found = Find(p);
  if (found == nullptr || !Aligned(p)) return false;
  Choice& choice = *found;
  // Layouts per exact m: a serving engine sees many m per class, so the cache starts over
  // when full (a miss costs three descriptor creations and one host-side algorithm check).
  if (choice.by_m.size() >= kMaxLayoutsPerClass && choice.by_m.count(p.m) == 0) {
    choice.by_m.clear();
  }
  std::unique_ptr<Layouts>& layouts = choice.by_m[p.m];
  if (layouts == nullptr) {
    layouts = std::make_unique<Layouts>();
    DCP_RETURN_IF_ERROR(CreateLayouts(p, &layouts->a, &layouts->b, &layouts->c));
    cublasLtMatmulHeuristicResult_t check{};
    layouts->usable =
        cublasLtMatmulAlgoCheck(lt_, choice.desc, layouts->a, layouts->b, layouts->c, layouts->c,
                                &choice.algo, &check) == CUBLAS_STATUS_SUCCESS &&
        check.workspaceSize <= kWorkspaceBytes;
  }
  if (!layouts->usable) return false;
  DCP_CUBLAS_CHECK(cublasLtMatmul(lt_, choice.desc, &p.alpha, p.b, layouts->a, p.a, layouts->b,
                                  &p.beta, p.c, layouts->c, p.c, layouts->c, &choice.algo,
                                  workspace_, kWorkspaceBytes, stream));
  return true;
}

}  // namespace dcp::cuda
