#include <algorithm>
#include <cstdint>

#include "attention/cuda/gemm_small_m.h"
#include "attention/cuda/gemm_small_m_kernel.cuh"
#include "attention/cuda/topk_to_slots.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/programmatic_launch.h"
#include "core/status.h"

namespace dcp::cuda {
namespace {

constexpr int64_t kMaxSharedBytes = 48 * 1024;  // the default limit: no opt-in attribute

bool Aligned(const void* pointer, int bytes) {
  return reinterpret_cast<uintptr_t>(pointer) % bytes == 0;
}

// The compiled row tile for m rows: 1, 2, 4, 8 or 16.
int RowTile(int m) {
  int tile = 1;
  while (tile < m) tile *= 2;
  return tile;
}

// Threads per row of B in the [K, N] kernel (8 columns each): about KnPreload vectors a
// thread (c = 256 * preload / k), no wider than the columns there are, within shared memory.
int ColumnThreads(const GemmParams& p) {
  const int tile = RowTile(p.m);
  const int preload = tile <= 2 ? 16 : (tile <= 4 ? 8 : 4);  // KnPreload
  int threads = 8;
  while (threads < 32 && int64_t{threads} * 2 * p.k <= int64_t{256} * preload &&
         threads * 2 * 8 <= std::max(p.n, 64) &&
         int64_t{tile} * threads * 2 * 256 <= kMaxSharedBytes) {
    threads *= 2;
  }
  return threads;
}

// Blocks of the [K, N] kernel along a row of the grid (one per column tile).
int KnTiles(const GemmParams& p) {
  const int columns = ColumnThreads(p) * 8;
  return (p.n + columns - 1) / columns;
}

// Rows of top-k -> slots blocks the launch gets for p.side_slots (one block a token).
int SlotRows(const GemmParams& p) {
  const int tiles = KnTiles(p);
  return (p.side_slots->num_tokens + tiles - 1) / tiles;
}

int64_t SharedBytes(const GemmParams& p) {
  const int64_t tile = RowTile(p.m);
  const int64_t a = tile * p.k;
  const int64_t partials = p.trans_b ? 0 : (kSmallMThreads / 32) * tile * ColumnThreads(p) * 8;
  return std::max(a, partials) * int64_t{sizeof(float)};
}

template <int MT>
absl::Status Launch(const GemmSmallMArgs& args, bool nk, dim3 grid, int64_t shared,
                    cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(kSmallMThreads);
  config.dynamicSmemBytes = static_cast<size_t>(shared);
  config.stream = stream;
  // sm_90+: a programmatic dependent launch; the weights' L2 prefetch overlaps the previous
  // kernel's tail (the kernel waits with griddepcontrol.wait before it touches A or C).
  cudaLaunchAttribute attribute;
  SetProgrammaticLaunch(&config, &attribute);
  if (nk) {
    DCP_CUDA_CHECK(cudaLaunchKernelEx(&config, GemmSmallMNkKernel<MT>, args));
    DCP_CUDA_LAUNCH_CHECK("GemmSmallMNkKernel");
  } else if (args.merge_splits > 1) {
    if constexpr (MT == 1) {
      DCP_CUDA_CHECK(cudaLaunchKernelEx(&config, GemmSmallMKnKernel<1, true>, args));
      DCP_CUDA_LAUNCH_CHECK("GemmSmallMKnKernel (merged A)");
    } else {
      return DCP_ERROR(Internal, "GemmSmallM: a merged A with a row tile of %d", MT);
    }
  } else {
    DCP_CUDA_CHECK(cudaLaunchKernelEx(&config, GemmSmallMKnKernel<MT>, args));
    DCP_CUDA_LAUNCH_CHECK("GemmSmallMKnKernel");
  }
  return absl::OkStatus();
}

}  // namespace

bool SmallMGemmCommonFits(const GemmParams& p, int max_m) {
  if (p.b_dtype != DType::kBF16) return false;
  if (p.a_dtype != DType::kBF16 && p.a_dtype != DType::kF32) return false;
  if (p.c_dtype != DType::kF32 && p.c_dtype != DType::kBF16) return false;
  if (p.trans_a || p.m < 1 || p.m > max_m || p.n < 1 || p.k < 1) return false;
  if (p.batch < 1 || p.batch > 65535) return false;  // one head per grid row
  if (p.a == nullptr || p.b == nullptr || p.c == nullptr) return false;
  if (p.lda < p.k || p.ldc < p.n || p.ldb < (p.trans_b ? p.k : p.n)) return false;
  if (p.stride_a < 0 || p.stride_b < 0 || p.stride_c < 0) return false;
  if (p.batch > 1 && p.stride_c == 0) return false;
  // 16-byte weight loads: 8 elements along B's contiguous dimension, wholly inside or outside.
  if (!Aligned(p.b, 16) || p.ldb % 8 != 0 || p.stride_b % 8 != 0) return false;
  if ((p.trans_b ? p.k : p.n) % 8 != 0) return false;
  const GemmParams::SideCopy& side = p.side;
  return side.rows <= 0 || side.row_bytes <= 0 ||
         (side.dst != nullptr && side.src != nullptr && side.dst_pitch >= side.row_bytes &&
          side.src_pitch >= side.row_bytes);
}

bool SmallMGemmFits(const GemmParams& p) {
  if (!SmallMGemmCommonFits(p, kSmallMGemmMaxM)) return false;
  if (p.merge_a.splits > 1 &&
      (p.trans_b || p.a_dtype != DType::kF32 || p.m != 1 ||
       p.merge_a.splits > kSmallMMaxMergeSplits || p.merge_a.split_stride < 0)) {
    return false;
  }
  return SharedBytes(p) <= kMaxSharedBytes;
}

bool SmallMGemmTakesSlots(const GemmParams& p) {
  const TopkToSlotsParams* slots = p.side_slots;
  return slots != nullptr && slots->valid_slots != nullptr && slots->num_tokens > 0 &&
         slots->topk_width > 0 && !p.trans_b && p.merge_a.splits <= 1 && SmallMGemmFits(p) &&
         int64_t{p.batch} + SlotRows(p) <= 65535;
}

absl::Status GemmSmallM(const GemmParams& p, cudaStream_t stream) {
  DCP_CHECK_ARG(SmallMGemmFits(p),
                "GemmSmallM: params outside the small-M kernel (m %d, n %d, k %d, batch %d, "
                "dtypes %s x %s -> %s, trans_a %d, trans_b %d, ldb %d, stride_b %d)",
                p.m, p.n, p.k, p.batch, dtype_name(p.a_dtype), dtype_name(p.b_dtype),
                dtype_name(p.c_dtype), p.trans_a, p.trans_b, p.ldb, p.stride_b);
  GemmSmallMArgs args = MakeSmallMArgs(p);
  if (p.side_slots != nullptr) {
    DCP_RETURN_IF_ERROR(CheckTopkToSlots(*p.side_slots));
    if (SmallMGemmTakesSlots(p)) {
      // The slots blocks leave the trigger to the GEMM's blocks (they exit when done).
      args.slots = MakeTopkSlotArgs(*p.side_slots, /*trigger_dependents=*/false);
      args.slot_rows = SlotRows(p);
    } else {
      DCP_RETURN_IF_ERROR(TopkToSlots(*p.side_slots, stream));  // first, in stream order
    }
  }
  if (p.merge_a.splits > 1) {
    DCP_CHECK_ARG(p.merge_a.part_lse != nullptr && p.merge_a.lse != nullptr,
                  "GemmSmallM: merge_a needs part_lse and lse");
    DCP_CHECK_ARG(p.merge_a.lse_ld >= p.batch || p.m == 1,
                  "GemmSmallM: merge_a.lse_ld %d < batch %d", p.merge_a.lse_ld, p.batch);
    args.merge_splits = p.merge_a.splits;
    args.merge_split_stride = p.merge_a.split_stride;
    args.merge_part_lse = p.merge_a.part_lse;
    args.merge_lse = p.merge_a.lse;
    args.merge_lse_ld = p.merge_a.lse_ld;
  }
  const bool nk = p.trans_b;
  args.col_threads = ColumnThreads(p);
  const int columns = args.col_threads * 8;
  const int tiles = nk ? (p.n + kNkRows - 1) / kNkRows : (p.n + columns - 1) / columns;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.batch + args.slot_rows));
  const int64_t shared = SharedBytes(p);
  switch (RowTile(p.m)) {
    case 1:
      return Launch<1>(args, nk, grid, shared, stream);
    case 2:
      return Launch<2>(args, nk, grid, shared, stream);
    case 4:
      return Launch<4>(args, nk, grid, shared, stream);
    case 8:
      return Launch<8>(args, nk, grid, shared, stream);
    case 16:
      return Launch<16>(args, nk, grid, shared, stream);
    default:
      return DCP_ERROR(Internal, "GemmSmallM: no kernel compiled for a row tile of %d (m %d)",
                       RowTile(p.m), p.m);
  }
}

}  // namespace dcp::cuda
