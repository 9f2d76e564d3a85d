// The consumers of the sm_90a sparse MQA kernel's roles schedule (SparseMqaSplit::roles,
// sparse_mqa_sm90_kernel.cuh; bf16 rows, the fp32 and bf16 epilogues). The pairs schedule has
// each consumer warpgroup score one block of a pair and exchange row maxima and P with the other
// twice a pair (both WGs then wait for the slower: ~1.7 us of a ~5 us pair with no wgmma in
// flight). Here the roles are split as in FlashMLA's sm90 decode, so the WGs never wait for
// each other's softmax:
//   WG0 (the scorer) computes S = Q K^T of every block (36 wgmma m64n64k16, K = 576), masks,
//     keeps the running max and the row sums, writes P = 2^(S - m) (bf16) into the block's rope
//     tile (free once S has read it) and the rows' rescale factors into shared memory, signals
//     the block's p_ready mbarrier, and runs O[:, 0:256] += P V[:, 0:256] (SS, P from that
//     tile: P kept in registers for an RS wgmma would stay live, 16 registers, under the next
//     block's S). The next block's S is issued right behind that PV, so the tensor pipe has
//     work while the scorer runs its softmax.
//   WG1 (the PV warpgroup) waits for p_ready, rescales its O[:, 256:512] by the factors and runs
//     O[:, 256:512] += P V[:, 256:512] (SS, P from the rope tile), then frees the R half.
// Blocks alternate K0 / K1 (the pair structure, its mbarrier phases and the producer stay); the
// producer fills L0, R0, L1, R1 in that order. Half buffers are freed by the WGs that read
// them last: L (value columns 0-255) by WG0 once its PV retired (its S read the whole block
// before), R (columns 256-511 and the rope tile holding P) by both: WG1 after its PV, WG0 after
// its own PV, which read P there too (the R halves' free mbarriers count 256 arrivals).
// No barrier between the WGs at the end either: WG0 leaves the rows' totals with the item's
// last block (beside its factors), WG1 normalises with those; only WG0 (which holds m) writes
// the LSE. (An exchange of the sums through a 256-thread named barrier, as in the pairs schedule,
// was reported by racecheck here: the epilogue after a warp-uniform branch on the role.)
#pragma once

#include <cstdint>

#include "attention/cuda/mma_sm80.cuh"
#include "attention/cuda/sparse_mqa_sm90_layout.cuh"
#include "attention/cuda/sparse_mqa_sm90_softmax.cuh"
#include "attention/cuda/sparse_mqa_sm90_trace.cuh"
#include "attention/cuda/wgmma_sm90.cuh"

namespace dcp::cuda {

// Where the roles schedule's consumers find the shared state of one item.
struct Sm90RolesShared {
  uint32_t q_base;
  uint32_t k_base[2];
  const int32_t* s_index;  // int32 [2][64]: the blocks' slots (for the masks)
  float* s_alpha;          // float [2][64]: the rows' rescale factors of the block in K0 / K1
  float* s_l;              // float [2][64]: the rows' totals of P, with an item's last block
  uint32_t ready_bar, free_bar;  // the half buffers' mbarriers (+ 8 * Sm90Half)
  uint32_t p_ready_bar;          // + 8 * buffer: P and the factors of the block there are written
};

// The roles scorer's softmax steps (the pairs schedule keeps its own, as measured): the
// block's key validity is read from the indices while S still runs, the row maxima and sums are
// trees, and 2^x is one ex2.approx.ftz (Sm90ExpScores<true>; P < 2^-126 of the running max is 0:
// below anything a bf16 P or an fp32 row sum keeps).
// Bit 2 j + e: key 8 j + 2 c + e of `block` is valid (position below key_end, slot in
// [0, num_slots)).
__device__ __forceinline__ uint32_t Sm90RolesValidBits(const int32_t* block_index, int block,
                                                       int key_end, int num_slots, int c) {
  uint32_t bits = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = 8 * j + 2 * c + e;
      const int32_t slot = block_index[col];
      const bool valid = block * 64 + col < key_end && slot >= 0 && slot < num_slots;
      bits |= uint32_t(valid) << (2 * j + e);
    }
  }
  return bits;
}

// Masks and scales S (log2 units) by those bits; block_max gets the quad-reduced row maxima.
__device__ __forceinline__ void Sm90RolesMaskScores(float (&s)[32], uint32_t bits,
                                                    float scale_log2, float (&block_max)[2]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const bool valid = (bits >> (2 * j + e)) & 1u;
      s[4 * j + e] = valid ? s[4 * j + e] * scale_log2 : -INFINITY;
      s[4 * j + 2 + e] = valid ? s[4 * j + 2 + e] * scale_log2 : -INFINITY;
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float level[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) level[j] = fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]);
#pragma unroll
    for (int width = 4; width >= 1; width /= 2) {
#pragma unroll
      for (int i = 0; i < width; ++i) level[i] = fmaxf(level[i], level[i + width]);
    }
    block_max[r] = QuadMax(level[0]);
  }
}

