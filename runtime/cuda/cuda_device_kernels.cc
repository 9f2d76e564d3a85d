// CudaDevice's compute entry points (runtime/device.h): each makes the device current and hands
// its params to the kernel's launcher (which checks them) on the bound stream. The prefill
// backend choice (native dense kernel or cuDNN SDPA) lives here too. Memory, copies, streams
// and marks are in cuda_device.cc.
#include <algorithm>
#include <string>

#include "attention/cuda/cudnn/dense_backend_table.h"
#include "attention/cuda/dense_mha.h"
#include "attention/cuda/gemm_cublas.h"
#include "attention/cuda/gemm_tuner.h"
#include "attention/cuda/merge_states.h"
#include "attention/cuda/sparse_mqa.h"
#include "attention/cuda/topk_to_slots.h"
#include "attention/cuda/topk_validate.h"
#include "core/cuda/convert.h"
#include "core/cuda/cuda_status.h"
#include "core/logging.h"
#include "runtime/cuda/cuda_device.h"
#include "workspace/cuda/fp8_rows_cuda.h"
#include "workspace/cuda/rows_cuda.h"

namespace dcp {

absl::Status CudaDevice::DenseMhaSupport(int qk_dim, int v_dim) const {
  if ((qk_dim == 192 && v_dim == 128) || (qk_dim == 256 && v_dim == 256)) {
    return absl::OkStatus();
  }
  return DCP_ERROR(Unimplemented,
                   "the CUDA dense MHA kernel is compiled for qk_dim / v_dim 192 / 128 and "
                   "256 / 256, not %d / %d",
                   qk_dim, v_dim);
}

absl::Status CudaDevice::SparseMqaSupport(int head_dim, int v_dim) const {
  return cuda::CheckSparseMqaSizes(head_dim, v_dim);
}

absl::Status CheckCudaLayerMemory(const void* cache_data, int64_t cache_row_bytes, const void* out,
                                  DType out_dtype) {
  DCP_CHECK_ARG(reinterpret_cast<uintptr_t>(cache_data) % 16 == 0 && cache_row_bytes % 16 == 0,
                "the KV cache must be 16-byte aligned with rows a multiple of 16 bytes apart on "
                "CUDA ranks (data %p, row stride %d bytes)",
                cache_data, cache_row_bytes);
  DCP_CHECK_ARG(out_dtype != DType::kBF16 || reinterpret_cast<uintptr_t>(out) % 4 == 0,
                "a BF16 layer output must be 4-byte aligned on CUDA ranks (out %p)", out);
  return absl::OkStatus();
}

absl::Status CudaDevice::CheckLayerMemory(const void* cache_data, int64_t cache_row_bytes,
                                          const void* out, DType out_dtype) const {
  return CheckCudaLayerMemory(cache_data, cache_row_bytes, out, out_dtype);
}

absl::Status CudaDevice::SelectPrefillBackend(const std::string& name, int num_heads, int qk_dim,
                                              int v_dim) {
  DCP_RETURN_IF_ERROR(Activate());
  if (name == "none") return absl::OkStatus();
  if (name == "native") {
    DCP_RETURN_IF_ERROR(DenseMhaSupport(qk_dim, v_dim));
    dense_backend_ = DenseBackend::kNative;
    return absl::OkStatus();
  }
  if (name != "cudnn" && name != "auto") {
    return DCP_ERROR(InvalidArgument, "unknown prefill backend '%s'", name);
  }
  absl::Status cudnn = absl::OkStatus();
  if (cudnn_ == nullptr) {
    auto created = cuda::CudnnSdpa::Create(stream_);
    if (created.ok()) {
      cudnn_ = *std::move(created);
    } else {
      cudnn = created.status();
    }
  }
  if (cudnn.ok()) cudnn = cudnn_->Supports(num_heads, qk_dim, v_dim);
  if (name == "cudnn") {
    DCP_RETURN_IF_ERROR(cudnn);
    dense_backend_ = DenseBackend::kCudnn;
    DCP_LOG(INFO) << this->name() << ": prefill backend cudnn, " << cudnn_->version();
    return absl::OkStatus();
  }
  // auto: cuDNN where it runs these sizes (per shape against native when native runs them
  // too), else native.
  const absl::Status native = DenseMhaSupport(qk_dim, v_dim);
  if (cudnn.ok()) {
    dense_backend_ = native.ok() ? DenseBackend::kAuto : DenseBackend::kCudnn;
    return absl::OkStatus();
  }
  DCP_LOG(INFO) << this->name() << ": cuDNN prefill unavailable (" << cudnn.message() << ")";
  DCP_RETURN_IF_ERROR(native);
  dense_backend_ = DenseBackend::kNative;
  return absl::OkStatus();
}

std::string CudaDevice::prefill_backend() const {
  switch (dense_backend_) {
    case DenseBackend::kNative: return "native";
    case DenseBackend::kCudnn: return "cudnn";
    case DenseBackend::kAuto: return "auto";
  }
  return "native";
}

absl::Status CudaDevice::Convert(void* dst, DType dst_dtype, const void* src, DType src_dtype,
                                 size_t count) {
  DCP_RETURN_IF_ERROR(Activate());
  return cuda::Convert(dst, dst_dtype, src, src_dtype, count, stream_);
}

absl::Status CudaDevice::Gemm(const GemmParams& params) {
  DCP_RETURN_IF_ERROR(Activate());
  return cuda::Gemm(cublas_, params, stream_, gemm_tuner_.get());
}

absl::Status CudaDevice::PrepareGemm(const GemmParams& params) {
  DCP_RETURN_IF_ERROR(Activate());
  return gemm_tuner_->Tune(params, stream_);
}

bool CudaDevice::GemmSupports(const GemmParams& params) const {
  return cuda::GemmSupports(params);
}

bool CudaDevice::GemmOverlapsSlots(const GemmParams& params) const {
  return cuda::GemmOverlapsSlots(params);
}

bool CudaDevice::UsesCudnn(const DenseMhaParams& p) const {
  if (cudnn_ == nullptr || p.dtype != DType::kBF16) return false;
  if (dense_backend_ == DenseBackend::kCudnn) return true;
  if (dense_backend_ != DenseBackend::kAuto) return false;
  const int32_t* cu_q = p.host_cu_seqlens_q;
  const int32_t* cu_k = p.host_cu_seqlens_k;
  int longest_q = 0, longest_k = 0;
  for (int s = 0; s < p.num_seqs; ++s) {
    longest_q = std::max(longest_q, cu_q[s + 1] - cu_q[s]);
    longest_k = std::max(longest_k, cu_k[s + 1] - cu_k[s]);
  }
  return cuda::PreferCudnn(
      {p.qk_dim, p.v_dim, p.num_heads, cu_q[p.num_seqs] - cu_q[0], longest_q, longest_k, p.causal});
}

absl::Status CudaDevice::PrepareDenseMha(const DenseMhaParams& params) {
  if (params.num_seqs <= 0 || params.host_cu_seqlens_q == nullptr ||
      params.host_cu_seqlens_k == nullptr || !UsesCudnn(params)) {
    return absl::OkStatus();  // the native kernel needs nothing ahead
  }
  DCP_RETURN_IF_ERROR(Activate());
  const absl::Status prepared =
      cudnn_->Prepare({params, params.host_cu_seqlens_q, params.host_cu_seqlens_k});
  // auto: a shape cuDNN declines runs natively (Run declines it again, without a build).
  if (!prepared.ok() && dense_backend_ == DenseBackend::kAuto &&
      prepared.code() == absl::StatusCode::kUnimplemented) {
    return absl::OkStatus();
  }
  return prepared;
}

absl::Status CudaDevice::DenseMha(const DenseMhaParams& params) {
  DCP_RETURN_IF_ERROR(Activate());
  DenseMhaParams p = params;
  std::vector<int32_t> copied_q, copied_k;
  if (p.num_seqs > 0 && p.cu_seqlens_q != nullptr && p.cu_seqlens_k != nullptr) {
    // The kernels trust cu_seqlens and size their grids by the longest sequence: check them
    // here on the caller's host copies (no copy back, no wait), or copy them back when there
    // are none; fill in max_seqlen_q when the caller left it 0.
    if (p.host_cu_seqlens_q == nullptr) {
      copied_q.resize(p.num_seqs + 1);
      DCP_RETURN_IF_ERROR(
          CopyToHost(copied_q.data(), p.cu_seqlens_q, copied_q.size() * sizeof(int32_t)));
      p.host_cu_seqlens_q = copied_q.data();
    }
    if (p.host_cu_seqlens_k == nullptr) {
      copied_k.resize(p.num_seqs + 1);
      DCP_RETURN_IF_ERROR(
          CopyToHost(copied_k.data(), p.cu_seqlens_k, copied_k.size() * sizeof(int32_t)));
      p.host_cu_seqlens_k = copied_k.data();
    }
    const int32_t* cu_q = p.host_cu_seqlens_q;
    const int32_t* cu_k = p.host_cu_seqlens_k;
    DCP_CHECK_ARG(cu_q[0] >= 0 && cu_k[0] >= 0, "DenseMha: cu_seqlens must start at >= 0");
    int longest_q = 0;
    for (int s = 0; s < p.num_seqs; ++s) {
      const int len_q = cu_q[s + 1] - cu_q[s], len_k = cu_k[s + 1] - cu_k[s];
      DCP_CHECK_ARG(len_q >= 0 && len_k >= 0, "DenseMha: sequence %d has negative length", s);
      DCP_CHECK_ARG(p.max_seqlen_q <= 0 || len_q <= p.max_seqlen_q,
                    "DenseMha: sequence %d has %d queries > max_seqlen_q %d", s, len_q,
                    p.max_seqlen_q);
      DCP_CHECK_ARG(p.max_seqlen_k <= 0 || len_k <= p.max_seqlen_k,
                    "DenseMha: sequence %d has %d keys > max_seqlen_k %d", s, len_k,
                    p.max_seqlen_k);
      longest_q = std::max(longest_q, len_q);
    }
    if (p.max_seqlen_q <= 0) p.max_seqlen_q = longest_q;
    if (UsesCudnn(p)) {
      DCP_RETURN_IF_ERROR(cudnn_->SetStream(stream_));
      absl::Status ran = cudnn_->Run({p, p.host_cu_seqlens_q, p.host_cu_seqlens_k});
      // auto: a shape cuDNN has no graph for (Unimplemented, nothing enqueued) runs natively.
      if (ran.ok() || dense_backend_ != DenseBackend::kAuto ||
          ran.code() != absl::StatusCode::kUnimplemented) {
        return ran;
      }
      // Once per reason (the shape recurs at every layer of every step).
      if (declined_shapes_.insert(std::string(ran.message())).second) {
        DCP_LOG(WARNING) << "cuDNN SDPA declined a shape, running the native kernel: "
                         << ran.message();
      }
    }
  }
  p.host_cu_seqlens_q = p.host_cu_seqlens_k = nullptr;  // copies may die with this frame
  return cuda::DenseMha(p, stream_);
}

int64_t CudaDevice::SparseMqaWorkspaceBytes(const SparseMqaParams& params) const {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal_) != cudaSuccess) {
    return 0;
  }
  const int splits = params.num_splits > 0
                         ? params.num_splits
                         : cuda::SparseMqaChooseSplits(params,
                                                       cuda::SparseMqaResolveKernel(params), sms);
  return cuda::SparseMqaWorkspaceBytes(params, splits);
}

