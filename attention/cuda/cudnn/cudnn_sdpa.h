// Dense MHA through cuDNN's fused SDPA (the cuDNN frontend's C++ graph API), the
// `prefill_backend: cudnn` of CUDA ranks. Same contract as cuda::DenseMha (DenseMhaParams:
// packed varlen bf16 q/k/v at the caller's strides, causal = bottom-right aligned, fp32 or bf16
// out, natural-log lse, out 0 / lse -inf for a query that sees no key). Needs cuDNN >= 9.12.
//
// - cuDNN is loaded at run time (dlopen of libcudnn.so.9 through the frontend's dynamic
//   loading): dcp builds without cuDNN and runs without it (Create is then Unavailable). A
//   build without the frontend headers (scripts/setup.sh installs them into .deps/) has the
//   same API and Create answers Unimplemented.
// - Ragged (THD) Q/K/V/O/Stats with per-sequence offsets written on the device from
//   cu_seqlens; the host copies of cu_seqlens (CudnnSdpaParams) pick the graph, so nothing is
//   copied back and nothing waits.
// - Uniform batches (every sequence the same power-of-two lengths, no query without keys) take
//   plain strided graphs instead: no ragged offsets, no padding mask (DCP_CUDNN_SDPA_RAGGED=1
//   keeps them ragged, to measure the difference).
// - Graphs are built once per (heads, sizes, strides, causal, bucketed batch and lengths) and
//   cached; the first call of a shape pays the build (tens of ms). A graph cuDNN cannot build
//   is remembered too (the call is Unimplemented again, without a second build).
// - Uniform graphs whose O and Stats layouts are the caller's write out and lse directly;
//   otherwise cuDNN writes bf16 O and fp32 Stats into scratch owned here (grown on demand: a
//   cudaMalloc inside Run, the first time a step needs more) and a small kernel turns them
//   into out / lse at the caller's strides.
// Not thread-safe: one instance per device and stream (CudaDevice owns one).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/attention_params.h"

namespace dcp::cuda {

struct CudnnSdpaParams {
  DenseMhaParams mha;                          // device q/k/v/out/lse and cu_seqlens
  const int32_t* host_cu_seqlens_q = nullptr;  // [mha.num_seqs + 1] host copy of cu_seqlens_q
  const int32_t* host_cu_seqlens_k = nullptr;  // [mha.num_seqs + 1] host copy of cu_seqlens_k
};

class CudnnSdpa {
 public:
  // Loads cuDNN (libcudnn.so.9), checks its version (>= 9.6) and creates a handle bound to
  // `stream` on the current device. Unavailable with the loader's message when cuDNN is absent.
  static absl::StatusOr<std::unique_ptr<CudnnSdpa>> Create(cudaStream_t stream);
  ~CudnnSdpa();
  CudnnSdpa(const CudnnSdpa&) = delete;
  CudnnSdpa& operator=(const CudnnSdpa&) = delete;

  // Whether cuDNN runs bf16 SDPA with these head sizes here: builds (and caches) a small causal
  // and a non-causal graph. The error carries cuDNN's reason.
  absl::Status Supports(int num_heads, int qk_dim, int v_dim);

  // Rebinds the handle to another stream of the same device (cheap when unchanged).
  absl::Status SetStream(cudaStream_t stream);

  // Plan time, for a call Run will make: the same checks and answer (Unimplemented where Run
  // would decline), builds the shape's graph and reserves the most scratch such a call uses, so
  // that Run neither builds nor allocates. Pointers may be null; the host cu_seqlens and every
  // size and stride must be Run's. May allocate and wait for the device.
  absl::Status Prepare(const CudnnSdpaParams& params);

  // Enqueues the attention on the stream; no host synchronisation. Unimplemented (nothing
  // enqueued) when cuDNN has no graph for the shape, its int32 offsets overflow or the batch
  // has more than 65535 sequences. Builds the graph and grows the scratch itself for a shape
  // that Prepare did not see.
  absl::Status Run(const CudnnSdpaParams& params);

  // "cuDNN 9.19.0 (frontend 1.32.0)".
  std::string version() const;
  // Graphs built so far (tests check that a shape is built once), and the scratch reserved.
  int num_graphs() const;
  size_t scratch_bytes() const;

  struct Impl;

 private:
  struct Shape;
  struct ScratchLayout;
  explicit CudnnSdpa(std::unique_ptr<Impl> impl);
  absl::StatusOr<Shape> Analyze(const CudnnSdpaParams& params, bool need_pointers);
  static ScratchLayout Scratch(const Shape& shape, int num_heads, int v_dim, bool direct,
                               bool direct_lse);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dcp::cuda
