// Sparse top-k MQA on sm_90a: a warp-specialised wgmma kernel on the design of FlashMLA's sm90
// sparse prefill (our own code, raw PTX through wgmma_sm90.cuh; no CuTe).
//
// One work item = one token x 64 query heads (or 16 / 32, SparseMqaSplit::block_heads: the
// tile's other rows are zeros) x one split of the token's key list (sparse_mqa_work.cuh), walked
// in pairs of 64-key blocks (b0, b1). A CTA does one item, or with a grid smaller than the items
// (SparseMqaSplit::persistent_ctas) items blockIdx.x, + gridDim.x, ...: the mbarrier phases run
// on across items, and the producer gathers the next item's first halves and loads its Q tile
// (once the consumers free it, q_free, after their last pair; the first item's Q tile the
// consumers load) under the current item's last PV and epilogue. 384 threads in three
// warpgroups:
//   WG2, the producer (setmaxnreg 56 registers): gathers the 576-wide bf16 rows of both blocks
//     with 16-byte cp.async (L2 256-byte prefetch, zero fill for skipped rows, no read) into
//     two K buffers of 9 swizzled 64 x 64 tiles, and the blocks' indices (for the masks), each
//     buffer in two halves with their own mbarriers: L = tiles 0-3 (value columns 0-255),
//     R = tiles 4-8 (value columns 256-511 and the rope part). Order per pair: L0, R1, R0, L1.
//     After a pair's last half it prefetches the rows of the pair SparseMqaSplit::
//     prefetch_pairs ahead into L2 (one bulk prefetch a row), so the refills that wait for a
//     half to free read L2, not HBM (a steady-state pair waited ~1.8 us for its refill).
//   WG0 / WG1, the consumers (setmaxnreg 224): WG0 computes S0 = Q K0^T (block b0), WG1
//     S1 = Q K1^T (block b1), 36 wgmma m64n64k16 each, K = 576 (WG0 starts on L0, WG1 on R1,
//     so each starts while its other half still lands). Row maxima are exchanged through
//     shared memory (both WGs then hold the same running max, which moves only when a pair's
//     max passes it by more than SparseMqaSplit::rescale_slack), P = 2^(S - m) goes to registers
//     (bf16, the A operand of the next wgmma) and to shared memory for the other WG. WG0 owns
//     output columns 0-255, WG1 256-511: O_w += P_own V_own[:, half] (wgmma RS, m64n256k16)
//     (issued before the P hand-off) + P_other V_other[:, half] (SS). A half buffer is released
//     (free mbarrier) as soon as its last reader's wgmma retires: L0 by WG0 after its own PV, R1 by
//     WG1 after its own PV, then L1 (WG0) and R0 (WG1) after the cross PV, so the producer refills
//     L0 and R1 while the cross products run.
// That is the pairs schedule. kRoles (SparseMqaSplit::roles, bf16 rows) runs the roles schedule
// instead (sparse_mqa_sm90_roles.cuh): WG0 scores every block and runs the softmax, WG1 only
// its half of P V; the producer then fills L0, R0, L1, R1 and the R halves are freed by both.
// Split keys (SparseMqaSplit): each CTA writes its normalised partial and LSE for MergeSplits,
// or, with SparseMqaSplit::cluster_merge, the splits of a (token, head block) are one cluster
// and merge in the epilogue through distributed shared memory (sparse_mqa_sm90_cluster_merge.cuh).
// Each epilogue (Sm90Epilogue: fp32 rows, bf16 rows at one split, the cluster merge) is an
// instantiation of its own: compiled into one kernel behind run-time flags, the unused ones
// slowed the launches that never took them (docs/sparse_mqa_sm90.md, "An instantiation of its
// own").
// Shared memory: Q (9 tiles, 72 KiB), K0 and K1 (72 KiB each), P1 (8 KiB; P0 overwrites K0's
// rope tile, no longer needed after S0), indices, maxima and sums: about 226 KiB, one CTA/SM.
// Heads past num_heads are zero rows (computed, not stored): any head count works; below 64
// heads the tile is padded.
// Masking: a key is valid when its position is in [key_begin, key_end) and its index in
// [0, num_slots); invalid keys score -inf. Rows that see no key end with l = 0: out 0, lse -inf.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "attention/attention_params.h"
#include "attention/cuda/mma_sm80.cuh"
#include "attention/cuda/sparse_mqa.h"
#include "attention/cuda/sparse_mqa_sm90_cluster_merge.cuh"
#include "attention/cuda/sparse_mqa_sm90_fp8.cuh"
#include "attention/cuda/sparse_mqa_sm90_gather.cuh"
#include "attention/cuda/sparse_mqa_sm90_layout.cuh"
#include "attention/cuda/sparse_mqa_sm90_roles.cuh"
#include "attention/cuda/sparse_mqa_sm90_softmax.cuh"
#include "attention/cuda/sparse_mqa_sm90_trace.cuh"
#include "attention/cuda/sparse_mqa_work.cuh"
#include "attention/cuda/wgmma_sm90.cuh"
#include "core/cuda/cuda_status.h"
#include "core/cuda/programmatic_launch.h"
#include "core/kv_cache_format.h"

