// The shared-memory plan, half buffers and named barriers of the sm_90a sparse MQA kernel
// (sparse_mqa_sm90_kernel.cuh), shared with its fp8_ds_mla producer (sparse_mqa_sm90_fp8.cuh).
#pragma once

namespace dcp::cuda {

template <int kHeadDim, int kVDim>
struct SparseMqaSm90Config {
  static constexpr int kBlockHeads = 64;
  static constexpr int kBlockKeys = 64;
  static constexpr int kThreads = 384;
  static constexpr int kTiles = kHeadDim / 64;       // 9 tiles of 64 columns per row
  static constexpr int kLeftTiles = kVDim / 2 / 64;  // 4: the tiles of value columns 0-255
  static constexpr int kTileBytes = 64 * 64 * 2;
  static constexpr int kBufferBytes = kTiles * kTileBytes;
  // Offsets in shared memory (from a 1024-byte aligned base).
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kBufferBytes;  // K0, then K1
  static constexpr int kP1Offset = 3 * kBufferBytes;
  static constexpr int kIndexOffset = kP1Offset + kTileBytes;   // int32 [2][64]
  static constexpr int kMaxOffset = kIndexOffset + 2 * 64 * 4;  // float [2][64]
  static constexpr int kSumOffset = kMaxOffset + 2 * 64 * 4;    // float [2][64]
  // uint64 ready[4], free[4] (the half buffers), then q_ready, q_free (the Q tile), then
  // p_ready[2] (the roles schedule: P of the block in K0 / K1 written, sparse_mqa_sm90_roles.cuh)
  static constexpr int kBarrierOffset = kSumOffset + 2 * 64 * 4;
  static constexpr int kSmemBytes = kBarrierOffset + 12 * 8 + 1024;  // + alignment slack
  static_assert(kHeadDim == 576 && kVDim == 512, "the tile plan above is for 576 / 512");
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM must fit");
};

// The four half buffers (mbarrier indices): L = tiles 0-3, R = tiles 4-8 of K0 / K1.
enum Sm90Half : int { kL0 = 0, kR0 = 1, kL1 = 2, kR1 = 3 };
// Named barriers of the two consumer warpgroups (256 threads); 0 is __syncthreads.
// kBarConvert + wg: one consumer WG's 128 threads (fp8 rows: a dequantized tile is published).
enum Sm90Barrier : int {
  kBarQ = 1,
  kBarMax = 2,
  kBarP = 3,
  kBarSum = 4,
  kBarConvert = 5,  // and 6
  kBarScorerP = 7,  // the roles schedule's WG0 (128 threads): its P tile is written
};

}  // namespace dcp::cuda
