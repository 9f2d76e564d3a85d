// CudaDevice: a rank's Device on one NVIDIA GPU (runtime/device.h).
//
// - Memory: cudaMalloc'd buffers (never managed memory); Free is cudaFree. Contents of a new
//   buffer are whatever cudaMalloc recycled (often an earlier buffer's data, not zeros); set
//   DCP_CUDA_POISON_ALLOCATIONS=1 to fill new buffers with 0xFF (NaN) while debugging.
// - One stream per device, created *blocking* (cudaStreamDefault) on purpose: work on the legacy
//   default stream (stream 0, what the communicators of collectives/cuda use unless given this
//   stream) is then ordered with it both ways, so kernels and collectives never race.
// - Every kernel and device-to-device copy is asynchronous on that stream. CopyFromHost and
//   CopyToHost return once the host buffer may be reused / read (they synchronize), so the
//   worker can hand them stack vectors; StageToDevice (Plan's metadata) copies through pinned
//   memory and does not wait. Synchronize() waits for everything.
// - Storage dtype BF16 (cache, workspace, projected K/V, queries); outputs and LSE fp32.
// - Kernels: attention/cuda (dense MHA 192/128 and 256/256, sparse MQA 576/512 on tensor
//   cores, merges, top-k slots, the top-k check), workspace/cuda (row gather/scatter), cuBLAS
//   for Gemm, cuDNN's fused SDPA for DenseMha when the prefill backend is cudnn (or auto picks
//   it for the shape, dense_backend_table.h). DenseMha checks cu_seqlens on the host copies
//   the caller passes (DenseMhaParams::host_cu_seqlens_*), else copies them back first;
//   ValidateTopk copies back only its verdict.
// - Errors: every CUDA/cuBLAS code becomes a Status with the call text, rank and file:line.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attention/cuda/cudnn/cudnn_sdpa.h"
#include "attention/cuda/gemm_tuner.h"
#include "core/environment.h"
#include "runtime/cuda/pinned_staging.h"
#include "runtime/device.h"

namespace dcp {

// CudaDevice::CheckLayerMemory's rule, without a device (tests run it on machines without a
// GPU): the KV cache 16-byte aligned with rows a multiple of 16 bytes apart (the sparse MQA
// kernel's 16-byte row loads), a BF16 layer output 4-byte aligned (the kernels' pair stores).
absl::Status CheckCudaLayerMemory(const void* cache_data, int64_t cache_row_bytes, const void* out,
                                  DType out_dtype);

class CudaDevice final : public Device {
 public:
  // Binds the calling thread to GPU `ordinal` (cudaSetDevice) and creates the stream and the
  // cuBLAS handle.
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(int ordinal);
  ~CudaDevice() override;

  int ordinal() const { return ordinal_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }

  MemorySpace memory_space() const override { return MemorySpace::kDevice; }
  std::string name() const override { return "cuda:" + std::to_string(ordinal_); }
  DType storage_dtype() const override { return DType::kBF16; }
  // The native DenseMha kernel is compiled for qk 192 / v 128 and 256 / 256.
  absl::Status DenseMhaSupport(int qk_dim, int v_dim) const override;
  // cuda::CheckSparseMqaSizes (attention/cuda/sparse_mqa.h).
  absl::Status SparseMqaSupport(int head_dim, int v_dim) const override;
  // CheckCudaLayerMemory.
  absl::Status CheckLayerMemory(const void* cache_data, int64_t cache_row_bytes, const void* out,
                                DType out_dtype) const override;
  // "native", "cudnn" (loads cuDNN; error when absent or the sizes are unsupported) or "auto"
  // (cudnn where it loads and supports the sizes, chosen per shape against native; else
  // native).
  absl::Status SelectPrefillBackend(const std::string& name, int num_heads, int qk_dim,
                                    int v_dim) override;
  // Which DenseMha implementation runs now: "native", "cudnn" or "auto".
  std::string prefill_backend() const;

  absl::StatusOr<Buffer> Allocate(size_t bytes) override;
  void Free(void* data) override;

  absl::Status CopyFromHost(void* dst, const void* src, size_t bytes) override;
  // Through a ring of pinned host memory (pinned_staging.h): returns without waiting for the
  // stream. DCP_SYNC_UPLOADS=1 makes it CopyFromHost (waits), for comparison and debugging.
  absl::Status StageToDevice(void* dst, const void* src, size_t bytes) override;
  // A batch's copies are deferred to the flush and land with one kernel (PinnedStaging's batch
  // mode; on the H200 a decode step's Plan took 17-22 us with it against 31-58 without);
  // DCP_BATCH_UPLOADS=0 makes each StageToDevice enqueue its own copy (for comparisons).
  void BeginStagingBatch() override;
  absl::Status FlushStagingBatch() override;
  void DiscardStagingBatch() override;
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override;
  absl::Status Copy(void* dst, const void* src, size_t bytes) override;
  absl::Status Copy2D(void* dst, size_t dst_stride, const void* src, size_t src_stride,
                      size_t row_bytes, size_t rows) override;
  absl::Status Memset(void* dst, int value, size_t bytes) override;
  absl::Status Convert(void* dst, DType dst_dtype, const void* src, DType src_dtype,
                       size_t count) override;