namespace dcp::cuda {

// A measurement build only (-DDCP_SPARSE_MQA_NO_GATHER, scripts/sparse_mqa_device.sh stage
// nogather): the bf16 producer zero-fills every row instead of reading the cache (results are
// wrong), so the kernel's time is that of its consumers with the gather's global traffic gone.
#if defined(DCP_SPARSE_MQA_NO_GATHER)
inline constexpr bool kSm90NoGather = true;
#else
inline constexpr bool kSm90NoGather = false;
#endif
// A measurement build only (-DDCP_SPARSE_MQA_NO_O_STORE, stage ab): the fp32 and bf16
// epilogues skip the O rows' stores at run time (the LSE is still written; results are wrong),
// so the kernel's time is what it would be with the output's writes gone: the most any change
// to the O store could save.
#if defined(DCP_SPARSE_MQA_NO_O_STORE)
inline constexpr bool kSm90NoOStore = true;
#else
inline constexpr bool kSm90NoOStore = false;
#endif

template <int kHeadDim, int kVDim, KvCacheDType kFormat,
          Sm90Epilogue kEpilogue = Sm90Epilogue::kF32, bool kRoles = false>
__global__ void __launch_bounds__(384, 1)
    SparseMqaSm90Kernel(const SparseMqaParams p, const SparseMqaSplit split) {
  static_assert(!kRoles || (kFormat == KvCacheDType::kBF16 && kEpilogue != Sm90Epilogue::kCluster),
                "the roles schedule is compiled for bf16 rows with the fp32 or bf16 epilogue");
#if SPARSE_MQA_SM90_ENABLED
  using namespace sm90;
  using Config = SparseMqaSm90Config<kHeadDim, kVDim>;
  constexpr int kTiles = Config::kTiles, kLeftTiles = Config::kLeftTiles;
  constexpr int kTileBytes = Config::kTileBytes;
  constexpr float kNegInf = -INFINITY;

  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_base = SmemAddress(smem_raw);
  const uint32_t base = (raw_base + 1023) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw_base);
  const uint32_t q_base = base + Config::kQOffset;
  const uint32_t k_base[2] = {base + Config::kKOffset,
                              base + Config::kKOffset + Config::kBufferBytes};
  const uint32_t p1_base = base + Config::kP1Offset;
  const uint32_t p0_base = k_base[0] + (kTiles - 1) * kTileBytes;  // K0's rope tile
  const int32_t* s_index = reinterpret_cast<const int32_t*>(smem + Config::kIndexOffset);
  const uint32_t index_base = base + Config::kIndexOffset;
  float* s_max = reinterpret_cast<float*>(smem + Config::kMaxOffset);
  float* s_sum = reinterpret_cast<float*>(smem + Config::kSumOffset);
  const uint32_t ready_bar = base + Config::kBarrierOffset;  // + 8 * half
  const uint32_t free_bar = ready_bar + 4 * 8;
  const uint32_t q_ready_bar = ready_bar + 8 * 8, q_free_bar = q_ready_bar + 8;
  const uint32_t p_ready_bar = q_free_bar + 8;  // + 8 * buffer (the roles schedule)

