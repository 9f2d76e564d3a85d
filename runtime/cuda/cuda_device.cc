#include "runtime/cuda/cuda_device.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "attention/cuda/cublas_status.h"
#include "core/cuda/copy_2d.h"
#include "core/cuda/cuda_status.h"
#include "core/environment.h"
#include "core/logging.h"

namespace dcp {

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(int ordinal) {
  int count = 0;
  DCP_CUDA_CHECK(cudaGetDeviceCount(&count));
  DCP_CHECK_ARG(ordinal >= 0 && ordinal < count, "CudaDevice: ordinal %d outside [0, %d)",
                ordinal, count);
  DCP_CUDA_CHECK(cudaSetDevice(ordinal));
  cudaStream_t stream = nullptr;
  DCP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
  cublasHandle_t cublas = nullptr;
  const absl::Status blas = CublasCodeToStatus(cublasCreate(&cublas), "cublasCreate", __FILE__,
                                               __LINE__);
  if (!blas.ok()) {
    cudaStreamDestroy(stream);
    return blas;
  }
  if (auto set = CublasCodeToStatus(cublasSetStream(cublas, stream), "cublasSetStream", __FILE__,
                                    __LINE__);
      !set.ok()) {
    cublasDestroy(cublas);
    cudaStreamDestroy(stream);
    return set;
  }
  std::unique_ptr<CudaDevice> device(new CudaDevice(ordinal, stream, cublas));
  // The side stream and its two events. Non-blocking: it runs forked work only, ordered by the
  // events, and only inside a capture, where a blocking stream would make any use of the legacy
  // stream in the process (a caller's synchronous cudaMemcpy) invalidate the capture.
  DCP_CUDA_CHECK(cudaStreamCreateWithFlags(&device->side_stream_, cudaStreamNonBlocking));
  DCP_CUDA_CHECK(cudaEventCreateWithFlags(&device->fork_event_, cudaEventDisableTiming));
  DCP_CUDA_CHECK(cudaEventCreateWithFlags(&device->join_event_, cudaEventDisableTiming));
  return device;
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(ordinal_);
  cudaStreamSynchronize(own_stream_);
  cudnn_.reset();  // its handle is bound to a stream of this device: release it first
  for (cudaEvent_t mark : marks_) cudaEventDestroy(mark);
  if (switch_event_ != nullptr) cudaEventDestroy(switch_event_);
  if (side_stream_ != nullptr) {
    cudaStreamSynchronize(side_stream_);
    cudaStreamDestroy(side_stream_);
  }
  if (fork_event_ != nullptr) cudaEventDestroy(fork_event_);
  if (join_event_ != nullptr) cudaEventDestroy(join_event_);
  if (topk_record_ != nullptr) cudaFree(topk_record_);
  if (topk_verdict_ != nullptr) {
    cudaEventSynchronize(topk_verdict_);  // the copy into the pinned record has landed
    cudaEventDestroy(topk_verdict_);
  }
  if (topk_host_record_ != nullptr) cudaFreeHost(topk_host_record_);
  if (mqa_workspace_ != nullptr) cudaFree(mqa_workspace_);
  gemm_tuner_.reset();  // uses the cuBLAS handle
  cublasDestroy(cublas_);
  cudaStreamDestroy(own_stream_);
}

absl::Status CudaDevice::Activate() const {
  int current = -1;
  DCP_CUDA_CHECK(cudaGetDevice(&current));
  if (current != ordinal_) DCP_CUDA_CHECK(cudaSetDevice(ordinal_));
  return absl::OkStatus();
}

absl::StatusOr<Buffer> CudaDevice::Allocate(size_t bytes) {
  DCP_RETURN_IF_ERROR(Activate());
  if (bytes == 0) return Buffer(this, nullptr, 0);
  void* data = nullptr;
  const cudaError_t code = cudaMalloc(&data, bytes);
  if (code != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky; clear it for later checks
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    return DCP_ERROR(ResourceExhausted,
                     "cudaMalloc(%d bytes) on %s failed: %s (%d of %d bytes free)", bytes, name(),
                     cudaGetErrorString(code), free_bytes, total_bytes);
  }
  // Debugging aid: DCP_CUDA_POISON_ALLOCATIONS=1 fills new buffers with 0xFF bytes (NaN for
  // fp32 and bf16, -1 for int32), so a read of memory nothing wrote shows up as NaN instead of
  // a stale value recycled from an earlier allocation.
  static const bool poison = EnvSwitch("DCP_CUDA_POISON_ALLOCATIONS", false);
  if (poison) {
    if (absl::Status filled = CudaCodeToStatus(cudaMemsetAsync(data, 0xFF, bytes, stream_),
                                               "cudaMemsetAsync(poison)", __FILE__, __LINE__);
        !filled.ok()) {
      cudaFree(data);
      return filled;
    }
  }
  return Buffer(this, data, bytes);
}

void CudaDevice::Free(void* data) {
  if (data == nullptr) return;
  cudaSetDevice(ordinal_);
  const cudaError_t code = cudaFree(data);
  if (code != cudaSuccess) {
    DCP_LOG(ERROR) << "cudaFree on " << name() << " failed: " << cudaGetErrorString(code);
  }
}

absl::Status CudaDevice::CopyFromHost(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  DCP_CHECK_ARG(dst != nullptr && src != nullptr, "CopyFromHost: null pointer");
  DCP_RETURN_IF_ERROR(Activate());
  DCP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  // The caller may reuse (or free) `src` as soon as this returns.
  DCP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaDevice::StageToDevice(void* dst, const void* src, size_t bytes) {
  if (sync_uploads_) return CopyFromHost(dst, src, bytes);
  DCP_RETURN_IF_ERROR(Activate());
  return staging_.Append(dst, src, bytes, stream_);  // Copy outside a batch
}

void CudaDevice::BeginStagingBatch() {
  if (batch_uploads_ && !sync_uploads_) staging_.BeginBatch();
}

absl::Status CudaDevice::FlushStagingBatch() {
  if (!staging_.batching()) return absl::OkStatus();
  DCP_RETURN_IF_ERROR(Activate());
  return staging_.FlushBatch(stream_);
}

void CudaDevice::DiscardStagingBatch() { staging_.DiscardBatch(); }

absl::Status CudaDevice::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  DCP_CHECK_ARG(dst != nullptr && src != nullptr, "CopyToHost: null pointer");
  DCP_RETURN_IF_ERROR(Activate());
  DCP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  DCP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaDevice::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  DCP_CHECK_ARG(dst != nullptr && src != nullptr, "Copy: null pointer");
  DCP_RETURN_IF_ERROR(Activate());
  DCP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  return absl::OkStatus();
}

absl::Status CudaDevice::Copy2D(void* dst, size_t dst_stride, const void* src, size_t src_stride,
                                size_t row_bytes, size_t rows) {
  if (rows == 0 || row_bytes == 0) return absl::OkStatus();
  DCP_RETURN_IF_ERROR(Activate());
  return cuda::Copy2D(dst, dst_stride, src, src_stride, row_bytes, rows, stream_);
}

absl::Status CudaDevice::Memset(void* dst, int value, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  DCP_CHECK_ARG(dst != nullptr, "Memset: null pointer");
  DCP_RETURN_IF_ERROR(Activate());
  DCP_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, stream_));
  return absl::OkStatus();
}

