// Where a rank's tensors live and how its kernels run: the worker is written once against this
// interface; CpuDevice (host memory, attention/cpu) and CudaDevice (device memory, one stream,
// attention/cuda + cuBLAS) implement it. Every call may be asynchronous on CudaDevice (ordered
// on the device's stream); Synchronize() waits for all of them. Errors are Statuses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/attention_params.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "workspace/fp8_rows_params.h"
#include "workspace/workspace_params.h"

namespace dcp {

class Device;

// An owned allocation on a Device; movable, freed on destruction.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device* device, void* data, size_t bytes) : device_(device), data_(data), bytes_(bytes) {}
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void reset();
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }

 private:
  Device* device_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  virtual MemorySpace memory_space() const = 0;
  virtual std::string name() const = 0;  // "cpu", "cuda:0"
  // The storage dtype of cache, workspace and projected K/V/queries on this device.
  virtual DType storage_dtype() const = 0;

  // Whether DenseMha runs these head sizes here (the prefill backend's availability); the
  // error says why not.
  virtual absl::Status DenseMhaSupport(int qk_dim, int v_dim) const {
    (void)qk_dim;
    (void)v_dim;
    return absl::OkStatus();
  }

  // Whether SparseMqa runs latent rows of head_dim (R + Dr) with v_dim (R) values here: every
  // step's decodes take it, so an engine refuses a model it cannot run at Create.
  virtual absl::Status SparseMqaSupport(int head_dim, int v_dim) const {
    (void)head_dim;
    (void)v_dim;
    return absl::OkStatus();
  }

  // What this device's kernels need of memory a layer's caller passes, beyond the engine's own
  // shape checks: the KV cache's base address and row stride (bytes), and the layer output's
  // address. DcpEngine::Run checks it before it enqueues anything (the cache write comes first,
  // and a kernel refusing later would leave the new rows written). CPU ranks need nothing.
  virtual absl::Status CheckLayerMemory(const void* cache_data, int64_t cache_row_bytes,
                                        const void* out, DType out_dtype) const {
    (void)cache_data;
    (void)cache_row_bytes;
    (void)out;
    (void)out_dtype;
    return absl::OkStatus();
  }

  // Makes attention.prefill_backend `name` this device's DenseMha implementation for these
  // head sizes (num_heads: per rank): OK when it runs here, else the reason. "none" is OK and
  // changes nothing; "auto" and "native" mean DenseMhaSupport here; other names are known only
  // to devices that implement them (CUDA: "cudnn", and "auto" prefers it per shape).
  virtual absl::Status SelectPrefillBackend(const std::string& name, int num_heads, int qk_dim,
                                            int v_dim);

  virtual absl::StatusOr<Buffer> Allocate(size_t bytes) = 0;
  virtual void Free(void* data) = 0;

  virtual absl::Status CopyFromHost(void* dst, const void* src, size_t bytes) = 0;
  // A host-to-device copy in stream order that does not wait for the stream: `src` may be
  // reused as soon as this returns (the device stages it), the copy lands before any later
  // call's work on the current stream. For step metadata (Plan), never inside a graph capture.
  // The default is CopyFromHost (which waits; CPU ranks copy at once).
  virtual absl::Status StageToDevice(void* dst, const void* src, size_t bytes) {
    return CopyFromHost(dst, src, bytes);
  }
  // A step's uploads in one go (DcpEngine::Plan, through StagingBatch in runtime/scratch.h):
  // after BeginStagingBatch a device may defer StageToDevice's copies (their sources are still
  // taken at the call) and enqueue them together at FlushStagingBatch; nothing that reads a
  // destination may be enqueued in between. DiscardStagingBatch drops what is deferred (an
  // error path: the destinations hold anything). The default copies at once.
  virtual void BeginStagingBatch() {}
  virtual absl::Status FlushStagingBatch() { return absl::OkStatus(); }
  virtual void DiscardStagingBatch() {}
  virtual absl::Status CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status Copy(void* dst, const void* src, size_t bytes) = 0;
  // rows x row_bytes, strides in bytes, device to device.
  virtual absl::Status Copy2D(void* dst, size_t dst_stride, const void* src, size_t src_stride,
                              size_t row_bytes, size_t rows) = 0;
  virtual absl::Status Memset(void* dst, int value, size_t bytes) = 0;
  // dst[i] = src[i] converted, count elements; F32 <-> BF16 (and same-type copies).
  virtual absl::Status Convert(void* dst, DType dst_dtype, const void* src, DType src_dtype,
                               size_t count) = 0;

  virtual absl::Status Gemm(const GemmParams& params) = 0;
  // At plan time (host; may wait for the device and allocate, once per shape class): lets the
  // device choose its algorithm for later Gemm calls of this shape (params' pointers are
  // ignored). CUDA ranks time cuBLASLt's candidates (attention/cuda/gemm_tuner.h); the CPU
  // has nothing to choose.
  virtual absl::Status PrepareGemm(const GemmParams& params) {
    (void)params;
    return absl::OkStatus();
  }
  // Whether Gemm takes this mix of dtypes at this shape and alignment (the CPU takes every
  // F32/BF16 mix; CUDA takes A F32 with B BF16, and an A merged from split partials
  // (GemmParams::merge_a), only on its small-M kernel). Sizes are not
  // validated here: Gemm does that.
  virtual bool GemmSupports(const GemmParams& params) const {
    return params.merge_a.splits <= 1;
  }
  // Whether Gemm runs params.side_slots (the top-k -> slots step) inside the GEMM's own launch,
  // overlapping the two (CUDA: the 1-token decode absorb); every device takes side_slots, the
  // others running the step first, in stream order.
  virtual bool GemmOverlapsSlots(const GemmParams& params) const {
    (void)params;
    return false;
  }
  // Plan time, for a DenseMha call a Run will make (sizes, strides and host cu_seqlens as Run's;
  // pointers may be null): whatever the implementation would otherwise do at its first call of
  // the shape (cuDNN: build the graph, reserve its scratch), so that the call only enqueues.
  // An error is the one the call would return.
  virtual absl::Status PrepareDenseMha(const DenseMhaParams& params) {
    (void)params;
    return absl::OkStatus();
  }
  virtual absl::Status DenseMha(const DenseMhaParams& params) = 0;
  virtual absl::Status SparseMqa(const SparseMqaParams& params) = 0;
  // Bytes of SparseMqaParams::workspace (split-KV partials) a launch of these sizes uses; 0 when
  // the device needs none. Without a workspace, SparseMqa provides its own (and may allocate).
  virtual int64_t SparseMqaWorkspaceBytes(const SparseMqaParams& params) const {
    (void)params;
    return 0;
  }
  virtual absl::Status MergeStates(const MergeStatesParams& params) = 0;
  virtual absl::Status DcpCorrect(const DcpCorrectParams& params) = 0;
  virtual absl::Status DcpCombine(const DcpCombineParams& params) = 0;
  virtual absl::Status TopkToSlots(const TopkToSlotsParams& params) = 0;
  // The top-k check of DESIGN.md section 3 (TopkValidateParams): OK, or InvalidArgument naming
  // the first bad row's token, column and value. Synchronous: it returns the verdict, not a
  // promise, so on CudaDevice it waits for the stream (one small copy back, never the top-k).
  absl::Status ValidateTopk(const TopkValidateParams& params) {
    const absl::Status begun = BeginValidateTopk(params);
    return begun.ok() ? FinishValidateTopk() : begun;
  }
  // The same check in two halves, so that the host can plan a step while the device checks:
  // Begin enqueues it (a bad argument is its error), Finish waits for that verdict only (on
  // CudaDevice: an event behind the verdict's copy into pinned memory, not the stream's later
  // work) and returns it. Nothing may read the top-k on the device before Finish returned OK;
  // every Begin that returned OK takes one Finish, and the params' memory stays valid until it
  // returned (on an error Finish reads the rows again to describe it). CpuDevice checks in Begin.
  virtual absl::Status BeginValidateTopk(const TopkValidateParams& params) = 0;
  virtual absl::Status FinishValidateTopk() = 0;
  virtual absl::Status GatherRows(const GatherRowsParams& params) = 0;
  virtual absl::Status ScatterRows(const ScatterRowsParams& params) = 0;
  // A few strided row copies (with source rows broadcast) in one call (CopyRowsParams).
  virtual absl::Status CopyRows(const CopyRowsParams& params) = 0;
  // fp8_ds_mla cache rows (core/kv_cache_format.h, workspace/fp8_rows_params.h): the quantizing
  // cache write (input in the storage dtype) and the dequantizing gather (output in the storage
  // dtype). Devices without them answer Unimplemented.
  virtual absl::Status WriteFp8DsMlaRows(const Fp8DsMlaWriteParams& params);
  virtual absl::Status GatherFp8DsMlaRows(const Fp8DsMlaGatherParams& params);

  virtual absl::Status Synchronize() = 0;

  // Stream-ordered timestamps for stats that wait for nothing: RecordMark(slot) marks the point
  // after the work enqueued so far; MarkSeconds(from, to) waits for mark `to` and returns the
  // seconds between the two. Slots are small integers reused from one layer to the next. The
  // default (CPU ranks, whose calls complete in order on the host) reads the host clock.
  virtual absl::Status RecordMark(int slot);
  virtual absl::StatusOr<double> MarkSeconds(int from, int to);

  // The stream later calls enqueue on (a cudaStream_t on CUDA ranks; nullptr = the device's
  // own). Streams of another GPU are refused. CPU ranks run in order and take only nullptr.
  // Switching streams orders the new stream after the work enqueued on the old one.
  virtual absl::Status SetStream(void* stream);
  virtual void* stream_handle() const { return nullptr; }

  // Concurrency inside a layer (a fork and a join, captured as such in a CUDA graph): calls
  // between BeginSide() and EndSide() enqueue on a side stream that starts after everything
  // enqueued before BeginSide(); calls after EndSide() go to the main stream again, and
  // JoinSide() makes what is enqueued after it wait for the side work too. One side section at
  // a time; EndSide() must follow a BeginSide() that succeeded, also when a call in between
  // failed. Devices that run calls in order (CPU ranks) do nothing; CUDA ranks fork only while
  // the stream is being captured into a graph (eagerly the fork costs more host time than it
  // saves at decode sizes).
  virtual absl::Status BeginSide() { return absl::OkStatus(); }
  virtual absl::Status EndSide() { return absl::OkStatus(); }
  virtual absl::Status JoinSide() { return absl::OkStatus(); }

 private:
  std::vector<double> host_marks_;  // seconds since an arbitrary origin, by slot
};

// Host memory, kernels of attention/cpu and workspace/cpu. Storage dtype F32 or BF16.
std::unique_ptr<Device> MakeCpuDevice(DType storage_dtype = DType::kF32);

}  // namespace dcp
