#include <algorithm>
#include <cstdint>

#include "attention/cuda/topk_to_slots.h"
#include "attention/cuda/topk_to_slots_kernel.cuh"
#include "core/cuda/cuda_status.h"
#include "core/cuda/programmatic_launch.h"

namespace dcp::cuda {
namespace {

__global__ void TopkToSlotsKernel(const TopkSlotArgs a) {
  TopkSlotsGridDependency(a);
  const int64_t total = int64_t(a.num_tokens) * a.width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t token =
        total <= INT32_MAX ? int64_t(uint32_t(i) / uint32_t(a.width)) : i / a.width;
    a.slots[i] = TopkPositionSlot(a, a.token_request[token], TokenOwnPosition(a, token), a.topk[i]);
  }
}

__global__ void __launch_bounds__(kCompactThreads) TopkToSlotsCompactKernel(const TopkSlotArgs a) {
  TopkSlotsGridDependency(a);
  TopkToSlotsCompactRow(a, blockIdx.x);
}

}  // namespace

absl::Status CheckTopkToSlots(const TopkToSlotsParams& p) {
  DCP_CHECK_ARG(p.num_tokens >= 0 && p.topk_width >= 0 && p.num_requests >= 0 && p.max_blocks >= 0,
                "TopkToSlots: negative size (tokens %d, topk_width %d, requests %d, blocks %d)",
                p.num_tokens, p.topk_width, p.num_requests, p.max_blocks);
  DCP_CHECK_ARG(p.topk_width <= kMaxTopkWidth, "TopkToSlots: top-k width %d, at most 2^20",
                p.topk_width);
  DCP_CHECK_ARG(p.world_size >= 1 && p.rank >= 0 && p.rank < p.world_size,
                "TopkToSlots: rank %d outside world of %d", p.rank, p.world_size);
  DCP_CHECK_ARG(p.interleave >= 1 && p.block_size >= 1,
                "TopkToSlots: interleave %d and block_size %d must be positive", p.interleave,
                p.block_size);
  DCP_CHECK_ARG((p.valid_slots == nullptr) == (p.valid_counts == nullptr),
                "TopkToSlots: valid_slots and valid_counts go together (both or neither)");
  if (int64_t(p.num_tokens) * p.topk_width == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.topk != nullptr && p.token_request != nullptr &&
                    (p.slots != nullptr || p.valid_slots != nullptr),
                "TopkToSlots: topk, token_request and slots (or valid_slots) must not be null");
  DCP_CHECK_ARG(p.max_blocks == 0 || p.block_tables != nullptr,
                "TopkToSlots: block_tables must not be null");
  return absl::OkStatus();
}

absl::Status TopkToSlots(const TopkToSlotsParams& p, cudaStream_t stream) {
  DCP_RETURN_IF_ERROR(CheckTopkToSlots(p));
  const bool compact = p.valid_slots != nullptr;
  const int64_t total = int64_t(p.num_tokens) * p.topk_width;
  if (p.num_tokens == 0) return absl::OkStatus();
  if (compact && p.topk_width == 0) {
    DCP_CUDA_CHECK(cudaMemsetAsync(p.valid_counts, 0, sizeof(int32_t) * p.num_tokens, stream));
    return absl::OkStatus();
  }
  if (total == 0) return absl::OkStatus();
  const TopkSlotArgs args = MakeTopkSlotArgs(p, EarlyTriggerEnabled());
  // sm_90+: a programmatic dependent launch (the kernels wait with griddepcontrol.wait before
  // they read anything), so this launch overlaps the previous kernel's tail.
  cudaLaunchConfig_t config = {};
  config.stream = stream;
  cudaLaunchAttribute attribute;
  SetProgrammaticLaunch(&config, &attribute);
  if (compact) {
    config.gridDim = dim3(static_cast<unsigned>(p.num_tokens));
    config.blockDim = dim3(kCompactThreads);
    DCP_CUDA_CHECK(cudaLaunchKernelEx(&config, TopkToSlotsCompactKernel, args));
    DCP_CUDA_LAUNCH_CHECK("TopkToSlotsCompactKernel");
    return absl::OkStatus();
  }
  const int grid = static_cast<int>(std::clamp<int64_t>((total + 255) / 256, 1, 132 * 32));
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(256);
  DCP_CUDA_CHECK(cudaLaunchKernelEx(&config, TopkToSlotsKernel, args));
  DCP_CUDA_LAUNCH_CHECK("TopkToSlotsKernel");
  return absl::OkStatus();
}

}  // namespace dcp::cuda
