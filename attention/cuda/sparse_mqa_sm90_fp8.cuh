// The sm_90a sparse MQA kernel's fp8_ds_mla rows (sparse_mqa_sm90_kernel.cuh): the producer
// that gathers raw 656-byte rows in place, and the consumers' in-place dequantization of a tile.
#pragma once

#include <cstdint>

#include "attention/attention_params.h"
#include "attention/cuda/sparse_mqa_sm90_gather.cuh"
#include "attention/cuda/sparse_mqa_sm90_layout.cuh"
#include "attention/cuda/sparse_mqa_work.cuh"
#include "attention/cuda/wgmma_sm90.cuh"
#include "core/cuda/fp8_e4m3.cuh"
#include "core/kv_cache_format.h"

namespace dcp::cuda {

// fp8_ds_mla rows (656 bytes: 512 e4m3 values in 4 tiles of 128, their 4 float32 scales at
// byte 512, 64 bf16 k_pe at byte 528) fill the same bf16 swizzled half buffers as bf16 rows;
// the raw bytes land in place and the consumers dequantize them there (v5, kept; v6 and v7 in
// docs/sparse_mqa_sm90.md were slower):
//   - The raw placement, per row and lane8 = position / 8 of a 16-byte slot: in each fp8 tile
//     f of a half (f0, f0 + 1; L: f0 = 0, R: f0 = 2), the 16 codes [16 lane8, +16) are values
//     128 f + 16 lane8 + i, which land in bf16 tile 2 f + lane8 / 4 as the two 16-byte chunks
//     2 (lane8 % 4) and 2 (lane8 % 4) + 1 of the row (an aligned 32-byte pair in the swizzle).
//     The raw 16 codes are cp.async'd into the first chunk of that pair; the row's 16-byte
//     scale block goes into the second chunk of lane8 0's pair in tile 2 f0; the rope (R
//     halves) is bf16 already and goes straight into tile 8.
//   - The producer (SparseMqaSm90Fp8Producer) only gathers, as for bf16 rows: thread
//     t = 8 group + lane8 issues rows group + 16 r (r < 4) and arrives on the half's ready
//     barrier with cp.async.mbarrier.arrive.noinc (128 arrivals; ready = landed), order L0,
//     R1, R0, L1, so each half's gather starts the moment the half is freed.
//   - The consumer WG that computes S on a buffer dequantizes it in place (e4m3 x scale in
//     fp32, rounded to bf16: DequantizeFp8x8ToBf16), one fp8 tile (two bf16 tiles) at a
//     time with the producer's thread geometry (Sm90Fp8ConvertTile), and issues that step's
//     wgmmas before converting the next tile, so the conversion of tile k + 1 overlaps the
//     tensor work of tile k.

// Dequantizes fp8 tile f of the landed raw rows of a K buffer in place (bf16 tiles 2 f and
// 2 f + 1), thread t of a warpgroup taking the producer thread t's slots (rows t / 8 + 16 r,
// r < 4). On the first tile of a half (first == true) the rows' scale chunks are read first
// (into `scales`: the scales of tiles f and f + 1), then a __syncwarp (the 8 threads of a row
// are in one warp) before lane8 0 overwrites the scale chunk with converted values (the raw
// codes each thread reads are its own chunk: no ordering needed there).
__device__ __forceinline__ void Sm90Fp8ConvertTile(uint32_t buffer, int f, bool first,
                                                   float (&scales)[4][2]) {
  using namespace sm90;
  constexpr int kTileBytes = 64 * 64 * 2;
  const int t = threadIdx.x % 128;
  const int group = t / 8, lane8 = t % 8;
  const uint32_t tile = buffer + (2 * f + lane8 / 4) * kTileBytes;
  const uint32_t lo = TileChunk(group, 2 * (lane8 % 4)), hi = TileChunk(group, 2 * (lane8 % 4) + 1);
  if (first) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float4 s = LdShared128f(buffer + 2 * f * kTileBytes + 2048 * r + TileChunk(group, 1));
      scales[r][0] = f == 0 ? s.x : s.z;
      scales[r][1] = f == 0 ? s.y : s.w;
    }
    __syncwarp();
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const uint4 raw = LdShared128(tile + 2048 * r + lo);
    const float scale = first ? scales[r][0] : scales[r][1];
    StShared128(tile + 2048 * r + lo, DequantizeFp8x8ToBf16(make_uint2(raw.x, raw.y), scale));
    StShared128(tile + 2048 * r + hi, DequantizeFp8x8ToBf16(make_uint2(raw.z, raw.w), scale));
  }
}

