#include <algorithm>
#include <cstdint>

#include "attention/cuda/merge_states.h"
#include "attention/cuda/merge_states_kernel.cuh"
#include "core/cuda/cuda_status.h"

namespace dcp::cuda {
namespace {

constexpr int kThreads = 256;  // 8 rows per block

int64_t BlocksFor(int64_t rows) { return (rows * 32 + kThreads - 1) / kThreads; }

absl::Status CheckSizes(const char* what, int num_tokens, int num_heads, int dim) {
  DCP_CHECK_ARG(num_tokens >= 0 && num_heads >= 0 && dim >= 0,
                "%s: negative size (tokens %d, heads %d, dim %d)", what, num_tokens, num_heads,
                dim);
  DCP_CHECK_ARG(BlocksFor(int64_t(num_tokens) * num_heads) < (int64_t(1) << 31),
                "%s: %d x %d rows is too many for one launch", what, num_tokens, num_heads);
  return absl::OkStatus();
}

}  // namespace

absl::Status MergeStates(const MergeStatesParams& p, cudaStream_t stream) {
  DCP_RETURN_IF_ERROR(CheckSizes("MergeStates", p.num_tokens, p.num_heads, p.dim));
  const int64_t rows = int64_t(p.num_tokens) * p.num_heads;
  if (rows == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.lse_a != nullptr && p.lse_b != nullptr && p.lse != nullptr,
                "MergeStates: lse_a, lse_b and lse must not be null");
  DCP_CHECK_ARG(p.dim == 0 || (p.out_a != nullptr && p.out_b != nullptr && p.out != nullptr),
                "MergeStates: out_a, out_b and out must not be null");
  MergeStatesKernel<<<BlocksFor(rows), kThreads, 0, stream>>>(p.out_a, p.lse_a, p.out_b, p.lse_b,
                                                              p.out, p.lse, rows, p.dim);
  DCP_CUDA_LAUNCH_CHECK("MergeStatesKernel");
  return absl::OkStatus();
}

absl::Status DcpCorrect(const DcpCorrectParams& p, cudaStream_t stream) {
  DCP_RETURN_IF_ERROR(CheckSizes("DcpCorrect", p.num_tokens, p.num_heads, p.dim));
  DCP_CHECK_ARG(p.world_size >= 1 && p.rank >= 0 && p.rank < p.world_size,
                "DcpCorrect: rank %d outside world of %d", p.rank, p.world_size);
  const int64_t rows = int64_t(p.num_tokens) * p.num_heads;
  if (rows == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.lse_all != nullptr, "DcpCorrect: lse_all must not be null");
  DCP_CHECK_ARG(p.dim == 0 || p.out != nullptr, "DcpCorrect: out must not be null");
  DcpCorrectKernel<<<BlocksFor(rows), kThreads, 0, stream>>>(p.out, p.lse_all, p.lse_total,
                                                             p.world_size, p.rank, rows, p.dim);
  DCP_CUDA_LAUNCH_CHECK("DcpCorrectKernel");
  return absl::OkStatus();
}

absl::Status DcpCombine(const DcpCombineParams& p, cudaStream_t stream) {
  DCP_RETURN_IF_ERROR(CheckSizes("DcpCombine", p.num_tokens, p.num_heads, p.dim));
  DCP_CHECK_ARG(p.world_size >= 1, "DcpCombine: world_size %d < 1", p.world_size);
  const int64_t rows = int64_t(p.num_tokens) * p.num_heads;
  if (rows == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.lses != nullptr, "DcpCombine: lses must not be null");
  DCP_CHECK_ARG(p.dim == 0 || (p.outs != nullptr && p.out != nullptr),
                "DcpCombine: outs and out must not be null");
  DcpCombineKernel<<<BlocksFor(rows), kThreads, 0, stream>>>(p.outs, p.lses, p.out, p.lse,
                                                             p.world_size, rows, p.dim);
  DCP_CUDA_LAUNCH_CHECK("DcpCombineKernel");
  return absl::OkStatus();
}

absl::Status MergeSplits(const float* parts, const float* part_lse, int splits, int num_tokens,
                         int num_heads, int dim, void* out, int64_t out_token_stride,
                         int64_t out_head_stride, float* lse, int64_t lse_token_stride,
                         cudaStream_t stream, bool out_bf16) {
  DCP_RETURN_IF_ERROR(CheckSizes("MergeSplits", num_tokens, num_heads, dim));
  DCP_CHECK_ARG(splits >= 1 && splits <= kMaxMergeSplits, "MergeSplits: %d splits outside [1, %d]",
                splits, kMaxMergeSplits);
  DCP_CHECK_ARG(dim % 4 == 0, "MergeSplits: dim %d is not a multiple of 4", dim);
  const int64_t rows = int64_t(num_tokens) * num_heads;
  if (rows == 0) return absl::OkStatus();
  DCP_CHECK_ARG(parts != nullptr && part_lse != nullptr && out != nullptr && lse != nullptr,
                "MergeSplits: null pointer");
  const int64_t threads = rows * std::max(dim / 4, 1);  // dim 0: one thread per row, the LSE
  DCP_CHECK_ARG(threads / kMergeSplitsThreads < (int64_t(1) << 31),
                "MergeSplits: %d x %d rows of %d is too many for one launch", num_tokens, num_heads,
                dim);
  // Four values a thread: one 16-byte (fp32) or 8-byte (bf16) store where aligned.
  const bool vector_store = reinterpret_cast<uintptr_t>(out) % (out_bf16 ? 8 : 16) == 0 &&
                            out_token_stride % 4 == 0 && out_head_stride % 4 == 0;
  cudaLaunchConfig_t config = {};
  config.gridDim =
      dim3(static_cast<unsigned>((threads + kMergeSplitsThreads - 1) / kMergeSplitsThreads));
  config.blockDim = dim3(kMergeSplitsThreads);
  config.stream = stream;
  // On sm_90+: a programmatic dependent launch (the kernel waits for the previous grid in the
  // stream with griddepcontrol.wait), so its launch overlaps the attention kernel's tail.
  cudaLaunchAttribute attribute;
  SetProgrammaticLaunch(&config, &attribute);
  DCP_CUDA_CHECK(cudaLaunchKernelEx(&config, MergeSplitsKernel, parts, part_lse, splits, num_tokens,
                                    num_heads, dim, out, out_token_stride, out_head_stride, lse,
                                    lse_token_stride, vector_store, out_bf16,
                                    EarlyTriggerEnabled()));
  DCP_CUDA_LAUNCH_CHECK("MergeSplitsKernel");
  return absl::OkStatus();
}

}  // namespace dcp::cuda