// WG0: scores, softmax and the left half of O for the item's pairs. t: the thread in the WG.
template <class Config>
__device__ __forceinline__ void Sm90RolesScore(const Sm90RolesShared& sh, float (&o)[128],
                                               float (&m)[2], float (&l)[2], int first_block,
                                               int num_pairs, int pairs_done, int key_end,
                                               int64_t num_slots, float scale_log2, float slack,
                                               bool traced_item, int t) {
  using namespace sm90;
  constexpr int kTiles = Config::kTiles, kLeftTiles = Config::kLeftTiles;
  constexpr int kTileBytes = Config::kTileBytes;
  const int warp = t / 32, lane = t % 32, g = lane / 4, c = lane % 4;
  const int rows[2] = {warp * 16 + g, warp * 16 + g + 8};
  const uint64_t q_desc = Opaque(MakeDesc(sh.q_base, 16, 1024));
  // One block an iteration, not unrolled by pairs: the unrolled pair made ptxas spill ~350 bytes.
  for (int b = 0; b < 2 * num_pairs; ++b) {
    const int which = b & 1;  // the block's buffer, K0 or K1
    const int parity = (pairs_done + (b >> 1)) & 1;
    {  // (one scope per block)
      const int block = first_block + b;
      // A profiling build's marks of blocks kTraceFirstBlock.. (steady state) in the "WG0 pair"
      // slots, one block a slot (sparse_mqa_sm90_trace.cuh).
      const int traced_block = b - sm90_trace::kRolesFirstBlock;
      const bool traced = traced_item && t == 0 && traced_block >= 0 &&
                          traced_block < sm90_trace::kPairs;
      const int mark = sm90_trace::kPairBase + traced_block * sm90_trace::kPairMarks;
      (void)traced;
      (void)mark;
      const uint32_t k = which == 0 ? sh.k_base[0] : sh.k_base[1];
      const uint64_t k_desc = Opaque(MakeDesc(k, 16, 1024));
      const int left = 2 * which, right = 2 * which + 1;  // Sm90Half: kL0 / kR0, kL1 / kR1
      float s[32];
      // S over the left tiles (0-3) while the right half lands.
      MbarrierWait(sh.ready_bar + 8 * left, parity);
      DCP_SM90_TRACE(traced, mark + sm90_trace::kFirstHalf);
      FenceProxyAsync();
      WgmmaFence();
#pragma unroll
      for (int tile = 0; tile < kLeftTiles; ++tile) {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          const uint32_t step = (tile * kTileBytes + ks * 32) >> 4;
          WgmmaM64N64K16SS(s, q_desc + step, k_desc + step, (tile > 0 || ks > 0) ? 1 : 0);
        }
      }
      WgmmaCommit();
      // The previous block's PV (issued before this S) has retired: its L half is free, and
      // this WG is done with its R half (P in the rope tile; WG1 arrives there too).
      if (b > 0) {
        WgmmaWait<1>();
        DCP_SM90_TRACE(traced, mark + sm90_trace::kPvDone);  // the previous block's PV
        MbarrierArrive(sh.free_bar + 8 * (2 * (which ^ 1)));
        MbarrierArrive(sh.free_bar + 8 * (2 * (which ^ 1) + 1));
      }
      MbarrierWait(sh.ready_bar + 8 * right, parity);
      DCP_SM90_TRACE(traced, mark + sm90_trace::kSecondHalf);
      FenceProxyAsync();
      WgmmaFence();
#pragma unroll
      for (int tile = kLeftTiles; tile < kTiles; ++tile) {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          const uint32_t step = (tile * kTileBytes + ks * 32) >> 4;
          WgmmaM64N64K16SS(s, q_desc + step, k_desc + step, 1);
        }
      }
      WgmmaCommit();
      // The block's indices (landed with its L half) while S runs.
      const uint32_t valid_bits =
          Sm90RolesValidBits(sh.s_index + which * 64, block, key_end, int(num_slots), c);
      WgmmaWait<0>();
      FenceOperands(s);
      FenceOperands(o);
      DCP_SM90_TRACE(traced, mark + sm90_trace::kScores);

      float block_max[2];
      Sm90RolesMaskScores(s, valid_bits, scale_log2, block_max);
      // The running max moves only when the block's max passes it by more than the slack (as in
      // the pairs schedule): P <= 2^slack, and O, l and WG1's O are rescaled only then. (Written
      // out here as there: a shared helper compiled the comparison differently in the pairs
      // kernel, whose code is kept as measured.)
      float m_use[2], alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m_new = block_max[r] > m[r] + slack ? block_max[r] : m[r];
        m_use[r] = m_new == -INFINITY ? 0.f : m_new;  // all masked so far: keep exp2 finite
        alpha[r] = exp2f(m[r] - m_use[r]);
        m[r] = m_new;
        l[r] *= alpha[r];
      }
      Sm90RescaleRows(o, alpha);
      // P into the block's rope tile (S has read it), K-major swizzled [64 rows][64 keys].
      const uint32_t p_tile = Opaque(k + (kTiles - 1) * kTileBytes);  // not hoisted per buffer
      float sums[8][2];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint32_t top, bottom;
        Sm90ExpScores<true>(s, j, m_use, sums[j], top, bottom);
        Sm90StoreScores(p_tile, rows, j, c, top, bottom);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        l[r] += ((sums[0][r] + sums[1][r]) + (sums[2][r] + sums[3][r])) +
                ((sums[4][r] + sums[5][r]) + (sums[6][r] + sums[7][r]));
      }
      // The factors for WG1, and with the item's last block the rows' totals (WG1 normalises
      // its half with those).
      if (c == 0) {
        sh.s_alpha[which * 64 + rows[0]] = alpha[0];
        sh.s_alpha[which * 64 + rows[1]] = alpha[1];
      }
      if (b == 2 * num_pairs - 1) {
        const float l_rows[2] = {QuadSum(l[0]), QuadSum(l[1])};
        if (c == 0) {
          sh.s_l[which * 64 + rows[0]] = l_rows[0];
          sh.s_l[which * 64 + rows[1]] = l_rows[1];
        }
      }
      FenceProxyAsync();  // P is read by wgmma (the async proxy), of both WGs
      DCP_SM90_TRACE(traced, mark + sm90_trace::kMaxShared);  // P written
      MbarrierArrive(sh.p_ready_bar + 8 * which);
      NamedBarrierSync(kBarScorerP, 128);  // the whole tile, for this WG's own wgmma
      DCP_SM90_TRACE(traced, mark + sm90_trace::kPShared);
      // O[:, 0:256] += P V[:, 0:256]; the next block's S is issued behind it.
      WgmmaFence();
      Sm90IssueCrossPv(o, p_tile, k);
      WgmmaCommit();
    }
  }
  WgmmaWait<0>();  // on every path (nothing is in flight without pairs): the epilogue reads o
  FenceOperands(o);
  if (num_pairs > 0) {  // the last block is in K1
    MbarrierArrive(sh.free_bar + 8 * kL1);
    MbarrierArrive(sh.free_bar + 8 * kR1);
  }
}

