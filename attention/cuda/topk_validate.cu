#include <algorithm>
#include <cstdint>

#include "attention/cuda/topk_validate.h"
#include "attention/cuda/topk_validate_kernel.cuh"
#include "core/cuda/cuda_status.h"
#include "core/cuda/device_info.h"

namespace dcp::cuda {
namespace {

// The bitmap of the fast path lives in shared memory within the default 48 KB (no opt-in
// attribute needed): max_positions up to 393216, i.e. max_model_len 384k.
constexpr size_t kMaxBitmapBytes = 48 * 1024;

}  // namespace

absl::Status LaunchValidateTopk(const TopkValidateParams& p, TopkValidateRecord* record,
                                TopkValidateRecord* host_record, cudaStream_t stream) {
  DCP_CHECK_ARG(p.num_tokens >= 0 && p.topk_width >= 0,
                "ValidateTopk: negative size (tokens %d, topk_width %d)", p.num_tokens,
                p.topk_width);
  if (p.num_tokens == 0) {  // nothing to check, no pointer touched but the verdict's
    if (host_record != nullptr) host_record->first_error = ~0ull;
    return absl::OkStatus();
  }
  DCP_CHECK_ARG(record != nullptr && host_record != nullptr, "ValidateTopk: record is null");
  DCP_CHECK_ARG(p.token_position != nullptr, "ValidateTopk: token_position is null");
  DCP_CHECK_ARG(p.topk_width == 0 || p.topk != nullptr, "ValidateTopk: topk is null");
  DCP_CHECK_ARG(p.topk_token_stride >= p.topk_width,
                "ValidateTopk: topk_token_stride %d < topk_width %d", p.topk_token_stride,
                p.topk_width);
  DCP_CHECK_ARG(p.max_positions >= 1, "ValidateTopk: max_positions %d must be >= 1",
                p.max_positions);

  const size_t bitmap_bytes = (size_t(p.max_positions) + 31) / 32 * sizeof(uint32_t);
  const bool use_bitmap = bitmap_bytes <= kMaxBitmapBytes;
  const size_t shared = use_bitmap ? bitmap_bytes : 0;
  auto kernel = use_bitmap ? TopkValidateKernel<true> : TopkValidateKernel<false>;
  // About as many CTAs as fit at once (8 of 256 threads per SM; a bitmap of up to 48 KB still
  // leaves 4): each zeroes its bitmap once, then strides over the rows. No occupancy query:
  // this runs on every Forward with a top-k, and the host time is on the layer's path.
  const int grid = std::clamp(CurrentDeviceSmCount() * 8, 1, p.num_tokens);

  DCP_CUDA_CHECK(cudaMemsetAsync(record, 0xFF, sizeof(TopkValidateRecord), stream));
  kernel<<<grid, kTopkValidateThreads, shared, stream>>>(p.topk, p.token_position, p.num_tokens,
                                                         p.topk_width, p.topk_token_stride,
                                                         p.max_positions, &record->first_error);
  DCP_CUDA_LAUNCH_CHECK("TopkValidateKernel");
  DCP_CUDA_CHECK(cudaMemcpyAsync(&host_record->first_error, &record->first_error,
                                 sizeof(record->first_error), cudaMemcpyDeviceToHost, stream));
  return absl::OkStatus();
}

absl::Status TopkVerdict(const TopkValidateParams& p, TopkValidateRecord* record,
                         TopkValidateRecord& host_record, cudaStream_t stream) {
  if (p.num_tokens == 0 || host_record.first_error == ~0ull) return absl::OkStatus();
  // The error path: say what the first bad entry is (the device still holds the rows).
  TopkDescribeKernel<<<1, 1, 0, stream>>>(p.topk, p.token_position, p.topk_token_stride,
                                          p.max_positions, p.first_token, record);
  DCP_CUDA_LAUNCH_CHECK("TopkDescribeKernel");
  DCP_CUDA_CHECK(cudaMemcpyAsync(&host_record.error, &record->error, sizeof(record->error),
                                 cudaMemcpyDeviceToHost, stream));
  DCP_CUDA_CHECK(cudaStreamSynchronize(stream));
  return TopkErrorStatus(host_record.error);
}

absl::Status ValidateTopk(const TopkValidateParams& p, TopkValidateRecord* record,
                          cudaStream_t stream) {
  TopkValidateRecord host;
  DCP_RETURN_IF_ERROR(LaunchValidateTopk(p, record, &host, stream));
  DCP_CUDA_CHECK(cudaStreamSynchronize(stream));
  return TopkVerdict(p, record, host, stream);
}

}  // namespace dcp::cuda
