// Sparse top-k MQA, bf16 tensor cores (mma.sync m16n8k16), online softmax in fp32.
//
// Grid (sparse_mqa_work.cuh): num_tokens x splits x ceil(num_heads / 64), head block fastest.
// One CTA = one token x 64 query heads x one split of the token's key list (all of it without
// split-KV), walked in blocks of 64 keys; with valid_counts only the token's valid keys. All
// heads share the one KV head, so a gathered block of 64 cache rows (64 x 576 bf16 = 72 KiB)
// serves all 64 heads.
// 8 warps: warp w owns head rows rg = w % 4 (16 rows) and half h = w / 4. For S = Q K^T, warp
// (rg, h) computes its 16 rows x keys [32h, 32h+32) of the block; for O += P V it computes its
// 16 rows x value columns [256h, 256h+256) over all 64 keys, so P (bf16) and the per-row
// maxima are exchanged between the two halves through shared memory. Both warps of a row group
// hold the same running max m; each holds the partial row sum l of its own keys, added at the
// end.
// Shared memory: Q tile [64][576], two K/V tiles [64][576] (cp.async double buffer: block b+1
// is gathered while block b is computed), P [64][64], maxima and sums [2][64]: 225 KiB. Rows
// are XOR-swizzled by 16-byte chunk so ldmatrix reads are conflict free.
// Invalid keys (index -1, out of range, or past topk) are gathered as zero rows (no memory
// read) and masked to -inf; a row with no valid key ends with l = 0: out 0, lse -inf.
// kFormat kFp8DsMla (656-byte rows, core/kv_cache_format.h): the raw rows of block b+1 are
// gathered by cp.async into a staging tile [64][656] while block b is computed, then
// dequantized (e4m3 * tile scale in fp32, rounded to bf16; k_pe copied) into the one bf16 K/V
// tile the MMAs read: Q + K/V + staging + P = 194 KiB. Everything after the tile is unchanged.
#pragma once

#include <cuda_bf16.h>

#include <atomic>
#include <cmath>
#include <cstdint>

#include "attention/attention_params.h"
#include "attention/cuda/mma_sm80.cuh"
#include "attention/cuda/sparse_mqa.h"
#include "attention/cuda/sparse_mqa_work.cuh"
#include "core/cuda/cuda_status.h"
#include "core/cuda/fp8_e4m3.cuh"