  absl::Status Gemm(const GemmParams& params) override;
  // Tunes the shape class on the bound stream (waits for it): cuda::GemmTuner.
  absl::Status PrepareGemm(const GemmParams& params) override;
  bool GemmSupports(const GemmParams& params) const override;
  bool GemmOverlapsSlots(const GemmParams& params) const override;
  absl::Status PrepareDenseMha(const DenseMhaParams& params) override;
  absl::Status DenseMha(const DenseMhaParams& params) override;
  absl::Status SparseMqa(const SparseMqaParams& params) override;
  int64_t SparseMqaWorkspaceBytes(const SparseMqaParams& params) const override;
  absl::Status MergeStates(const MergeStatesParams& params) override;
  absl::Status DcpCorrect(const DcpCorrectParams& params) override;
  absl::Status DcpCombine(const DcpCombineParams& params) override;
  absl::Status TopkToSlots(const TopkToSlotsParams& params) override;
  absl::Status BeginValidateTopk(const TopkValidateParams& params) override;
  absl::Status FinishValidateTopk() override;
  absl::Status GatherRows(const GatherRowsParams& params) override;
  absl::Status ScatterRows(const ScatterRowsParams& params) override;
  absl::Status CopyRows(const CopyRowsParams& params) override;
  absl::Status WriteFp8DsMlaRows(const Fp8DsMlaWriteParams& params) override;
  absl::Status GatherFp8DsMlaRows(const Fp8DsMlaGatherParams& params) override;

  absl::Status Synchronize() override;
  // A stream of this GPU (checked), or nullptr for the device's own.
  absl::Status SetStream(void* stream) override;
  // CUDA events on the current stream (created on first use of a slot).
  absl::Status RecordMark(int slot) override;
  absl::StatusOr<double> MarkSeconds(int from, int to) override;
  void* stream_handle() const override { return stream_; }
  // A side stream of this device (created with it) forked from and joined into the current
  // stream by events, while the current stream is being captured into a CUDA graph; eagerly
  // the side calls run in order on the current stream (cuda_device.cc says why).
  absl::Status BeginSide() override;
  absl::Status EndSide() override;
  absl::Status JoinSide() override;

 private:
  // Whether DenseMha of `p` (host cu_seqlens set) goes to cuDNN: the backend, or auto's table.
  bool UsesCudnn(const DenseMhaParams& p) const;
  CudaDevice(int ordinal, cudaStream_t stream, cublasHandle_t cublas)
      : ordinal_(ordinal),
        own_stream_(stream),
        stream_(stream),
        cublas_(cublas),
        gemm_tuner_(std::make_unique<cuda::GemmTuner>(cublas, cuda::GemmTuner::FromEnvironment())),
        sync_uploads_(EnvSwitch("DCP_SYNC_UPLOADS", false)),
        batch_uploads_(EnvSwitch("DCP_BATCH_UPLOADS", true)) {}
  // Makes this device current for the calling thread (cheap when it already is).
  absl::Status Activate() const;

  int ordinal_;
  cudaStream_t own_stream_;  // created with the device
  std::vector<cudaEvent_t> marks_;  // RecordMark's events, by slot
  cudaStream_t stream_;      // where calls enqueue: own_stream_ or the caller's (SetStream)
  cublasHandle_t cublas_;
  std::set<std::string> declined_shapes_;        // cuDNN's reasons already logged (DenseMha)
  std::unique_ptr<cuda::GemmTuner> gemm_tuner_;  // PrepareGemm's choices, used by Gemm
  void* topk_record_ = nullptr;  // device scratch of the top-k check, allocated on first use
  void* topk_host_record_ = nullptr;   // pinned copy of it (BeginValidateTopk), first use
  cudaEvent_t topk_verdict_ = nullptr;  // behind that copy; recorded by BeginValidateTopk
  bool topk_pending_ = false;
  TopkValidateParams topk_params_;  // of the pending check: its error path describes the error
  void* mqa_workspace_ = nullptr;  // split-KV partials of SparseMqa, grown on demand
  int64_t mqa_workspace_bytes_ = 0;
  enum class DenseBackend { kNative, kCudnn, kAuto };
  DenseBackend dense_backend_ = DenseBackend::kNative;
  std::unique_ptr<cuda::CudnnSdpa> cudnn_;  // created by SelectPrefillBackend
  PinnedStaging staging_;      // StageToDevice's ring
  bool sync_uploads_ = false;   // DCP_SYNC_UPLOADS=1
  bool batch_uploads_ = true;  // DCP_BATCH_UPLOADS (0: off)
  cudaEvent_t switch_event_ = nullptr;  // SetStream's hand-over from the old stream to the new
  // BeginSide / EndSide / JoinSide: created with the device (none of them inside a capture).
  cudaStream_t side_stream_ = nullptr;
  cudaEvent_t fork_event_ = nullptr, join_event_ = nullptr;
  cudaStream_t main_stream_ = nullptr;  // stream_ while a forked side section is open
  enum class Side { kNone, kInOrder, kForked };  // the open side section, if any
  Side side_ = Side::kNone;
  bool join_pending_ = false;  // EndSide recorded join_event_; JoinSide has not waited yet
  unsigned long long join_capture_id_ = 0;  // the capture that forked (join_event_'s)
};

// The GPU of this process: local rank (OMPI_COMM_WORLD_LOCAL_RANK, else MPI_LOCALRANKID, else
// 0) modulo the number of visible devices. Several ranks on one GPU is allowed (the
// communicator factory then stages collectives through host memory). Error when no GPU is
// visible.
absl::StatusOr<int> SelectLocalDevice();

// CudaDevice::Create(ordinal), or null (with the error logged) when that fails.
std::unique_ptr<Device> MakeCudaDevice(int device_ordinal);

}  // namespace dcp