  // This grid is itself launched as a programmatic dependent of the previous kernel in the
  // stream (LaunchSparseMqaSm90): nothing global (valid_counts, indices, q, cache, outputs) is
  // touched before griddepcontrol.wait returns, i.e. before that kernel has finished and its
  // writes are visible; only this CTA's launch overlaps it.
  namespace trace = sm90_trace;
  DCP_SM90_TRACE(threadIdx.x == 0, trace::kClockStart);
  DCP_SM90_TRACE(threadIdx.x == 0, trace::kGlobalStart);
  GridDependencyWait();
  // Work items blockIdx.x, + gridDim.x, ... (one, unless SparseMqaSplit::persistent_ctas made
  // the grid smaller than the items): an item's work, its first 64-key block and its pairs.
  const int items = static_cast<int>(SparseMqaItems(p, split.num_splits, split.block_heads));
  auto item_of = [&](int item, SparseMqaWork& work, int& first_block, int& num_pairs)
      __attribute__((always_inline)) {
    work = GetSparseMqaWork<unsigned, kEpilogue == Sm90Epilogue::kCluster>(
        p, split, split.block_heads, Config::kBlockKeys, /*block_align=*/2, unsigned(item));
    first_block = work.key_begin / Config::kBlockKeys;
    num_pairs =
        ((work.key_end - work.key_begin + Config::kBlockKeys - 1) / Config::kBlockKeys + 1) / 2;
  };
  // The roles schedule's warpgroups run different wgmma code: there the index goes through a
  // shuffle, so that ptxas sees it warp-uniform and the branch on it not divergent (else it
  // serialises every wgmma, C7518). The pairs schedule keeps the plain index (its code as
  // measured).
  const int warpgroup = kRoles
                            ? __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0)
                            : static_cast<int>(threadIdx.x / 128);
  const int t = threadIdx.x % 128;

  // The first pair's slots, loaded by the producer before the barrier below: the consumers
  // issue the Q tile (4608 cp.async) after it, and index loads queued behind those held the
  // first gather back to ~2.9 us in the one-token decode (a trace, docs/sparse_mqa_sm90.md).
  // Row group + 16 r of block first_block + which (the producer's thread geometry); -1 past
  // the split's keys.
  int32_t first_slots[2][4];
  if (warpgroup == 2) {
    SparseMqaWork work;
    int first_block, num_pairs;
    item_of(blockIdx.x, work, first_block, num_pairs);
    const int32_t* token_indices = p.indices + int64_t(work.token) * p.indices_token_stride;
#pragma unroll
    for (int which = 0; which < 2; ++which) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int key = (first_block + which) * Config::kBlockKeys + t / 8 + 16 * r;
        first_slots[which][r] = key < work.key_end ? __ldg(token_indices + key) : -1;
      }
    }
  }
  if (threadIdx.x == 0) {
    for (int half = 0; half < 4; ++half) {
      MbarrierInit(ready_bar + 8 * half, 128);  // the producer's 128 cp.async arrivals
      // The one consumer WG that reads it last; in the roles schedule both WGs read the R halves
      // (WG1 its values, WG0 the P it leaves in the rope tile).
      MbarrierInit(free_bar + 8 * half, kRoles && (half == kR0 || half == kR1) ? 256 : 128);
    }
    MbarrierInit(q_ready_bar, 128);  // the producer's 128 cp.async arrivals
    MbarrierInit(q_free_bar, 256);   // both consumer WGs, after an item's last pair
    if constexpr (kRoles) {
      MbarrierInit(p_ready_bar, 128);  // WG0, once P of the block in K0 is written
      MbarrierInit(p_ready_bar + 8, 128);
    }
    FenceMbarrierInit();
  }
  __syncthreads();
  DCP_SM90_TRACE(threadIdx.x == 0, trace::kInitDone);
  // Let our programmatic dependent (the split merge, MergeSplits) launch: it waits for this
  // whole grid with griddepcontrol.wait, so only its launch and scheduling overlap this one.
  TriggerDependents();

  // The Q tile of a CTA's first item is loaded by the consumers, beside the producer's first
  // gathers (a decode CTA has one item: its latency). The producer loads it for the later
  // items with pairs, once their first pair's L0 and R1 are issued and the consumers have
  // freed the previous tile (q_free: after an item's last pair), so the load runs under their
  // epilogue while the next item's first halves land; the consumers wait for q_ready.
  int q_users = 0;  // producer: the items with pairs before this one (q_free's phases)
  auto load_q = [&](const SparseMqaWork& work, bool first_item) __attribute__((always_inline)) {
    if (first_item) return;
    if (q_users > 0) MbarrierWait(q_free_bar, (q_users - 1) & 1);
    Sm90CopyQTile<Config, 128>(q_base, p, work, t);
    CpAsyncMbarrierArrive(q_ready_bar);
  };
  if constexpr (kFormat == KvCacheDType::kFp8DsMla) {
    if (warpgroup == 2) {
      // ----------------------------------------------------- producer, fp8_ds_mla rows
      RegistersDecrease<56>();
      int pairs_done = 0;
      for (int item = blockIdx.x; item < items; item += gridDim.x) {
        SparseMqaWork work;
        int first_block, num_pairs;
        item_of(item, work, first_block, num_pairs);
        const bool first_item = item == blockIdx.x;
        SparseMqaSm90Fp8Producer<Config>(p, work, first_block, num_pairs, pairs_done, k_base,
                                         index_base, ready_bar, free_bar, first_slots, first_item,
                                         split.prefetch_pairs, [&] { load_q(work, first_item); });
        pairs_done += num_pairs;
        q_users += num_pairs > 0;
      }
      CpAsyncWaitAll();
      return;
    }
  } else if (warpgroup == 2) {
    // ---------------------------------------------------------------- producer
    RegistersDecrease<56>();
    DCP_SM90_TRACE(t == 0, trace::kProducerRegs);
    // Thread t copies chunk t % 8 of each 128-byte tile row of rows (t / 8) + 16 r, r < 4:
    // 8 consecutive threads read one contiguous 128 bytes.
    const int group = t / 8, lane8 = t % 8;
    const auto* kv = static_cast<const __nv_bfloat16*>(p.kv_cache);
    int pairs_done = 0;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
      SparseMqaWork work;
      int first_block, num_pairs;
      item_of(item, work, first_block, num_pairs);
      const bool first_item = item == blockIdx.x;
      const int32_t* token_indices = p.indices + int64_t(work.token) * p.indices_token_stride;
      const int key_end = work.key_end;
      int64_t row_offset[2][4];  // element offset of each row's chunk, or -1 when skipped
      auto load_rows = [&](int which, int block, bool first) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int key = block * 64 + group + 16 * r;
          int64_t slot = -1;
          if (first) {
            slot = first_slots[which][r];
          } else if (key < key_end) {
            slot = __ldg(token_indices + key);
          }
          row_offset[which][r] =
              slot >= 0 && slot < p.num_slots ? slot * p.kv_row_stride + lane8 * 8 : -1;
        }
      };
      auto copy_tiles = [&](int which, int tile_begin, int tile_end) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const uint32_t dst = Opaque(k_base[which] + TileChunk(group + 16 * r, lane8));
          const int64_t offset = row_offset[which][r];
          const bool valid = offset >= 0 && !kSm90NoGather;
          const __nv_bfloat16* src = valid ? kv + offset : kv;