namespace dcp::cuda {

template <int kHeadDim, int kVDim, KvCacheDType kFormat = KvCacheDType::kBF16>
struct SparseMqaConfig {
  static constexpr bool kFp8 = kFormat == KvCacheDType::kFp8DsMla;
  static constexpr int kBlockHeads = 64;
  static constexpr int kBlockKeys = 64;
  static constexpr int kThreads = 256;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr int kKeysPerWarp = kBlockKeys / 2;
  static constexpr int kValuesPerWarp = kVDim / 2;
  static constexpr int kTileBytes = kBlockKeys * kHeadDim * 2;
  static constexpr int kQBytes = kBlockHeads * kHeadDim * 2;
  static constexpr int kPBytes = kBlockHeads * kBlockKeys * 2;
  static constexpr int kKvBuffers = kFp8 ? 1 : 2;  // bf16 tiles: double buffer, or staging
  static constexpr int kStageBytes = kFp8 ? kBlockKeys * fp8_ds_mla::kRowBytes : 0;
  static constexpr int kSmemBytes =
      kQBytes + kKvBuffers * kTileBytes + kStageBytes + kPBytes + 2 * 2 * kBlockHeads * 4;
  static_assert(kHeadDim % 16 == 0 && kVDim % 32 == 0 && kVDim <= kHeadDim);
  static_assert(kKeysPerWarp == 32 && kBlockHeads == 64, "the warp mapping above");
  static_assert(!kFp8 || (kHeadDim == fp8_ds_mla::kRowWidth && kVDim == fp8_ds_mla::kLatentDim));
};

template <int kHeadDim, int kVDim, KvCacheDType kFormat>
__global__ void __launch_bounds__(256, 1)
    SparseMqaKernel(const SparseMqaParams p, const SparseMqaSplit split) {
  using Config = SparseMqaConfig<kHeadDim, kVDim, kFormat>;
  constexpr bool kFp8 = Config::kFp8;
  constexpr int kChunks = Config::kChunks;
  constexpr int kBlockKeys = Config::kBlockKeys;
  constexpr float kNegInf = -INFINITY;

  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* s_q = smem;
  uint8_t* s_kv = smem + Config::kQBytes;
  uint8_t* s_stage = s_kv + Config::kKvBuffers * Config::kTileBytes;  // fp8 rows only
  uint8_t* s_p = s_stage + Config::kStageBytes;
  float* s_max = reinterpret_cast<float*>(s_p + Config::kPBytes);  // [2][64]
  float* s_sum = s_max + 2 * Config::kBlockHeads;                  // [2][64]

  // The head blocks of one token are adjacent in launch order, so they gather the same rows at
  // about the same time and the second gather hits L2.
  const SparseMqaWork work =
      GetSparseMqaWork(p, split, Config::kBlockHeads, Config::kBlockKeys, /*block_align=*/1,
                       int64_t(blockIdx.x));
  const int token = work.token;
  const int head0 = work.head0;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row_group = warp % 4, half = warp / 4;
  const int g = lane / 4, c = lane % 4;

  const auto* q = static_cast<const __nv_bfloat16*>(p.q);
  const auto* kv = static_cast<const __nv_bfloat16*>(p.kv_cache);
  const int32_t* token_indices = p.indices + int64_t(token) * p.indices_token_stride;
  const int key_end = work.key_end;
  const int64_t num_slots = p.num_slots;

  // Slot of key `key` of this token, or -1 when it is skipped (past this CTA's range).
  auto slot_of = [&](int key) -> int64_t {
    if (key >= key_end) return -1;
    const int64_t slot = token_indices[key];
    return (slot >= 0 && slot < num_slots) ? slot : -1;
  };

  // Q tile: rows past num_heads are zeros.
  const uint32_t q_base = SmemAddress(s_q);
  for (int i = tid; i < Config::kBlockHeads * kChunks; i += Config::kThreads) {
    const int row = i / kChunks, chunk = i % kChunks;
    const int head = head0 + row;
    const bool valid = head < p.num_heads;
    const __nv_bfloat16* src =
        valid ? q + int64_t(token) * p.q_token_stride + int64_t(head) * p.q_head_stride + chunk * 8
              : q;
    CpAsync16(q_base + SwizzledChunk<kChunks>(row, chunk), src, valid);
  }
  // Gathers block `block` of the top-k list into K/V buffer `buffer`.
  auto load_block = [&](int block, int buffer) {
    const uint32_t base = SmemAddress(s_kv + buffer * Config::kTileBytes);
    for (int i = tid; i < kBlockKeys * kChunks; i += Config::kThreads) {
      const int row = i / kChunks, chunk = i % kChunks;
      const int64_t slot = slot_of(block * kBlockKeys + row);
      const __nv_bfloat16* src = slot >= 0 ? kv + slot * p.kv_row_stride + chunk * 8 : kv;
      CpAsync16(base + SwizzledChunk<kChunks>(row, chunk), src, slot >= 0);
    }
  };

  // fp8: raw rows of block `block` into the staging tile, and staging -> bf16 K/V tile.
  const auto* kv_bytes = static_cast<const uint8_t*>(p.kv_cache);
  auto load_raw_block = [&](int block) {
    constexpr int kRawChunks = fp8_ds_mla::kRowBytes / 16;  // 41
    const uint32_t base = SmemAddress(s_stage);
    for (int i = tid; i < kBlockKeys * kRawChunks; i += Config::kThreads) {
      const int row = i / kRawChunks, chunk = i % kRawChunks;
      const int64_t slot = slot_of(block * kBlockKeys + row);
      const uint8_t* src = slot >= 0 ? kv_bytes + slot * fp8_ds_mla::kRowBytes + chunk * 16
                                     : kv_bytes;
      CpAsync16(base + row * fp8_ds_mla::kRowBytes + chunk * 16, src, slot >= 0);
    }
  };
  auto dequantize_block = [&]() {
    constexpr int kLatentChunks = fp8_ds_mla::kLatentDim / 8;  // 8 values per 16-byte chunk
    for (int i = tid; i < kBlockKeys * kChunks; i += Config::kThreads) {
      const int row = i / kChunks, chunk = i % kChunks;
      const uint8_t* raw = s_stage + row * fp8_ds_mla::kRowBytes;
      uint4 value;
      if (chunk < kLatentChunks) {
        const float scale = reinterpret_cast<const float*>(
            raw + fp8_ds_mla::kScaleOffset)[chunk / (fp8_ds_mla::kTileSize / 8)];
        value = DequantizeFp8x8ToBf16(reinterpret_cast<const uint2*>(raw)[chunk], scale);
      } else {
        const auto* rope = reinterpret_cast<const uint4*>(raw + fp8_ds_mla::kRopeOffset);
        value = rope[chunk - kLatentChunks];
      }
      *reinterpret_cast<uint4*>(s_kv + SwizzledChunk<kChunks>(row, chunk)) = value;
    }
  };

  // Blocks [first_block, first_block + num_blocks) of the list; key_begin is block aligned.
  const int first_block = work.key_begin / kBlockKeys;
  const int num_blocks = (work.key_end - work.key_begin + kBlockKeys - 1) / kBlockKeys;
  if constexpr (kFp8) {
    if (num_blocks > 0) load_raw_block(first_block);
    CpAsyncCommit();  // Q and the raw first block
    CpAsyncWait<0>();
    __syncthreads();
    if (num_blocks > 0) dequantize_block();
    __syncthreads();  // the tile is ready and the staging free
    if (num_blocks > 1) load_raw_block(first_block + 1);
    CpAsyncCommit();
  } else {
    if (num_blocks > 0) load_block(first_block, 0);
    CpAsyncCommit();
  }

  constexpr int kValueTiles = Config::kValuesPerWarp / 8;  // 32 n-tiles of 8 columns
  float o[kValueTiles][4];
#pragma unroll
  for (int n = 0; n < kValueTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};
  const float scale_log2 = p.scale * 1.4426950408889634f;
  const int my_rows = row_group * 16;
  const int my_keys = half * Config::kKeysPerWarp;
  const int my_values = half * Config::kValuesPerWarp;
  const uint32_t p_base = SmemAddress(s_p);

  for (int i = 0; i < num_blocks; ++i) {
    const int block = first_block + i;
    const int buffer = kFp8 ? 0 : i & 1;
    if constexpr (!kFp8) {
      if (i + 1 < num_blocks) load_block(block + 1, buffer ^ 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
      __syncthreads();
    }
    const uint32_t kv_base = SmemAddress(s_kv + buffer * Config::kTileBytes);

    // S = Q K^T: 16 rows x 32 keys, k over the 576 columns.
    float s[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
    const int q_row = my_rows + (lane & 7) + ((lane >> 3) & 1) * 8;
    const int k_row = my_keys + (lane & 7) + (lane >> 4) * 8;
#pragma unroll 4
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      uint32_t a[4];
      LdMatrixX4(q_base + SwizzledChunk<kChunks>(q_row, ks * 2 + (lane >> 4)), a[0], a[1], a[2],
                 a[3]);
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        uint32_t b0, b1, b2, b3;
        LdMatrixX4(kv_base + SwizzledChunk<kChunks>(k_row + pair * 16, ks * 2 + ((lane >> 3) & 1)),
                   b0, b1, b2, b3);
        MmaBf16(s[2 * pair], a, b0, b1);
        MmaBf16(s[2 * pair + 1], a, b2, b3);
      }
    }

    // Scale into log2 units, mask skipped keys, and share the partial row maxima.
    float block_max[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool valid = slot_of(block * kBlockKeys + my_keys + j * 8 + 2 * c + e) >= 0;
        s[j][e] = valid ? s[j][e] * scale_log2 : kNegInf;
        s[j][e + 2] = valid ? s[j][e + 2] * scale_log2 : kNegInf;
        block_max[0] = fmaxf(block_max[0], s[j][e]);
        block_max[1] = fmaxf(block_max[1], s[j][e + 2]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      block_max[r] = QuadMax(block_max[r]);
      if (c == 0) s_max[half * 64 + my_rows + g + 8 * r] = block_max[r];
    }
    __syncthreads();

    // Online softmax: new running max (the same in both halves), rescale O and l, P = 2^(s-m).
    float m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = my_rows + g + 8 * r;
      const float m_new = fmaxf(m[r], fmaxf(s_max[row], s_max[64 + row]));
      m_use[r] = m_new == kNegInf ? 0.f : m_new;  // all masked so far: keep exp2 finite
      const float alpha = exp2f(m[r] - m_use[r]);
      m[r] = m_new;
      l[r] *= alpha;
#pragma unroll
      for (int n = 0; n < kValueTiles; ++n) {
        o[n][2 * r] *= alpha;
        o[n][2 * r + 1] *= alpha;
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float p0 = exp2f(s[j][2 * r] - m_use[r]);
        const float p1 = exp2f(s[j][2 * r + 1] - m_use[r]);
        l[r] += p0 + p1;
        const int row = my_rows + g + 8 * r;
        const int chunk = (my_keys + j * 8) / 8;
        *reinterpret_cast<uint32_t*>(s_p + SwizzledChunk<8>(row, chunk) + 4 * c) =
            PackBf16(p0, p1);
      }
    }
    __syncthreads();

    // O += P V: 16 rows x 256 value columns, k over the block's 64 keys.
    const int p_row = my_rows + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int ks = 0; ks < kBlockKeys / 16; ++ks) {
      uint32_t a[4];
      LdMatrixX4(p_base + SwizzledChunk<8>(p_row, ks * 2 + (lane >> 4)), a[0], a[1], a[2], a[3]);
      const int v_row = ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int pair = 0; pair < kValueTiles / 2; ++pair) {
        uint32_t b0, b1, b2, b3;
        LdMatrixX4Trans(
            kv_base + SwizzledChunk<kChunks>(v_row, (my_values + pair * 16) / 8 + (lane >> 4)), b0,
            b1, b2, b3);
        MmaBf16(o[2 * pair], a, b0, b1);
        MmaBf16(o[2 * pair + 1], a, b2, b3);
      }
    }
    __syncthreads();  // the next iteration overwrites this K/V buffer, P and the maxima
    if constexpr (kFp8) {
      if (i + 1 < num_blocks) {
        CpAsyncWait<0>();
        __syncthreads();  // every thread's raw chunks of block + 1 have landed
        dequantize_block();
        __syncthreads();  // the tile is ready and the staging free
        if (i + 2 < num_blocks) load_raw_block(block + 2);
        CpAsyncCommit();
      }
    }
  }
  CpAsyncWait<0>();

  // Row sums of both halves, then normalize and store.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] = QuadSum(l[r]);
    if (c == 0) s_sum[half * 64 + my_rows + g + 8 * r] = l[r];
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = my_rows + g + 8 * r;
    const int head = head0 + row;
    if (head >= p.num_heads) continue;
    const float total = s_sum[row] + s_sum[64 + row];
    const float inverse = total > 0.f ? 1.f / total : 0.f;
    const int64_t at = int64_t(row) * work.out_head_stride + my_values + 2 * c;
    // SparseMqaParams::out_bf16 (one split). The row is found from p here rather than kept in
    // `work` through the main loop (the pointer cost this kernel's registers spills).
    if (p.out_bf16 != nullptr && split.num_splits == 1) {
      __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out_bf16) +
                           int64_t(token) * p.out_token_stride + int64_t(head0) * p.out_head_stride +
                           at;
