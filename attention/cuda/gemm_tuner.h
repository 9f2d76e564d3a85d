// The algorithm of the large batched GEMMs, chosen by timing once per shape class.
//
// cuBLAS's default (cublasGemmStridedBatchedEx, CUBLAS_GEMM_DEFAULT) picks one algorithm by
// heuristics; on the dense route's up-projection ([rows, R] x [R, Dn + Dv] per head, K = 512,
// A shared by the heads) it leaves 15-25% on the table on the H200 against the fastest of
// cuBLASLt's candidates for the same shape (docs/dense_prefill_cudnn.md, "The up-projection's
// algorithm"). GemmTuner times cuBLASLt's heuristic candidates and the default on the shape
// once (Tune, at plan time: host, synchronous), remembers the fastest, and TryRun enqueues it
// for every later GEMM of that class (no host synchronisation, no allocation: CUDA-graph safe).
//
// Shape class: every GemmParams field but the pointers, alpha/beta and side copy, with m rounded
// up to a power of two (the candidates are timed at that m, fewer rows when the operands of that
// size would exceed kMaxTuneBytes), and each operand's alignment: the largest power of two <=
// 256 dividing its base address and batch stride in bytes (the default picks its kernel by the
// actual alignment, so the candidates are timed on operands aligned exactly as the class says;
// an operand below 16 bytes is never tuned). A chosen cuBLASLt algorithm is checked once per
// exact m (cublasLtMatmulAlgoCheck) before it runs there.
// Where the tuner does not apply (not tuned, m < kMinRows, the default was not beaten by
// kMinGain, an alignment not tuned, an m the algorithm rejects, a merged A),
// TryRun returns false and the caller runs cuBLAS's default: the same result up to the
// summation order of an fp32 accumulation.
//
// The choice comes from timings, so two processes (or two ranks) may choose differently for one
// class: their results agree to the rounding of an fp32 accumulation in another order, not bit
// for bit (a user who needs bitwise run-to-run equality keeps the tuner off).
//
// On by default (the dense route's layer measured 1-5% faster with it, every shape, H200):
// DCP_GEMM_TUNE=0 in the environment turns it off for the CUDA devices of the process (Tune then
// does nothing and every GEMM keeps cuBLAS's default: bitwise repeatable across processes).
// The first plan of a new shape class waits for the timing (tens of milliseconds).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/attention_params.h"

namespace dcp::cuda {

class GemmTuner {
 public:
  static constexpr int kMinRows = 256;                   // smaller GEMMs keep the default
  static constexpr size_t kMaxTuneBytes = size_t{512} << 20;  // A + B + C of a timing run
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLASLt's split-K etc.
  static constexpr int kMaxCandidates = 16;
  static constexpr float kMinGain = 0.05f;  // a cuBLASLt candidate must be 5% faster
  static constexpr size_t kMaxLayoutsPerClass = 256;  // exact m whose layouts are kept

  struct Options {
    bool enabled = true;     // false: Tune does nothing (DCP_GEMM_TUNE=0)
    bool force_lt = false;   // tests: keep the fastest cuBLASLt candidate even if the default wins
  };
  // Options from the environment (DCP_GEMM_TUNE).
  static Options FromEnvironment();

  // `cublas` is the caller's handle (the default's candidate runs on it).
  GemmTuner(cublasHandle_t cublas, Options options);
  ~GemmTuner();
  GemmTuner(const GemmTuner&) = delete;
  GemmTuner& operator=(const GemmTuner&) = delete;

  // Chooses the algorithm of p's shape class, timing the candidates on `stream` (waits for it;
  // allocates and frees its operands). p's pointers are not dereferenced: only their address
  // modulo 256 counts (null: 256-byte aligned), the alignment the timed operands get (the
  // caller may pass a null-based address such as 128 for "128 bytes past an allocation"). A
  // no-op for a class already
  // tuned, for m < kMinRows, for a merged A or mixed A/B dtypes, when disabled, and while
  // `stream` is being captured. Where the device has no room for the timing operands (up to
  // kMaxTuneBytes + kWorkspaceBytes) the class keeps the default: not an error.
  absl::Status Tune(const GemmParams& p, cudaStream_t stream);

  // Enqueues p's GEMM (checked by the caller, which also does p's side copy; no merged A) with
  // its class's tuned cuBLASLt algorithm on `stream`: true. False where the tuner does not
  // apply (header): nothing was enqueued.
  absl::StatusOr<bool> TryRun(const GemmParams& p, cudaStream_t stream);

  // Whether TryRun would take p (its class is tuned to a cuBLASLt algorithm and p is aligned);
  // the exact-m check is not made here.
  bool Takes(const GemmParams& p) const;

  // Shape classes tuned so far, and how many of them chose a cuBLASLt algorithm.
  int tuned_classes() const { return static_cast<int>(classes_.size()); }
  int lt_classes() const;

 private:
  using Key = std::tuple<int, int, int, int, int, int, int, int, int, int64_t, int64_t, int64_t,
                         int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;
  struct Layouts;
  struct Choice;
  static Key KeyOf(const GemmParams& p);
  static bool Aligned(const GemmParams& p);
  Choice* Find(const GemmParams& p) const;
  // The cuBLASLt handle and workspace; false when the workspace does not fit in memory.
  absl::StatusOr<bool> EnsureWorkspace();

  cublasHandle_t cublas_;
  Options options_;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  std::map<Key, std::unique_ptr<Choice>> classes_;
};

}  // namespace dcp::cuda