// WG1: the right half of O for the item's pairs; l gets the rows' totals of P (0 without keys).
// t: the thread in the WG.
template <class Config>
__device__ __forceinline__ void Sm90RolesPv(const Sm90RolesShared& sh, float (&o)[128],
                                            float (&l)[2], int num_pairs, int pairs_done,
                                            bool traced_item, int t) {
  using namespace sm90;
  constexpr int kTiles = Config::kTiles, kLeftTiles = Config::kLeftTiles;
  constexpr int kTileBytes = Config::kTileBytes;
  const int warp = t / 32, lane = t % 32, g = lane / 4;
  const int rows[2] = {warp * 16 + g, warp * 16 + g + 8};
  for (int b = 0; b < 2 * num_pairs; ++b) {
    const int which = b & 1;
    const int parity = (pairs_done + (b >> 1)) & 1;
    {  // (one scope per block)
      const uint32_t k = which == 0 ? sh.k_base[0] : sh.k_base[1];
      const int right = 2 * which + 1;
      const int traced_block = b - sm90_trace::kRolesFirstBlock;  // "WG1 pair" slots
      const bool traced = traced_item && t == 0 && traced_block >= 0 &&
                          traced_block < sm90_trace::kPairs;
      const int mark = sm90_trace::kPairBase +
                       (sm90_trace::kPairs + traced_block) * sm90_trace::kPairMarks;
      (void)traced;
      (void)mark;
      MbarrierWait(sh.ready_bar + 8 * right, parity);  // V[:, 256:512] has landed
      DCP_SM90_TRACE(traced, mark + sm90_trace::kFirstHalf);
      MbarrierWait(sh.p_ready_bar + 8 * which, parity);
      DCP_SM90_TRACE(traced, mark + sm90_trace::kSecondHalf);
      const float alpha[2] = {sh.s_alpha[which * 64 + rows[0]], sh.s_alpha[which * 64 + rows[1]]};
      // The rows' totals, written with the item's last block; read before the R half is freed
      // (WG0 writes these entries again only after its refill).
      if (b == 2 * num_pairs - 1) {
        l[0] = sh.s_l[which * 64 + rows[0]];
        l[1] = sh.s_l[which * 64 + rows[1]];
      }
      Sm90RescaleRows(o, alpha);
      WgmmaFence();
      Sm90IssueCrossPv(o, k + (kTiles - 1) * kTileBytes, k + kLeftTiles * kTileBytes);
      WgmmaCommit();
      WgmmaWait<0>();
      FenceOperands(o);
      DCP_SM90_TRACE(traced, mark + sm90_trace::kPvDone);
      MbarrierArrive(sh.free_bar + 8 * right);
    }
  }
}

}  // namespace dcp::cuda