absl::Status CudaDevice::SparseMqa(const SparseMqaParams& params) {
  DCP_RETURN_IF_ERROR(Activate());
  if (params.workspace != nullptr) return cuda::SparseMqa(params, stream_);
  // Split-KV partials go to a buffer of the device, grown to what this launch wants.
  SparseMqaParams p = params;
  int sms = 0;
  DCP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal_));
  const int splits = p.num_splits > 0
                         ? p.num_splits
                         : cuda::SparseMqaChooseSplits(p, cuda::SparseMqaResolveKernel(p), sms);
  const int64_t bytes = cuda::SparseMqaWorkspaceBytes(p, splits);
  if (bytes > mqa_workspace_bytes_) {
    if (mqa_workspace_ != nullptr) {
      DCP_CUDA_CHECK(cudaStreamSynchronize(stream_));  // earlier launches may still use it
      DCP_CUDA_CHECK(cudaFree(mqa_workspace_));
      mqa_workspace_ = nullptr;
      mqa_workspace_bytes_ = 0;
    }
    DCP_CUDA_CHECK(cudaMalloc(&mqa_workspace_, bytes));
    mqa_workspace_bytes_ = bytes;
  }
  p.workspace = mqa_workspace_;
  p.workspace_bytes = mqa_workspace_bytes_;
  return cuda::SparseMqa(p, stream_);
}