#pragma unroll
          for (int tile = tile_begin; tile < tile_end; ++tile) {
            Sm90GatherChunk(dst + tile * kTileBytes, valid ? src + tile * 64 : kv, valid);
          }
        }
      };
      auto copy_indices = [&](int which, int block) {
        Sm90CopyBlockIndices(index_base, token_indices, which, block, key_end, t);
      };
      auto prefetch_pair = [&](int ahead) {
        Sm90PrefetchPairRows(static_cast<const uint8_t*>(p.kv_cache), p.kv_row_stride * 2,
                             kHeadDim * 2, token_indices, first_block, ahead, num_pairs, key_end,
                             p.num_slots, t);
      };
      for (int ahead = 1; ahead < split.prefetch_pairs; ++ahead) prefetch_pair(ahead);
      // Persistent CTAs: the next item's Q rows and first pair into L2 once this item's last
      // pair prefetch is issued (the pair prefetch_pairs before its end), so that its Q load
      // and first gathers, issued under this item's last blocks and epilogue, hit L2.
      const int next_item = item + gridDim.x;
      const int prefetch_next_at =
          split.prefetch_next_item && split.prefetch_pairs > 0 && next_item < items
              ? max(num_pairs - split.prefetch_pairs, 0)
              : -1;
      auto prefetch_next = [&]() {
        SparseMqaWork next;
        int next_first_block, next_pairs;
        item_of(next_item, next, next_first_block, next_pairs);
        if (next_pairs == 0) return;
        Sm90PrefetchQRows(p, next, kHeadDim * 2, t);
        Sm90PrefetchPairRows(static_cast<const uint8_t*>(p.kv_cache), p.kv_row_stride * 2,
                             kHeadDim * 2, p.indices + int64_t(next.token) * p.indices_token_stride,
                             next_first_block, 0, next_pairs, next.key_end, p.num_slots, t);
      };
      for (int pair = 0; pair < num_pairs; ++pair) {
        const int b0 = first_block + 2 * pair, b1 = b0 + 1;
        const int free_parity = ((pairs_done + pair) & 1) ^ 1;
        const bool traced = first_item && t == 0 && pair < trace::kPairs;
        (void)traced;
        load_rows(0, b0, first_item && pair == 0);
        load_rows(1, b1, first_item && pair == 0);
        if constexpr (kRoles) {
          // The roles schedule scores the blocks one after the other: L0, R0, L1, R1, each
          // block's indices with its L half (half: Sm90Half of buffer `which`).
          auto fill = [&](int which, int half, int block) {
            MbarrierWait(free_bar + 8 * half, free_parity);
            const bool left = half == kL0 || half == kL1;
            copy_tiles(which, left ? 0 : kLeftTiles, left ? kLeftTiles : kTiles);
            if (left) copy_indices(which, block);
            CpAsyncMbarrierArrive(ready_bar + 8 * half);
          };
          fill(0, kL0, b0);
          fill(0, kR0, b0);
          if (pair == 0) load_q(work, first_item);
          fill(1, kL1, b1);
          fill(1, kR1, b1);
          if (split.prefetch_pairs > 0) prefetch_pair(pair + split.prefetch_pairs);
          if (pair == prefetch_next_at) prefetch_next();
          continue;
        }
        MbarrierWait(free_bar + 8 * kL0, free_parity);
        DCP_SM90_TRACE(traced, trace::kProducerBase + 5 * pair);
        copy_tiles(0, 0, kLeftTiles);
        copy_indices(0, b0);
        CpAsyncMbarrierArrive(ready_bar + 8 * kL0);
        DCP_SM90_TRACE(traced, trace::kProducerBase + 5 * pair + 1);
        MbarrierWait(free_bar + 8 * kR1, free_parity);
        copy_tiles(1, kLeftTiles, kTiles);
        copy_indices(1, b1);
        CpAsyncMbarrierArrive(ready_bar + 8 * kR1);
        DCP_SM90_TRACE(traced, trace::kProducerBase + 5 * pair + 2);
        if (pair == 0) load_q(work, first_item);
        MbarrierWait(free_bar + 8 * kR0, free_parity);
        copy_tiles(0, kLeftTiles, kTiles);
        CpAsyncMbarrierArrive(ready_bar + 8 * kR0);
        DCP_SM90_TRACE(traced, trace::kProducerBase + 5 * pair + 3);
        MbarrierWait(free_bar + 8 * kL1, free_parity);
        copy_tiles(1, 0, kLeftTiles);
        CpAsyncMbarrierArrive(ready_bar + 8 * kL1);
        DCP_SM90_TRACE(traced, trace::kProducerBase + 5 * pair + 4);
        // While this pair is consumed (~5 us a pair), a later pair's rows come into L2: its
        // refills, issued when the halves free, then wait for L2 rather than HBM.
        if (split.prefetch_pairs > 0) prefetch_pair(pair + split.prefetch_pairs);
        if (pair == prefetch_next_at) prefetch_next();
      }
      pairs_done += num_pairs;
      q_users += num_pairs > 0;
    }  // items
    CpAsyncWaitAll();
    return;
  }

  // ------------------------------------------------------------------ consumers
  RegistersIncrease<224>();  // 2 x 224 + 56 = 504 = 3 x 168, the launch's
  DCP_SM90_TRACE(threadIdx.x == 0, trace::kConsumerRegs);
  const int wg = warpgroup;  // 0 or 1: owns block b0 + wg and value columns [256 wg, 256 wg + 256)
  const int warp = t / 32, lane = t % 32;
  const int g = lane / 4, c = lane % 4;
  const int rows[2] = {warp * 16 + g, warp * 16 + g + 8};

  const float scale_log2 = p.scale * 1.4426950408889634f;
  const uint32_t own_k = k_base[wg], other_k = k_base[wg ^ 1];
  const uint32_t own_p = wg == 0 ? p0_base : p1_base, other_p = wg == 0 ? p1_base : p0_base;
  const int own_first_half = wg == 0 ? kL0 : kR1, own_second_half = wg == 0 ? kR0 : kL1;
  const int first_tile = wg == 0 ? 0 : kLeftTiles;                      // WG1 starts on its R half
  const uint32_t value_tile = (wg == 0 ? 0 : kLeftTiles) * kTileBytes;  // this WG's V columns

  int pairs_done = 0;  // pairs of the earlier items (the half mbarriers' phases)
  int q_loads = 0;     // Q tiles the producer loaded for this CTA so far (q_ready's phases)
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    SparseMqaWork work;
    int first_block, num_pairs;
    item_of(item, work, first_block, num_pairs);
    const bool first_item = item == blockIdx.x;
    (void)first_item;
    // The Q tile: 64 rows x 72 chunks; rows past work.heads (a head block of 16 or 32, or past
    // num_heads) are zeros. The first item's loaded here over the 256 consumer threads, a later
    // one's by the producer (made visible to wgmma by the proxy fence after the first half).
    if (num_pairs > 0 && first_item) {
      Sm90CopyQTile<Config, 256>(q_base, p, work, threadIdx.x);
      CpAsyncCommit();
      CpAsyncWait<0>();
      FenceProxyAsync();
      NamedBarrierSync(kBarQ, 256);
    } else if (num_pairs > 0) {
      MbarrierWait(q_ready_bar, q_loads & 1);
      ++q_loads;
    }
    DCP_SM90_TRACE(first_item && threadIdx.x == 0, trace::kQReady);

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    float m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};

    if constexpr (kRoles) {
      const Sm90RolesShared roles_shared{
          q_base, {k_base[0], k_base[1]}, s_index, s_max, s_sum, ready_bar, free_bar, p_ready_bar};
      if (wg == 0) {
        Sm90RolesScore<Config>(roles_shared, o, m, l, first_block, num_pairs, pairs_done, work.key_end,
                               p.num_slots, scale_log2, split.rescale_slack, first_item, t);
      } else {
        Sm90RolesPv<Config>(roles_shared, o, l, num_pairs, pairs_done, first_item, t);
      }
    }
    for (int pair = 0; pair < (kRoles ? 0 : num_pairs); ++pair) {
      const int ready_parity = (pairs_done + pair) & 1;
      const int block = first_block + 2 * pair + wg;
      // This WG's trace mark of an event of this pair (a profiling build only).
      const bool traced = first_item && t == 0 && pair < trace::kPairs;
      const int pair_mark = trace::kPairBase + (wg * trace::kPairs + pair) * trace::kPairMarks;
      (void)traced;
      (void)pair_mark;

      // S = Q K^T over the 9 tiles, starting with the half that lands first.
      float s[32];
      const uint64_t q_desc = Opaque(MakeDesc(q_base, 16, 1024));
      const uint64_t k_desc = Opaque(MakeDesc(own_k, 16, 1024));
      if constexpr (kFormat == KvCacheDType::kFp8DsMla) {
        // fp8 rows: four steps, one fp8 tile f each (WG0 f = 0, 1 | 2, 3; WG1 f = 2, 3 |
        // 0, 1): wait for the half on its first tile, dequantize f in place (bf16 tiles 2 f,
        // 2 f + 1), publish it to this WG's wgmma (fence + 128-thread barrier), issue those
        // tiles' wgmmas without waiting for them: the next step's conversion runs while they
        // execute. The rope tile 8 after the first half (WG0: once R0 has landed). Tile order
        // WG0 0-3, 8, 4-7, WG1 4-7, 8, 0-3, as for bf16 rows (the tests compare both bit for
        // bit). Straight-line code for both WGs.
        float scales[4][2];
        const int first_f = wg == 0 ? 0 : 2;
        MbarrierWait(ready_bar + 8 * own_first_half, ready_parity);
        DCP_SM90_TRACE(traced, pair_mark + trace::kFirstHalf);
#pragma unroll
        for (int step = 0; step < 4; ++step) {
          const int f = (first_f + step) % 4;
          Sm90Fp8ConvertTile(own_k, f, step % 2 == 0, scales);
          FenceProxyAsync();
          NamedBarrierSync(kBarConvert + wg, 128);
          WgmmaFence();
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int tile = 2 * f + i;
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
              const uint32_t k_step = (tile * kTileBytes + ks * 32) >> 4;
              WgmmaM64N64K16SS(s, q_desc + k_step, k_desc + k_step,
                               (step > 0 || i > 0 || ks > 0) ? 1 : 0);
            }
          }
          WgmmaCommit();
          if (step == 1) {
            MbarrierWait(ready_bar + 8 * own_second_half, ready_parity);
            DCP_SM90_TRACE(traced, pair_mark + trace::kSecondHalf);
            FenceProxyAsync();
            WgmmaFence();
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
              const uint32_t k_step = ((kTiles - 1) * kTileBytes + ks * 32) >> 4;
              WgmmaM64N64K16SS(s, q_desc + k_step, k_desc + k_step, 1);
            }
            WgmmaCommit();
          }
        }
      } else {
        // WG0 walks tiles 0-3, 8, 4-7 and WG1 4-7, 8, 0-3: the rope tile fifth for both, as in
        // the fp8 path, which must sum in the same order (its tests are bit-exact against this
        // one). The same straight-line code for both WGs (a branch between wgmmas serialises
        // them): WG0 waits for R0 before the rope tile, WG1 for L1 one tile earlier than it must.
        MbarrierWait(ready_bar + 8 * own_first_half, ready_parity);
        DCP_SM90_TRACE(traced, pair_mark + trace::kFirstHalf);
        FenceProxyAsync();
        WgmmaFence();
#pragma unroll
        for (int i = 0; i < kTiles; ++i) {
          if (i == kLeftTiles) {
            WgmmaCommit();
            MbarrierWait(ready_bar + 8 * own_second_half, ready_parity);
            DCP_SM90_TRACE(traced, pair_mark + trace::kSecondHalf);
            FenceProxyAsync();
            WgmmaFence();
          }
          const int tile = i < kLeftTiles    ? first_tile + i
                           : i == kLeftTiles ? kTiles - 1
                                             : (first_tile ^ kLeftTiles) + i - kLeftTiles - 1;
#pragma unroll
          for (int ks = 0; ks < 4; ++ks) {
            const uint32_t step = (tile * kTileBytes + ks * 32) >> 4;  // descriptor address units
            WgmmaM64N64K16SS(s, q_desc + step, k_desc + step, (i > 0 || ks > 0) ? 1 : 0);
          }
        }
        WgmmaCommit();
      }
      WgmmaWait<0>();
      FenceOperands(s);
      DCP_SM90_TRACE(traced, pair_mark + trace::kScores);

      // Mask and scale into log2 units; row maxima of this block.
      float block_max[2];
      Sm90MaskScores(s, s_index + wg * 64, block, work.key_end, p.num_slots, scale_log2, c,
                     block_max);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (c == 0) s_max[wg * 64 + rows[r]] = block_max[r];
      }
      NamedBarrierSync(kBarMax, 256);
      DCP_SM90_TRACE(traced, pair_mark + trace::kMaxShared);

      // The same running max in both WGs. It moves only when a block's max passes it by more
      // than split.rescale_slack (log2 units; 0: whenever it grows), so P = 2^(s - m) <= 2^slack
      // and O and l are rescaled only on those pairs: O / l and the LSE do not depend on the
      // reference the sums were taken against, only their rounding does.
      float m_use[2], alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m_block = fmaxf(s_max[rows[r]], s_max[64 + rows[r]]);
        const float m_new = m_block > m[r] + split.rescale_slack ? m_block : m[r];
        m_use[r] = m_new == kNegInf ? 0.f : m_new;  // all masked so far: keep exp2 finite
        alpha[r] = exp2f(m[r] - m_use[r]);
        m[r] = m_new;
        l[r] *= alpha[r];
      }
      Sm90RescaleRows(o, alpha);
      uint32_t a[4][4];  // P as the A fragments of the 4 k-steps of 16 keys
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint32_t top, bottom;
        float sums[2];
        Sm90ExpScores<false>(s, j, m_use, sums, top, bottom);
        l[0] += sums[0];
        l[1] += sums[1];
        a[j / 2][(j % 2) * 2] = top;
        a[j / 2][(j % 2) * 2 + 1] = bottom;
        Sm90StoreScores(own_p, rows, j, c, top, bottom);  // the other WG reads P there
      }
      // O += P_own V_own[:, half] (RS): it needs only this WG's P, so it is issued before the
      // hand-off of P and runs while the other WG finishes its P.
      WgmmaFence();
      Sm90IssueOwnPv(o, a, own_k + value_tile);
      WgmmaCommit();
      FenceProxyAsync();
      NamedBarrierSync(kBarP, 256);
      DCP_SM90_TRACE(traced, pair_mark + trace::kPShared);

      // Then O += P_other V_other[:, half] (SS).
      Sm90IssueCrossPv(o, other_p, other_k + value_tile);
      WgmmaCommit();
      WgmmaWait<1>();
      FenceOperands(a);  // the own PV read them until here
      MbarrierArrive(free_bar + 8 * (wg == 0 ? kL0 : kR1));
      WgmmaWait<0>();
      FenceOperands(o);
      DCP_SM90_TRACE(traced, pair_mark + trace::kPvDone);
      MbarrierArrive(free_bar + 8 * (wg == 0 ? kL1 : kR0));
    }
    // Every wgmma of this item has retired (each pair ends waiting for them): Q may be reloaded.
    if (num_pairs > 0) MbarrierArrive(q_free_bar);
    pairs_done += num_pairs;

    // Row sums of both WGs (each summed P of its own blocks), then normalise and store. The roles
    // schedule exchanges none: WG0 holds the sums (in quads), WG1 took the total WG0 left with
    // the last block (Sm90RolesPv).
    float roles_total[2] = {0.f, 0.f};
    if constexpr (kRoles) {
#pragma unroll
      for (int r = 0; r < 2; ++r) roles_total[r] = wg == 0 ? QuadSum(l[r]) : l[r];
    } else {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        l[r] = QuadSum(l[r]);
        if (c == 0) s_sum[wg * 64 + rows[r]] = l[r];
      }
      NamedBarrierSync(kBarSum, 256);
    }
    DCP_SM90_TRACE(first_item && threadIdx.x == 0, trace::kSumDone);
    // The item's bf16 row (SparseMqaParams::out_bf16; null for the fp32 epilogue), found from p
    // here rather than carried in `work` through the main loop.
    __nv_bfloat16* out_bf16 = nullptr;
    if constexpr (kEpilogue != Sm90Epilogue::kF32) {
      if (p.out_bf16 != nullptr) {
        out_bf16 = static_cast<__nv_bfloat16*>(p.out_bf16) +
                   int64_t(work.token) * p.out_token_stride + int64_t(work.head0) * p.out_head_stride;
      }
    }
    if constexpr (kEpilogue == Sm90Epilogue::kCluster) {
      static_assert(64 * kClusterStagePitch * 4 <= 2 * Config::kBufferBytes &&
                        64 * 4 <= kTileBytes,
                    "the staged partial fits K0 + K1, its LSEs P1");
      // Stage the normalised partial and its LSEs in this CTA's K buffers and P1 (every wgmma
      // of both WGs retired before kBarSum), then merge this CTA's rows across the cluster
      // (sparse_mqa_sm90_cluster_merge.cuh). One item per CTA in this mode.
      float* stage = reinterpret_cast<float*>(smem + Config::kKOffset);
      float* stage_lse = reinterpret_cast<float*>(smem + Config::kP1Offset);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = rows[r];
        if (row >= work.heads) continue;
        const float total = s_sum[row] + s_sum[64 + row];
        const float inverse = Sm90RowInverse(total);
        float* staged = stage + row * kClusterStagePitch + wg * 256 + 2 * c;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          *reinterpret_cast<float2*>(staged + 8 * j) =
              make_float2(o[4 * j + 2 * r] * inverse, o[4 * j + 2 * r + 1] * inverse);
        }
        if (wg == 0 && c == 0) stage_lse[row] = Sm90RowLse(m[r], total);
      }
      ClusterArrive();
      ClusterMergeSplits(work, out_bf16, p.out_head_stride, split.num_splits,
                         base + Config::kKOffset, base + Config::kP1Offset, threadIdx.x);
      continue;
    }
    // The epilogue writes 128 KiB (fp32 O of 64 heads) per CTA and takes ~3 us (a trace of the
    // one-token decode, docs/sparse_mqa_sm90.md): staging O in shared memory and storing it
    // with bulk copies, or with 16-byte stores of 512 contiguous bytes a warp, measured the same;
    // bf16 split partials written from the fragment (half the bytes, half-sector writes) took
    // longer (4.3 us). With every CTA storing (docs/PERFORMANCE.md, 2026-12-05, last): staged
    // 16-byte rows (commit 19b9213), an evict-first L2 policy on them, and each CTA starting at
    // its own row all measured within the spread of the direct store.
    // Sm90Epilogue::kBf16 (SparseMqaParams::out_bf16, one split): bf16 pairs instead.
    constexpr bool kToBf16 = kEpilogue == Sm90Epilogue::kBf16;
    const bool pairs_ok = (work.out_head_stride % 2 == 0) &&
                          (kToBf16 ? reinterpret_cast<uintptr_t>(out_bf16) % 4 == 0
                                   : reinterpret_cast<uintptr_t>(work.out) % 8 == 0);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = rows[r];
      if (row >= work.heads) continue;
      const float total = kRoles ? roles_total[r] : s_sum[row] + s_sum[64 + row];
      const float inverse = Sm90RowInverse(total);
      const int64_t at = int64_t(row) * work.out_head_stride + wg * 256 + 2 * c;
      // The measurement build skips the stores at run time, on a kernel parameter (always true
      // when it runs): skipped at compile time, ptxas deletes the P V wgmmas whose sums nothing
      // reads (all 8 m64n256 of them), and the build times a kernel without its P V. (An
      // Opaque() constant does not hide it: ptxas sees through the mov.)
      const bool skip_store = kSm90NoOStore && p.num_heads > 0;
      if (skip_store) {
      } else if constexpr (kToBf16) {
        __nv_bfloat16* out = out_bf16 + at;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          const __nv_bfloat162 xy = __floats2bfloat162_rn(o[4 * j + 2 * r] * inverse,
                                                          o[4 * j + 2 * r + 1] * inverse);
          if (pairs_ok) {
            *reinterpret_cast<__nv_bfloat162*>(out + 8 * j) = xy;
          } else {
            out[8 * j] = xy.x;
            out[8 * j + 1] = xy.y;
          }
        }
      } else {
        float* out = work.out + at;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          const float x = o[4 * j + 2 * r] * inverse, y = o[4 * j + 2 * r + 1] * inverse;
          if (pairs_ok) {
            *reinterpret_cast<float2*>(out + 8 * j) = make_float2(x, y);
          } else {
            out[8 * j] = x;
            out[8 * j + 1] = y;
          }
        }
      }
      if (wg == 0 && c == 0) work.lse[row] = Sm90RowLse(m[r], total);
    }
    // The next item writes s_sum again (an item without pairs passes no other barrier first).
    // (The roles schedule's s_sum entries are per block, read by WG1 before it frees the block.)
    if (!kRoles && item + gridDim.x < items) NamedBarrierSync(kBarSum, 256);
  }  // items
  DCP_SM90_TRACE(threadIdx.x == 0, trace::kClockEnd);
  DCP_SM90_TRACE(threadIdx.x == 0, trace::kGlobalEnd);
  DCP_SM90_TRACE(threadIdx.x == 128, trace::kWg1End);