// One work item's pairs (pairs_done: the CTA's pairs before it, for the mbarrier phases);
// load_q() is called once the first pair's L0 and R1 are issued (the Q tile: the kernel's).
template <class Config, class LoadQ>
__device__ __forceinline__ void SparseMqaSm90Fp8Producer(
    const SparseMqaParams& p, const SparseMqaWork& work, int first_block, int num_pairs,
    int pairs_done, const uint32_t (&k_base)[2], uint32_t index_base, uint32_t ready_bar,
    uint32_t free_bar, const int32_t (&first_slots)[2][4], bool use_first_slots, int prefetch_pairs,
    LoadQ&& load_q) {
  using namespace sm90;
  constexpr int kTileBytes = Config::kTileBytes;
  const int t = threadIdx.x % 128;
  const int group = t / 8, lane8 = t % 8;
  const auto* kv = static_cast<const uint8_t*>(p.kv_cache);
  const int32_t* token_indices = p.indices + int64_t(work.token) * p.indices_token_stride;
  const int key_end = work.key_end;
  // This thread's shared-memory offsets inside a buffer, for row `group` (row group + 16 r is
  // 2048 r bytes further: same swizzle phase): the first chunk of its pair in tile
  // 2 f + lane8 / 4 (add 2 f tiles), the scale chunk in tile 2 f0 (add 2 f0 tiles), its rope
  // chunk in tile 8.
  const uint32_t own_lo = (lane8 / 4) * kTileBytes + TileChunk(group, 2 * (lane8 % 4));
  const uint32_t own_scale = TileChunk(group, 1);
  const uint32_t own_rope = (Config::kTiles - 1) * kTileBytes + TileChunk(group, lane8);
  const uint8_t* kv_lane = kv + 16 * lane8;  // this thread's 16 bytes of each 128-code tile
  int32_t row_slot[2][4];                    // the cache slot of each row, or -1 when skipped
  auto load_rows = [&](int which, int block, bool first) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int key = block * 64 + group + 16 * r;
      int32_t slot = -1;
      if (first) {
        slot = first_slots[which][r];
      } else if (key < key_end) {
        slot = __ldg(token_indices + key);
      }
      row_slot[which][r] = slot >= 0 && slot < p.num_slots ? slot : -1;
    }
  };
  auto issue = [&](int which, int f0, bool rope) {
    const uint32_t buffer = Opaque(k_base[which]);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int32_t slot = row_slot[which][r];
      const bool valid = slot >= 0;
      const uint8_t* src = reinterpret_cast<const uint8_t*>(Opaque(
          reinterpret_cast<uint64_t>(kv_lane + int64_t(valid ? slot : 0) * fp8_ds_mla::kRowBytes)));
      const uint32_t row = buffer + 2048 * r;
#pragma unroll
      for (int f = 0; f < 2; ++f) {
        Sm90GatherChunk(row + 2 * (f0 + f) * kTileBytes + own_lo,
                        src + (f0 + f) * fp8_ds_mla::kTileSize, valid);
      }
      if (lane8 == 0) {
        Sm90GatherChunk<false>(row + 2 * f0 * kTileBytes + own_scale,
                               src + fp8_ds_mla::kScaleOffset, valid);
      }
      if (rope) {
        Sm90GatherChunk<false>(row + own_rope, src + fp8_ds_mla::kRopeOffset, valid);
      }
    }
  };
  auto copy_indices = [&](int which, int block) {
    Sm90CopyBlockIndices(index_base, token_indices, which, block, key_end, t);
  };
  auto prefetch_pair = [&](int ahead) {
    Sm90PrefetchPairRows(kv, fp8_ds_mla::kRowBytes, fp8_ds_mla::kRowBytes, token_indices,
                         first_block, ahead, num_pairs, key_end, p.num_slots, t);
  };
  for (int ahead = 1; ahead < prefetch_pairs; ++ahead) prefetch_pair(ahead);
  // Every half only gathered (ready = landed): the consumers dequantize.
  for (int pair = 0; pair < num_pairs; ++pair) {
    const int b0 = first_block + 2 * pair, b1 = b0 + 1;
    const int free_parity = ((pairs_done + pair) & 1) ^ 1;
    load_rows(0, b0, use_first_slots && pair == 0);
    load_rows(1, b1, use_first_slots && pair == 0);
    MbarrierWait(free_bar + 8 * kL0, free_parity);
    issue(0, 0, false);
    copy_indices(0, b0);
    CpAsyncMbarrierArrive(ready_bar + 8 * kL0);
    MbarrierWait(free_bar + 8 * kR1, free_parity);
    issue(1, 2, true);
    copy_indices(1, b1);
    CpAsyncMbarrierArrive(ready_bar + 8 * kR1);
    if (pair == 0) load_q();
    MbarrierWait(free_bar + 8 * kR0, free_parity);
    issue(0, 2, true);
    CpAsyncMbarrierArrive(ready_bar + 8 * kR0);
    MbarrierWait(free_bar + 8 * kL1, free_parity);
    issue(1, 0, false);
    CpAsyncMbarrierArrive(ready_bar + 8 * kL1);
    if (prefetch_pairs > 0) prefetch_pair(pair + prefetch_pairs);
  }
}

}  // namespace dcp::cuda
