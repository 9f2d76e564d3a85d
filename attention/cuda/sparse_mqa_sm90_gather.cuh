// What the sm_90a sparse MQA kernel's two producers (bf16 rows in sparse_mqa_sm90_kernel.cuh,
// fp8_ds_mla rows in sparse_mqa_sm90_fp8.cuh) do alike, per thread t of the producer warpgroup.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "attention/attention_params.h"
#include "attention/cuda/mma_sm80.cuh"
#include "attention/cuda/sparse_mqa_work.cuh"
#include "attention/cuda/wgmma_sm90.cuh"

namespace dcp::cuda {

// L2 eviction priorities of the kernel's reads, as FlashMLA's sm90 sparse prefill sets them: the
// gathered rows (and their L2 prefetches) evict_last, since a token's rows are read again by its
// other head blocks and splits and, in a prefill, by the tokens near it; the Q tile evict_first
// (read once). Without them the output stream (128 KiB of fp32 a 64-head item, 268 MB for 1024
// tokens at 128 heads) pushes the rows out of L2. They do not change any result.
// **Off in the default build.** The bits of DCP_SPARSE_MQA_L2_HINTS turn them on one by one:
// kL2HintGathers the rows' cp.async, kL2HintRowPrefetch their bulk L2 prefetches, kL2HintQTile
// the Q tile's cp.async, kL2HintQPrefetch its bulk prefetch. Bits 2, 4 and 8 pass every sparse
// MQA test on the H200; bit 1 faults (illegal instruction) and is refused below. Its cause, in
// the SASS of CUDA 13.0's ptxas: a hinted cp.async whose shared destination ptxas splits into
// register + uniform base + immediate (the rows' unrolled tiles) is encoded as
// `LDGSTS [R+UR0+imm], desc[UR1]`, one uniform pair holding the base in its low word and the
// policy's high word above it: the policy's low word (zero) is overwritten by the base
// (`UMOV UR4, URZ` then `UMOV UR4, UR6` before it). Twenty lines reproduce it (an unrolled
// loop of hinted cp.async at constant shared offsets: docs/sparse_mqa_sm90.md, "L2 eviction
// hints"); neither the 64-bit shared-address form, a run-time createpolicy fraction, nor
// dropping `.L2::256B` changes that encoding. The Q tile's cp.async (a register address, no
// uniform base) encodes the policy in its own pair and works.
// Stage ab of scripts/sparse_mqa_device.sh (DCP_AB_FLAGS) builds and times one set of bits.
inline constexpr int kL2HintGathers = 1, kL2HintRowPrefetch = 2, kL2HintQTile = 4,
                     kL2HintQPrefetch = 8;
#ifdef DCP_SPARSE_MQA_L2_HINTS
inline constexpr int kSm90L2Hints = DCP_SPARSE_MQA_L2_HINTS;
#else
inline constexpr int kSm90L2Hints = 0;
#endif
template <int kBit>
inline constexpr bool kSm90L2Hint = (kSm90L2Hints & kBit) != 0;
static_assert((kSm90L2Hints & kL2HintGathers) == 0,
              "DCP_SPARSE_MQA_L2_HINTS bit 1 (hinted row gathers) compiles to an instruction that "
              "faults on the H200 with CUDA 13.0's ptxas (see above)");

// 16 bytes of a gathered row (global -> shared, zero fill when !valid), with the 256-byte L2
// prefetch (`prefetch`) or without.
template <bool kPrefetch = true>
__device__ __forceinline__ void Sm90GatherChunk(uint32_t smem, const void* global, bool valid) {
  if constexpr (kPrefetch) {
    sm90::CpAsync16Prefetch(smem, global, valid);
  } else {
    CpAsync16(smem, global, valid);
  }
}
// A row, or Q rows, into L2 (the bulk prefetch), at the rows' or Q's priority.
__device__ __forceinline__ void Sm90PrefetchRow(const void* global, uint32_t bytes) {
  if constexpr (kSm90L2Hint<kL2HintRowPrefetch>) {
    sm90::PrefetchL2BulkHint(global, bytes, sm90::L2PolicyEvictLast());
  } else {
    sm90::PrefetchL2Bulk(global, bytes);
  }
}
__device__ __forceinline__ void Sm90PrefetchQRow(const void* global, uint32_t bytes) {
  if constexpr (kSm90L2Hint<kL2HintQPrefetch>) {
    sm90::PrefetchL2BulkHint(global, bytes, sm90::L2PolicyEvictFirst());
  } else {
    sm90::PrefetchL2Bulk(global, bytes);
  }
}

// The 64 indices of `block` into index tile `which` (int32 [2][64] at index_base), for the
// consumers' masks: zero past key_end (masked there). Threads 0-63 copy, one index each.
__device__ __forceinline__ void Sm90CopyBlockIndices(uint32_t index_base,
                                                     const int32_t* token_indices, int which,
                                                     int block, int key_end, int t) {
  if (t < 64) {
    const int key = block * 64 + t;
    sm90::CpAsync4(index_base + (which * 64 + t) * 4,
                   key < key_end ? token_indices + key : token_indices, key < key_end);
  }
}

// The 128 rows of pair `ahead` (blocks first_block + 2 ahead and the next) into L2, one bulk
// prefetch of row_bytes at kv + slot * row_stride_bytes a thread (key t of the pair); nothing
// past the split's pairs, its keys, or for slots outside [0, num_slots).
__device__ __forceinline__ void Sm90PrefetchPairRows(const uint8_t* kv, int64_t row_stride_bytes,
                                                     uint32_t row_bytes,
                                                     const int32_t* token_indices, int first_block,
                                                     int ahead, int num_pairs, int key_end,
                                                     int num_slots, int t) {
  const int key = (first_block + 2 * ahead) * 64 + t;
  if (ahead >= num_pairs || key >= key_end) return;
  const int64_t slot = __ldg(token_indices + key);
  if (slot >= 0 && slot < num_slots) Sm90PrefetchRow(kv + slot * row_stride_bytes, row_bytes);
}

// The Q rows of `work` into L2 (threads t < work.heads, one bulk prefetch of row_bytes each):
// the next item's tile, which the producer loads after the consumers free the current one.
__device__ __forceinline__ void Sm90PrefetchQRows(const SparseMqaParams& p,
                                                  const SparseMqaWork& work, uint32_t row_bytes,
                                                  int t) {
  if (t >= work.heads) return;
  const auto* q = static_cast<const __nv_bfloat16*>(p.q) + int64_t(work.token) * p.q_token_stride +
                  int64_t(work.head0 + t) * p.q_head_stride;
  Sm90PrefetchQRow(q, row_bytes);
}

// The Q tile of `work` (64 rows x 576 columns as 9 swizzled 64 x 64 tiles at q_base): rows
// [0, work.heads) from q, the rest zero-filled (no read), 16-byte cp.async over kThreads
// threads (t in [0, kThreads)): the producer warpgroup (128, tracked by one cp.async mbarrier
// arrival) or both consumer warpgroups (256, the first item's tile: commit and wait).
template <class Config, int kThreads>
__device__ __forceinline__ void Sm90CopyQTile(uint32_t q_base, const SparseMqaParams& p,
                                              const SparseMqaWork& work, int t) {
  constexpr int kChunks = Config::kTiles * 8;  // 16-byte chunks of a row
  const auto* q = static_cast<const __nv_bfloat16*>(p.q) + int64_t(work.token) * p.q_token_stride +
                  int64_t(work.head0) * p.q_head_stride;
  for (int i = t; i < 64 * kChunks; i += kThreads) {
    const int row = i / kChunks, chunk = i - row * kChunks;
    const bool valid = row < work.heads;
    const uint32_t dst = q_base + (chunk / 8) * Config::kTileBytes + sm90::TileChunk(row, chunk % 8);
    const void* src = valid ? q + int64_t(row) * p.q_head_stride + chunk * 8 : q;
    if constexpr (kSm90L2Hint<kL2HintQTile>) {
      sm90::CpAsync16Hint(dst, src, valid, sm90::L2PolicyEvictFirst());
    } else {
      CpAsync16(dst, src, valid);
    }
  }
}

}  // namespace dcp::cuda