#else
  __trap();  // not compiled for sm_90a: the launcher never starts it (SparseMqaSm90Available)
#endif
}

// Sets the kernel's attributes (dynamic shared memory; clusters above 8 CTAs for the cluster
// instantiation) once per device: the attribute calls cost host time on every decode step
// otherwise.
template <int kHeadDim, int kVDim, KvCacheDType kFormat, Sm90Epilogue kEpilogue,
          bool kRoles = false>
absl::Status ConfigureSparseMqaSm90() {
  using Config = SparseMqaSm90Config<kHeadDim, kVDim>;
  auto kernel = SparseMqaSm90Kernel<kHeadDim, kVDim, kFormat, kEpilogue, kRoles>;
  static std::atomic<uint64_t> configured{0};
  int device = 0;
  DCP_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = device < 64 ? uint64_t(1) << device : 0;
  if (bit != 0 && (configured.load() & bit) != 0) return absl::OkStatus();
  DCP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      Config::kSmemBytes));
  if constexpr (kEpilogue == Sm90Epilogue::kCluster) {
    DCP_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  }
  configured.fetch_or(bit);
  return absl::OkStatus();
}

template <int kHeadDim, int kVDim, KvCacheDType kFormat>
int SparseMqaSm90MaxClusters(int splits) {
  if (splits < 2 || splits > kSparseMqaMaxClusterSplits) return 0;
  // Per device and split count: 0 unknown, else the answer + 1.
  static std::atomic<int> cached[64][kSparseMqaMaxClusterSplits + 1] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 0;
  std::atomic<int>& known = cached[device][splits];
  if (known.load() > 0) return known.load() - 1;
  using Config = SparseMqaSm90Config<kHeadDim, kVDim>;
  int clusters = 0;
  if (ConfigureSparseMqaSm90<kHeadDim, kVDim, kFormat, Sm90Epilogue::kCluster>().ok()) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(splits));
    config.blockDim = dim3(Config::kThreads);
    config.dynamicSmemBytes = Config::kSmemBytes;
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = static_cast<unsigned>(splits);
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(
            &clusters, SparseMqaSm90Kernel<kHeadDim, kVDim, kFormat, Sm90Epilogue::kCluster>,
            &config) != cudaSuccess) {
      clusters = 0;
    }
  }
  cudaGetLastError();  // a refused query is an answer, not an error of the next call
  clusters = std::max(clusters, 0);
  known.store(clusters + 1);
  return clusters;
}

