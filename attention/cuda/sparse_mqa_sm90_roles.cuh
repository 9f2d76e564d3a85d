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
// No barrier between the WGs at the end either: WG0 leaves the running row sums with each
// block's factors, WG1 normalises with the last block's; only WG0 (which holds m) writes the
// LSE. (An exchange of the sums through a 256-thread named barrier, as in the pairs schedule,
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
  float* s_l;              // float [2][64]: the rows' sums of P up to that block (quad-summed)
  uint32_t ready_bar, free_bar;  // the half buffers' mbarriers (+ 8 * Sm90Half)
  uint32_t p_ready_bar;          // + 8 * buffer: P and the factors of the block there are written
};

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
      WgmmaWait<0>();
      FenceOperands(s);
      FenceOperands(o);
      DCP_SM90_TRACE(traced, mark + sm90_trace::kScores);

      float block_max[2];
      Sm90MaskScores(s, sh.s_index + which * 64, block, key_end, num_slots, scale_log2, c,
                     block_max);
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
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint32_t top, bottom;
        Sm90ExpScores(s, j, m_use, l, top, bottom);
        Sm90StoreScores(p_tile, rows, j, c, top, bottom);
      }
      // The factors and the running row sums for WG1 (which normalises its half with the last).
      const float l_rows[2] = {QuadSum(l[0]), QuadSum(l[1])};
      if (c == 0) {
        sh.s_alpha[which * 64 + rows[0]] = alpha[0];
        sh.s_alpha[which * 64 + rows[1]] = alpha[1];
        sh.s_l[which * 64 + rows[0]] = l_rows[0];
        sh.s_l[which * 64 + rows[1]] = l_rows[1];
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
      // Read before the R half is freed: WG0 rewrites this block's entries after its refill.
      l[0] = sh.s_l[which * 64 + rows[0]];
      l[1] = sh.s_l[which * 64 + rows[1]];
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
