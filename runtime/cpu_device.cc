// Device on the host: plain memory and the kernels of attention/cpu and workspace/cpu.
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "attention/cpu/attention_cpu.h"
#include "attention/topk_validation.h"
#include "runtime/device.h"
#include "core/status.h"
#include "workspace/cpu/fp8_rows_cpu.h"
#include "workspace/cpu/rows_cpu.h"

namespace dcp {
namespace {

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(DType storage_dtype) : storage_dtype_(storage_dtype) {}

  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  std::string name() const override { return "cpu"; }
  DType storage_dtype() const override { return storage_dtype_; }

  absl::StatusOr<Buffer> Allocate(size_t bytes) override {
    if (bytes == 0) return Buffer(this, nullptr, 0);
    // 64-byte alignment for vector loads; size rounded up as aligned_alloc requires.
    void* data = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (data == nullptr) {
      return DCP_ERROR(ResourceExhausted, "host allocation of %d bytes failed", bytes);
    }
    return Buffer(this, data, bytes);
  }
  void Free(void* data) override { std::free(data); }

  absl::Status CopyFromHost(void* dst, const void* src, size_t bytes) override {
    return Copy(dst, src, bytes);
  }
  // A batch defers its copies to the flush, as a device with a stream may, and fills each
  // destination with 0xff bytes meanwhile (int32 -1, a float NaN): a kernel that reads one
  // before the flush computes with poison, so the tests catch an upload used too early.
  absl::Status StageToDevice(void* dst, const void* src, size_t bytes) override {
    if (!batching_ || bytes == 0) return Copy(dst, src, bytes);
    const auto* from = static_cast<const char*>(src);
    deferred_.push_back({dst, std::vector<char>(from, from + bytes)});
    std::memset(dst, 0xff, bytes);
    return absl::OkStatus();
  }
  void BeginStagingBatch() override {
    deferred_.clear();
    batching_ = true;
  }
  absl::Status FlushStagingBatch() override {
    for (const Deferred& d : deferred_) std::memcpy(d.dst, d.bytes.data(), d.bytes.size());
    DiscardStagingBatch();
    return absl::OkStatus();
  }
  void DiscardStagingBatch() override {
    deferred_.clear();
    batching_ = false;
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    return Copy(dst, src, bytes);
  }
  absl::Status Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Copy2D(void* dst, size_t dst_stride, const void* src, size_t src_stride,
                      size_t row_bytes, size_t rows) override {
    for (size_t i = 0; i < rows; ++i) {
      std::memcpy(static_cast<std::byte*>(dst) + i * dst_stride,
                  static_cast<const std::byte*>(src) + i * src_stride, row_bytes);
    }
    return absl::OkStatus();
  }
  absl::Status Memset(void* dst, int value, size_t bytes) override {
    if (bytes > 0) std::memset(dst, value, bytes);
    return absl::OkStatus();
  }
  absl::Status Convert(void* dst, DType dst_dtype, const void* src, DType src_dtype,
                       size_t count) override {
    if (dst_dtype == src_dtype) return Copy(dst, src, count * dtype_size(src_dtype));
    if (src_dtype == DType::kF32 && dst_dtype == DType::kBF16) {
      const auto* in = static_cast<const float*>(src);
      auto* out = static_cast<bf16*>(dst);
      for (size_t i = 0; i < count; ++i) out[i] = float_to_bf16(in[i]);
      return absl::OkStatus();
    }
    if (src_dtype == DType::kBF16 && dst_dtype == DType::kF32) {
      const auto* in = static_cast<const bf16*>(src);
      auto* out = static_cast<float*>(dst);
      for (size_t i = 0; i < count; ++i) out[i] = bf16_to_float(in[i]);
      return absl::OkStatus();
    }
    return DCP_ERROR(InvalidArgument, "Convert %s -> %s is not supported", dtype_name(src_dtype),
                     dtype_name(dst_dtype));
  }

  absl::Status Gemm(const GemmParams& p) override {
    if (p.side_slots != nullptr) DCP_RETURN_IF_ERROR(cpu::TopkToSlots(*p.side_slots));
    return cpu::Gemm(p);
  }
  absl::Status DenseMha(const DenseMhaParams& p) override { return cpu::DenseMha(p); }
  absl::Status SparseMqa(const SparseMqaParams& p) override { return cpu::SparseMqa(p); }
  absl::Status MergeStates(const MergeStatesParams& p) override { return cpu::MergeStates(p); }
  absl::Status DcpCorrect(const DcpCorrectParams& p) override { return cpu::DcpCorrect(p); }
  absl::Status DcpCombine(const DcpCombineParams& p) override { return cpu::DcpCombine(p); }
  absl::Status TopkToSlots(const TopkToSlotsParams& p) override { return cpu::TopkToSlots(p); }
  absl::Status BeginValidateTopk(const TopkValidateParams& p) override {
    topk_verdict_ = ValidateTopkPositions(p);
    return absl::OkStatus();
  }
  absl::Status FinishValidateTopk() override {
    return std::exchange(topk_verdict_, absl::OkStatus());
  }
  absl::Status GatherRows(const GatherRowsParams& p) override { return cpu::GatherRows(p); }
  absl::Status ScatterRows(const ScatterRowsParams& p) override { return cpu::ScatterRows(p); }
  absl::Status CopyRows(const CopyRowsParams& p) override { return cpu::CopyRows(p); }
  absl::Status WriteFp8DsMlaRows(const Fp8DsMlaWriteParams& p) override {
    return cpu::WriteFp8DsMlaRows(p);
  }
  absl::Status GatherFp8DsMlaRows(const Fp8DsMlaGatherParams& p) override {
    return cpu::GatherFp8DsMlaRows(p);
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  struct Deferred {
    void* dst;
    std::vector<char> bytes;
  };
  DType storage_dtype_;
  bool batching_ = false;
  std::vector<Deferred> deferred_;  // StageToDevice's copies in a batch
  absl::Status topk_verdict_;  // BeginValidateTopk's, until FinishValidateTopk
};

}  // namespace

std::unique_ptr<Device> MakeCpuDevice(DType storage_dtype) {
  return std::make_unique<CpuDevice>(storage_dtype);
}

}  // namespace dcp