absl::Status CudaDevice::MergeStates(const MergeStatesParams& params) {
  DCP_RETURN_IF_ERROR(Activate());
  return cuda::MergeStates(params, stream_);
}

absl::Status CudaDevice::DcpCorrect(const DcpCorrectParams& params) {
  DCP_RETURN_IF_ERROR(Activate());
  return cuda::DcpCorrect(params, stream_);
}

absl::Status CudaDevice::DcpCombine(const DcpCombineParams& params) {
  DCP_RETURN_IF_ERROR(Activate());
  return cuda::DcpCombine(params, stream_);
}

absl::Status CudaDevice::TopkToSlots(const TopkToSlotsParams& params) {
  DCP_RETURN_IF_ERROR(Activate());
  return cuda::TopkToSlots(params, stream_);
}

absl::Status CudaDevice::BeginValidateTopk(const TopkValidateParams& params) {
  DCP_RETURN_IF_ERROR(Activate());
  DCP_CHECK_ARG(!topk_pending_, "BeginValidateTopk: the previous check was never finished");
  if (topk_record_ == nullptr) {
    DCP_CUDA_CHECK(cudaMalloc(&topk_record_, sizeof(cuda::TopkValidateRecord)));
  }
  if (topk_host_record_ == nullptr) {
    DCP_CUDA_CHECK(cudaMallocHost(&topk_host_record_, sizeof(cuda::TopkValidateRecord)));
  }
  if (topk_verdict_ == nullptr) {
    DCP_CUDA_CHECK(cudaEventCreateWithFlags(&topk_verdict_, cudaEventDisableTiming));
  }
  DCP_RETURN_IF_ERROR(cuda::LaunchValidateTopk(
      params, static_cast<cuda::TopkValidateRecord*>(topk_record_),
      static_cast<cuda::TopkValidateRecord*>(topk_host_record_), stream_));
  DCP_CUDA_CHECK(cudaEventRecord(topk_verdict_, stream_));
  topk_params_ = params;
  topk_pending_ = true;
  return absl::OkStatus();
}