#pragma unroll
      for (int n = 0; n < kValueTiles; ++n) {
        out[n * 8] = __float2bfloat16_rn(o[n][2 * r] * inverse);
        out[n * 8 + 1] = __float2bfloat16_rn(o[n][2 * r + 1] * inverse);
      }
    } else {
      float* out = work.out + at;
#pragma unroll
      for (int n = 0; n < kValueTiles; ++n) {
        out[n * 8] = o[n][2 * r] * inverse;
        out[n * 8 + 1] = o[n][2 * r + 1] * inverse;
      }
    }
    if (half == 0 && c == 0) {
      work.lse[row] =
          total > 0.f ? (m[r] + log2f(total)) * 0.6931471805599453f : kNegInf;
    }
  }
}

template <int kHeadDim, int kVDim, KvCacheDType kFormat>
absl::Status LaunchSparseMqa(const SparseMqaParams& p, const SparseMqaSplit& split,
                             cudaStream_t stream) {
  using Config = SparseMqaConfig<kHeadDim, kVDim, kFormat>;
  auto kernel = SparseMqaKernel<kHeadDim, kVDim, kFormat>;
  // Once per device: the attribute call costs host time on every decode step otherwise.
  static std::atomic<uint64_t> configured{0};
  int device = 0;
  DCP_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = device < 64 ? uint64_t(1) << device : 0;
  if (bit == 0 || (configured.load() & bit) == 0) {
    DCP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        Config::kSmemBytes));
    configured.fetch_or(bit);
  }
  const int64_t head_blocks = (p.num_heads + Config::kBlockHeads - 1) / Config::kBlockHeads;
  const int64_t blocks = int64_t(p.num_tokens) * split.num_splits * head_blocks;
  DCP_CHECK_ARG(blocks < (int64_t(1) << 31), "SparseMqa: %d tokens x %d head blocks is too many",
                p.num_tokens, head_blocks);
  kernel<<<static_cast<unsigned>(blocks), Config::kThreads, Config::kSmemBytes, stream>>>(p, split);
  DCP_CUDA_LAUNCH_CHECK("SparseMqaKernel");
  return absl::OkStatus();
}

}  // namespace dcp::cuda
