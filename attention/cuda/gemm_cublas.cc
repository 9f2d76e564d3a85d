#include "attention/cuda/gemm_cublas.h"

#include <algorithm>
#include <string_view>

#include "attention/cuda/cublas_status.h"
#include "attention/cuda/gemm_small_m.h"
#include "attention/cuda/gemm_tuner.h"
#include "attention/cuda/topk_to_slots.h"
#include "core/cuda/copy_2d.h"
#include "core/cuda/cuda_status.h"
#include "core/environment.h"

namespace dcp::cuda {

cudaDataType_t CublasType(DType dtype) {
  return dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
}

namespace {

// The side copy (GemmParams::SideCopy) as a kernel of its own (core/cuda/copy_2d.h, which
// checks the pointers and that each pitch holds a row; only the signs are checked here, before
// the sizes become size_t).
absl::Status SideCopy(const GemmParams::SideCopy& side, cudaStream_t stream) {
  if (side.rows == 0 || side.row_bytes == 0) return absl::OkStatus();
  DCP_CHECK_ARG(side.rows > 0 && side.row_bytes > 0 && side.dst_pitch >= 0 && side.src_pitch >= 0,
                "Gemm: side copy of %d rows of %d bytes with pitches (%d, %d)", side.rows,
                side.row_bytes, side.dst_pitch, side.src_pitch);
  return Copy2D(side.dst, size_t(side.dst_pitch), side.src, size_t(side.src_pitch),
                size_t(side.row_bytes), size_t(side.rows), stream, "Gemm: side copy");
}

absl::Status CheckParams(const GemmParams& p) {
  DCP_CHECK_ARG(p.m >= 0 && p.n >= 0 && p.k >= 0 && p.batch >= 0,
                "Gemm: negative size (m %d, n %d, k %d, batch %d)", p.m, p.n, p.k, p.batch);
  DCP_CHECK_ARG((p.a_dtype == p.b_dtype && p.a_dtype != DType::kI32) ||
                    (p.a_dtype == DType::kF32 && p.b_dtype == DType::kBF16),
                "Gemm (CUDA): A and B must both be BF16 or both F32, or A F32 with B BF16 "
                "(got %s, %s)",
                dtype_name(p.a_dtype), dtype_name(p.b_dtype));
  DCP_CHECK_ARG(p.c_dtype == DType::kF32 || p.c_dtype == DType::kBF16,
                "Gemm (CUDA): C must be F32 or BF16 (got %s)", dtype_name(p.c_dtype));
  if (p.m == 0 || p.n == 0 || p.batch == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.c != nullptr, "Gemm: c must not be null");
  DCP_CHECK_ARG(p.k == 0 || (p.a != nullptr && p.b != nullptr), "Gemm: a and b must not be null");
  // Leading dimensions of the row-major operands as stored.
  const int64_t a_cols = p.trans_a ? p.m : p.k;
  const int64_t b_cols = p.trans_b ? p.k : p.n;
  DCP_CHECK_ARG(p.lda >= std::max<int64_t>(1, a_cols) && p.ldb >= std::max<int64_t>(1, b_cols) &&
                    p.ldc >= std::max<int64_t>(1, p.n),
                "Gemm: leading dimensions (lda %d, ldb %d, ldc %d) too small for m %d n %d k %d",
                p.lda, p.ldb, p.ldc, p.m, p.n, p.k);
  DCP_CHECK_ARG(p.batch == 1 || p.stride_c != 0, "Gemm: stride_c 0 with batch %d would race",
                p.batch);
  return absl::OkStatus();
}

}  // namespace

namespace {

enum class SmallMKernel { kNone, kSimt, kTensorCore };

// DCP_SMALL_M_GEMM: "simt" (default), "tc" or "off"; DCP_NO_SMALL_M_GEMM=1 is "off".
SmallMKernel SmallMChoice() {
  static const SmallMKernel choice = [] {
    if (EnvSwitch("DCP_NO_SMALL_M_GEMM", false)) return SmallMKernel::kNone;
    const std::string_view name = EnvChoice("DCP_SMALL_M_GEMM", "simt", {"simt", "tc", "off"});
    if (name == "off") return SmallMKernel::kNone;
    if (name == "tc") return SmallMKernel::kTensorCore;
    return SmallMKernel::kSimt;
  }();
  return choice;
}

// Which small-M kernel takes a GEMM (gemm_small_m.h): the CUDA-core one up to
// kSmallMGemmDispatchMaxM rows, or the tensor-core one up to kSmallMTcGemmMaxM when chosen;
// kNone: cuBLAS.
SmallMKernel SmallMKernelFor(const GemmParams& p) {
  switch (SmallMChoice()) {
    case SmallMKernel::kSimt:
      return p.m <= kSmallMGemmDispatchMaxM && SmallMGemmFits(p) ? SmallMKernel::kSimt
                                                                 : SmallMKernel::kNone;
    case SmallMKernel::kTensorCore:
      return SmallMTcGemmFits(p) ? SmallMKernel::kTensorCore : SmallMKernel::kNone;
    case SmallMKernel::kNone:
      break;
  }
  return SmallMKernel::kNone;
}

}  // namespace

bool SmallMGemmEnabled() { return SmallMChoice() != SmallMKernel::kNone; }

const char* GemmKernelName(const GemmParams& p, const GemmTuner* tuner) {
  switch (SmallMKernelFor(p)) {
    case SmallMKernel::kTensorCore:
      return "small_m_tc";
    case SmallMKernel::kSimt:
      return "small_m";
    case SmallMKernel::kNone:
      break;
  }
  return tuner != nullptr && tuner->Takes(p) ? "cublaslt" : "cublas";
}

namespace {

bool TakesSmallM(const GemmParams& p) { return SmallMKernelFor(p) != SmallMKernel::kNone; }

}  // namespace

bool GemmSupports(const GemmParams& p) {
  if (p.merge_a.splits > 1) return SmallMKernelFor(p) == SmallMKernel::kSimt;
  if (p.a_dtype == p.b_dtype) return p.a_dtype == DType::kF32 || p.a_dtype == DType::kBF16;
  return p.a_dtype == DType::kF32 && p.b_dtype == DType::kBF16 && TakesSmallM(p);
}

bool GemmOverlapsSlots(const GemmParams& p) {
  // DCP_NO_SLOTS_IN_GEMM=1: the step runs as a launch of its own (A/B measurements).
  static const bool off = EnvSwitch("DCP_NO_SLOTS_IN_GEMM", false);
  return !off && SmallMKernelFor(p) == SmallMKernel::kSimt && SmallMGemmTakesSlots(p);
}

absl::Status Gemm(cublasHandle_t handle, const GemmParams& p, cudaStream_t stream,
                  GemmTuner* tuner) {
  DCP_RETURN_IF_ERROR(CheckParams(p));
  if (p.side_slots != nullptr && !GemmOverlapsSlots(p)) {
    DCP_RETURN_IF_ERROR(TopkToSlots(*p.side_slots, stream));  // first, in stream order
    GemmParams rest = p;
    rest.side_slots = nullptr;
    return Gemm(handle, rest, stream, tuner);
  }
  switch (SmallMKernelFor(p)) {
    case SmallMKernel::kTensorCore:
      return GemmSmallMTc(p, stream);
    case SmallMKernel::kSimt:
      return GemmSmallM(p, stream);
    case SmallMKernel::kNone:
      break;
  }
  if (tuner == nullptr || !tuner->Takes(p)) {  // no class of mixed A/B dtypes is ever tuned
    return GemmCublas(handle, p, stream);
  }
  DCP_RETURN_IF_ERROR(SideCopy(p.side, stream));
  DCP_ASSIGN_OR_RETURN(const bool ran, tuner->TryRun(p, stream));
  if (ran) return absl::OkStatus();
  GemmParams rest = p;  // the side copy is done
  rest.side = {};
  return GemmCublas(handle, rest, stream);
}

absl::Status GemmCublas(cublasHandle_t handle, const GemmParams& p, cudaStream_t stream) {
  DCP_RETURN_IF_ERROR(CheckParams(p));
  DCP_CHECK_ARG(p.a_dtype == p.b_dtype,
                "Gemm (cuBLAS): A %s with B %s is taken by the small-M kernel only (BF16 B, m "
                "<= %d, aligned; see gemm_small_m.h), not m %d n %d k %d",
                dtype_name(p.a_dtype), dtype_name(p.b_dtype), kSmallMGemmDispatchMaxM, p.m, p.n,
                p.k);
  DCP_CHECK_ARG(p.merge_a.splits <= 1,
                "Gemm (cuBLAS): an A merged from %d split partials is taken by the small-M kernel "
                "only (m <= %d, B stored [K, N]; GemmSupports)",
                p.merge_a.splits, kSmallMGemmDispatchMaxM);
  if (p.side_slots != nullptr) DCP_RETURN_IF_ERROR(TopkToSlots(*p.side_slots, stream));
  DCP_RETURN_IF_ERROR(SideCopy(p.side, stream));
  if (p.m == 0 || p.n == 0 || p.batch == 0) return absl::OkStatus();
  // BLAS rules, which cuBLAS follows: beta == 0 never reads C; k == 0 gives C = beta * C.
  DCP_CUBLAS_CHECK(cublasSetStream(handle, stream));
  const float alpha = p.alpha, beta = p.beta;
  // Column-major: C^T [n x m] = op(B)^T [n x k] @ op(A)^T [k x m]. A row-major matrix X with
  // leading dimension ld is the column-major X^T with the same ld.
  const cublasOperation_t op_b = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  DCP_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, op_b, op_a, p.n, p.m, p.k, &alpha, p.b, CublasType(p.b_dtype), p.ldb, p.stride_b, p.a,
      CublasType(p.a_dtype), p.lda, p.stride_a, &beta, p.c, CublasType(p.c_dtype), p.ldc, p.stride_c,
      p.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

}  // namespace dcp::cuda