absl::Status CudaDevice::FinishValidateTopk() {
  DCP_CHECK_ARG(topk_pending_, "FinishValidateTopk: no check was begun");
  topk_pending_ = false;
  DCP_RETURN_IF_ERROR(Activate());
  DCP_CUDA_CHECK(cudaEventSynchronize(topk_verdict_));
  return cuda::TopkVerdict(topk_params_, static_cast<cuda::TopkValidateRecord*>(topk_record_),
                           *static_cast<cuda::TopkValidateRecord*>(topk_host_record_), stream_);
}

absl::Status CudaDevice::GatherRows(const GatherRowsParams& params) {
  DCP_RETURN_IF_ERROR(Activate());
  return cuda::GatherRows(params, stream_);
}

absl::Status CudaDevice::ScatterRows(const ScatterRowsParams& params) {
  DCP_RETURN_IF_ERROR(Activate());
  return cuda::ScatterRows(params, stream_);
}

absl::Status CudaDevice::CopyRows(const CopyRowsParams& params) {
  DCP_RETURN_IF_ERROR(Activate());
  return cuda::CopyRows(params, stream_);
}

absl::Status CudaDevice::WriteFp8DsMlaRows(const Fp8DsMlaWriteParams& params) {
  DCP_RETURN_IF_ERROR(Activate());
  return cuda::WriteFp8DsMlaRows(params, stream_);
}

absl::Status CudaDevice::GatherFp8DsMlaRows(const Fp8DsMlaGatherParams& params) {
  DCP_RETURN_IF_ERROR(Activate());
  return cuda::GatherFp8DsMlaRows(params, stream_);
}

}  // namespace dcp
