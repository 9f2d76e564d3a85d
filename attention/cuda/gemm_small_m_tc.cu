// Launcher of the tensor-core small-M GEMM (gemm_small_m.h, gemm_small_m_tc_kernel.cuh).
#include <cstdint>

#include "attention/cuda/gemm_small_m.h"
#include "attention/cuda/gemm_small_m_tc_kernel.cuh"
#include "attention/cuda/topk_to_slots.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/programmatic_launch.h"
#include "core/status.h"

namespace dcp::cuda {
namespace {

// Opt-in shared memory per block; the H200 allows 227 KiB, the tile stays well below.
constexpr int64_t kTcMaxSharedBytes = 160 * 1024;
// Blocks wanted in flight: below this the columns per block halve (128 -> 64) so that the
// weight stream is spread over more SMs (w_uv at 128 heads: 128 blocks of 128 columns, 256 of
// 64).
constexpr int kTcMinBlocks = 256;

bool Aligned(const void* pointer, int bytes) {
  return reinterpret_cast<uintptr_t>(pointer) % bytes == 0;
}

int BlocksFor(const GemmParams& p, int nt) { return (p.n + nt - 1) / nt * p.batch; }

// Columns per block: 128 unless that leaves fewer than kTcMinBlocks blocks or overflows shared
// memory, then 64; 0 when 64 does not fit either.
int TcColumns(const GemmParams& p) {
  const bool nk = p.trans_b;
  if (BlocksFor(p, 128) >= kTcMinBlocks && TcSharedBytes(nk, p.m, p.k, 128) <= kTcMaxSharedBytes) {
    return 128;
  }
  return TcSharedBytes(nk, p.m, p.k, 64) <= kTcMaxSharedBytes ? 64 : 0;
}

template <int N8, bool NK>
absl::Status LaunchTc(const GemmSmallMArgs& args, dim3 grid, int64_t shared, cudaStream_t stream) {
  auto* kernel = GemmSmallMTcKernel<N8, NK>;
  // The attributes are set once per instantiation: the most shared memory any call may ask
  // for, and the largest shared-memory carveout (the kernel reads B through cp.async.cg, which
  // skips L1), so that two 88-KiB blocks of the w_uv shape fit an SM instead of the driver
  // choosing a split that holds one (a hypothesis for the fixed cost measured on the H200,
  // docs/engine_decode_latency.md; not measured yet).
  static const cudaError_t attribute = [&] {
    const cudaError_t size = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kTcMaxSharedBytes));
    if (size != cudaSuccess) return size;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                static_cast<int>(cudaSharedmemCarveoutMaxShared));
  }();
  DCP_CUDA_CHECK(attribute);
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(kSmallMTcThreads);
  config.dynamicSmemBytes = static_cast<size_t>(shared);
  config.stream = stream;
  cudaLaunchAttribute programmatic;
  SetProgrammaticLaunch(&config, &programmatic);
  DCP_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args));
  DCP_CUDA_LAUNCH_CHECK("GemmSmallMTcKernel");
  return absl::OkStatus();
}

}  // namespace

bool SmallMTcGemmFits(const GemmParams& p) {
  if (p.merge_a.splits > 1) return false;  // the CUDA-core kernel's feature only
  return SmallMGemmCommonFits(p, kSmallMTcGemmMaxM) && TcColumns(p) > 0;
}

absl::Status GemmSmallMTc(const GemmParams& p, cudaStream_t stream) {
  DCP_CHECK_ARG(SmallMTcGemmFits(p),
                "GemmSmallMTc: params outside the tensor-core small-M kernel (m %d, n %d, k %d, "
                "batch %d, dtypes %s x %s -> %s, trans_a %d, trans_b %d, ldb %d, stride_b %d)",
                p.m, p.n, p.k, p.batch, dtype_name(p.a_dtype), dtype_name(p.b_dtype),
                dtype_name(p.c_dtype), p.trans_a, p.trans_b, p.ldb, p.stride_b);
  if (p.side_slots != nullptr) DCP_RETURN_IF_ERROR(TopkToSlots(*p.side_slots, stream));
  GemmSmallMArgs args = MakeSmallMArgs(p);
  const int per_vector = args.a_f32 ? 4 : 8;  // elements in 16 bytes
  args.a_vector = Aligned(p.a, 16) && p.lda % per_vector == 0 && p.stride_a % per_vector == 0 &&
                  p.k % per_vector == 0;
  const int nt = TcColumns(p);
  const dim3 grid(static_cast<unsigned>((p.n + nt - 1) / nt), static_cast<unsigned>(p.batch));
  const int64_t shared = TcSharedBytes(p.trans_b, p.m, p.k, nt);
  if (nt == 128) {
    return p.trans_b ? LaunchTc<4, true>(args, grid, shared, stream)
                     : LaunchTc<4, false>(args, grid, shared, stream);
  }
  return p.trans_b ? LaunchTc<2, true>(args, grid, shared, stream)
                   : LaunchTc<2, false>(args, grid, shared, stream);
}

}  // namespace dcp::cuda