template <int kHeadDim, int kVDim, KvCacheDType kFormat, Sm90Epilogue kEpilogue, bool kRoles>
absl::Status LaunchSparseMqaSm90(const SparseMqaParams& p, const SparseMqaSplit& split,
                                 cudaStream_t stream) {
  using Config = SparseMqaSm90Config<kHeadDim, kVDim>;
  auto kernel = SparseMqaSm90Kernel<kHeadDim, kVDim, kFormat, kEpilogue, kRoles>;
  if (ChooseSm90Epilogue(p, split) != kEpilogue || split.roles != kRoles) {
    return DCP_ERROR(Internal,
                     "SparseMqa (wgmma): epilogue %d, roles %d launched on instantiation %d, %d",
                     int(ChooseSm90Epilogue(p, split)), int(split.roles), int(kEpilogue),
                     int(kRoles));
  }
  DCP_RETURN_IF_ERROR((ConfigureSparseMqaSm90<kHeadDim, kVDim, kFormat, kEpilogue, kRoles>()));
  DCP_CHECK_ARG(split.block_heads == 16 || split.block_heads == 32 || split.block_heads == 64,
                "SparseMqa (wgmma): block_heads %d is not 16, 32 or 64", split.block_heads);
  const int64_t head_blocks = (p.num_heads + split.block_heads - 1) / split.block_heads;
  int64_t blocks = SparseMqaItems(p, split.num_splits, split.block_heads);
  DCP_CHECK_ARG(blocks < (int64_t(1) << 31), "SparseMqa: %d tokens x %d head blocks is too many",
                p.num_tokens, head_blocks);
  DCP_CHECK_ARG(!split.cluster_merge ||
                    (split.num_splits >= 2 && split.num_splits <= kSparseMqaMaxClusterSplits &&
                     split.persistent_ctas == 0),
                "SparseMqa (wgmma): a cluster merge of %d splits (persistent CTAs %d)",
                split.num_splits, split.persistent_ctas);
  if (split.persistent_ctas > 0) blocks = std::min<int64_t>(blocks, split.persistent_ctas);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(Config::kThreads);
  config.dynamicSmemBytes = Config::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  SetProgrammaticLaunch(&config, &attributes[0]);
  if constexpr (kEpilogue == Sm90Epilogue::kCluster) {
    cudaLaunchAttribute& cluster = attributes[config.numAttrs];
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = static_cast<unsigned>(split.num_splits);
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    config.attrs = attributes;
    config.numAttrs += 1;
  }
  DCP_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p, split));
  DCP_CUDA_LAUNCH_CHECK("SparseMqaSm90Kernel");
#if defined(DCP_SPARSE_MQA_TRACE)
  sm90_trace::AfterLaunch(kFormat == KvCacheDType::kFp8DsMla ? "fp8 rows" : "bf16 rows",
                          config.gridDim.x, stream);
#endif
  return absl::OkStatus();
}

}  // namespace dcp::cuda