absl::Status CudaDevice::SetStream(void* stream) {
  DCP_CHECK_ARG(side_ == Side::kNone, "SetStream inside a side section (BeginSide)");
  cudaStream_t next = stream == nullptr ? own_stream_ : static_cast<cudaStream_t>(stream);
  if (stream != nullptr) {
    int stream_device = -1;
    DCP_CUDA_CHECK(cudaStreamGetDevice(next, &stream_device));
    DCP_CHECK_ARG(stream_device == ordinal_, "the stream belongs to GPU %d, this rank's device "
                  "is GPU %d", stream_device, ordinal_);
  }
  if (next == stream_) return absl::OkStatus();
  // Work enqueued on the old stream (a step's staged metadata, the previous layer) comes first.
  DCP_RETURN_IF_ERROR(Activate());
  if (switch_event_ == nullptr) {
    DCP_CUDA_CHECK(cudaEventCreateWithFlags(&switch_event_, cudaEventDisableTiming));
  }
  DCP_CUDA_CHECK(cudaEventRecord(switch_event_, stream_));
  DCP_CUDA_CHECK(cudaStreamWaitEvent(next, switch_event_, 0));
  stream_ = next;
  return absl::OkStatus();
}

absl::Status CudaDevice::BeginSide() {
  DCP_CHECK_ARG(side_ == Side::kNone, "BeginSide: a side section is already open");
  DCP_RETURN_IF_ERROR(Activate());
  // A join left pending (a Run that failed between EndSide and JoinSide) is dropped: the side
  // stream runs in order, so the next section's join covers its work too, and an event of an
  // abandoned capture must not be waited for in a new one.
  join_pending_ = false;
  // Only a graph being captured forks: replays pay nothing for the fork and the join, while
  // eagerly their four event calls cost more host time than the overlap saves at decode sizes
  // (H200, 1 token x 128 heads: host 23 -> 32-37 us per layer, the layer host-bound).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  unsigned long long capture_id = 0;
  DCP_CUDA_CHECK(cudaStreamGetCaptureInfo(stream_, &capture, &capture_id));
  if (capture != cudaStreamCaptureStatusActive) {
    side_ = Side::kInOrder;
    return absl::OkStatus();
  }
  join_capture_id_ = capture_id;
  DCP_CUDA_CHECK(cudaEventRecord(fork_event_, stream_));
  DCP_CUDA_CHECK(cudaStreamWaitEvent(side_stream_, fork_event_, 0));
  main_stream_ = stream_;
  stream_ = side_stream_;
  side_ = Side::kForked;
  return absl::OkStatus();
}

absl::Status CudaDevice::EndSide() {
  DCP_CHECK_ARG(side_ != Side::kNone, "EndSide without BeginSide");
  const bool forked = side_ == Side::kForked;
  side_ = Side::kNone;
  if (!forked) return absl::OkStatus();
  stream_ = main_stream_;
  main_stream_ = nullptr;
  DCP_CUDA_CHECK(cudaEventRecord(join_event_, side_stream_));
  join_pending_ = true;
  return absl::OkStatus();
}

absl::Status CudaDevice::JoinSide() {
  DCP_CHECK_ARG(side_ == Side::kNone, "JoinSide inside a side section");
  if (!join_pending_) return absl::OkStatus();
  join_pending_ = false;
  // A join left by a Run that failed between EndSide and JoinSide belongs to that capture: a
  // later layer that did not fork must not wait for its event (eagerly an error, in another
  // capture an isolation error).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  unsigned long long capture_id = 0;
  DCP_CUDA_CHECK(cudaStreamGetCaptureInfo(stream_, &capture, &capture_id));
  if (capture != cudaStreamCaptureStatusActive || capture_id != join_capture_id_) {
    return absl::OkStatus();
  }
  DCP_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_event_, 0));
  return absl::OkStatus();
}

absl::Status CudaDevice::RecordMark(int slot) {
  DCP_CHECK_ARG(slot >= 0, "mark slot %d", slot);
  DCP_RETURN_IF_ERROR(Activate());
  while (marks_.size() <= static_cast<size_t>(slot)) {
    cudaEvent_t event = nullptr;
    DCP_CUDA_CHECK(cudaEventCreate(&event));
    marks_.push_back(event);
  }
  DCP_CUDA_CHECK(cudaEventRecord(marks_[slot], stream_));
  return absl::OkStatus();
}

absl::StatusOr<double> CudaDevice::MarkSeconds(int from, int to) {
  DCP_CHECK_ARG(from >= 0 && to >= 0 && static_cast<size_t>(std::max(from, to)) < marks_.size(),
                "marks %d and %d were not recorded", from, to);
  DCP_RETURN_IF_ERROR(Activate());
  DCP_CUDA_CHECK(cudaEventSynchronize(marks_[to]));
  float ms = 0;
  DCP_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[from], marks_[to]));
  return ms * 1e-3;
}

absl::Status CudaDevice::Synchronize() {
  DCP_RETURN_IF_ERROR(Activate());
  DCP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::StatusOr<int> SelectLocalDevice() {
  int count = 0;
  const cudaError_t code = cudaGetDeviceCount(&count);
  if (code != cudaSuccess || count == 0) {
    cudaGetLastError();
    return DCP_ERROR(FailedPrecondition, "no CUDA device visible (%s)",
                     code != cudaSuccess ? cudaGetErrorString(code) : "device count 0");
  }
  int local_rank = 0;
  for (const char* variable : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "LOCAL_RANK"}) {
    if (const char* value = std::getenv(variable); value != nullptr && *value != '\0') {
      local_rank = std::atoi(value);
      break;
    }
  }
  return local_rank % count;
}

std::unique_ptr<Device> MakeCudaDevice(int device_ordinal) {
  auto device = CudaDevice::Create(device_ordinal);
  if (!device.ok()) {
    DCP_LOG(ERROR) << "MakeCudaDevice(" << device_ordinal << "): " << device.status();
    return nullptr;
  }
  return std::move(device).value();
}

}  // namespace dcp
