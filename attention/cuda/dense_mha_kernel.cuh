// Dense varlen MHA, FlashAttention-2 style on bf16 tensor cores (mma.sync m16n8k16), fp32
// online softmax.
//
// Grid: (ceil(max_seqlen_q / 64), num_heads, num_seqs); blockIdx.x is reversed so the query
// blocks with the most causal keys start first. One CTA = 64 queries of one (sequence, head);
// 4 warps, warp w owns query rows [16w, 16w+16) and all 64 keys of each key block, so softmax
// needs no exchange between warps. Q fragments stay in registers (loaded once through shared
// memory); K [64][qk] and V [64][v] blocks are double-buffered with cp.async (block b+1 loads
// while block b computes). S = Q K^T (12 k-steps of 16 for qk 192), P stays in registers as
// the A operand of O += P V (the C->A fragment identity of m16n8k16), V via ldmatrix.trans.
// Shared memory: 24 + 2 x (24 + 16) KiB = 104 KiB for 192/128: two CTAs per SM; 160 KiB for
// 256/256 (one CTA per SM, and the 256-wide O accumulator spills registers: correct, slow;
// cuDNN is the fast path for GLM-5's sizes).
// Masking: query i (0-based in its sequence of Lq queries, Lk keys) sees keys
// [0, Lk - Lq + i] when causal, [0, Lk) otherwise; only key blocks that cross that bound pay
// for the mask. Rows past the sequence are zeros and are not stored.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "attention/attention_params.h"
#include "attention/cuda/dense_mha.h"
#include "attention/cuda/mma_sm80.cuh"
#include "core/cuda/cuda_status.h"

namespace dcp::cuda {

template <int kQkDim, int kVDim>
struct DenseMhaConfig {
  static constexpr int kBlockQ = 64;
  static constexpr int kBlockK = 64;
  static constexpr int kThreads = 128;
  static constexpr int kQkChunks = kQkDim / 8;
  static constexpr int kVChunks = kVDim / 8;
  static constexpr int kQBytes = kBlockQ * kQkDim * 2;
  static constexpr int kKBytes = kBlockK * kQkDim * 2;
  static constexpr int kVBytes = kBlockK * kVDim * 2;
  static constexpr int kSmemBytes = kQBytes + 2 * (kKBytes + kVBytes);
  static_assert(kQkDim % 16 == 0 && kVDim % 16 == 0);
};

template <int kQkDim, int kVDim>
__global__ void __launch_bounds__(128) DenseMhaKernel(const DenseMhaParams p) {
  using Config = DenseMhaConfig<kQkDim, kVDim>;
  constexpr int kQkChunks = Config::kQkChunks, kVChunks = Config::kVChunks;
  constexpr int kBlockK = Config::kBlockK;
  constexpr float kNegInf = -INFINITY;

  const int q_block = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y, seq = blockIdx.z;
  const int q_begin = p.cu_seqlens_q[seq], len_q = p.cu_seqlens_q[seq + 1] - q_begin;
  const int k_begin = p.cu_seqlens_k[seq], len_k = p.cu_seqlens_k[seq + 1] - k_begin;
  const int q_start = q_block * Config::kBlockQ;
  if (q_start >= len_q) return;
  const int q_rows = min(Config::kBlockQ, len_q - q_start);
  // Keys [0, key_end) are seen by at least one query of the block; keys below key_full by all.
  const int offset = len_k - len_q;  // causal: query i sees keys <= offset + i
  const int key_end = p.causal ? min(len_k, offset + q_start + q_rows) : len_k;
  const int key_full = p.causal ? min(len_k, offset + q_start + 1) : len_k;
  const int num_blocks = key_end > 0 ? (key_end + kBlockK - 1) / kBlockK : 0;

  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* s_q = smem;
  uint8_t* s_k = smem + Config::kQBytes;
  uint8_t* s_v = s_k + 2 * Config::kKBytes;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  const auto* q = static_cast<const __nv_bfloat16*>(p.q);
  const auto* k = static_cast<const __nv_bfloat16*>(p.k);
  const auto* v = static_cast<const __nv_bfloat16*>(p.v);

  const uint32_t q_base = SmemAddress(s_q);
  for (int i = tid; i < Config::kBlockQ * kQkChunks; i += Config::kThreads) {
    const int row = i / kQkChunks, chunk = i % kQkChunks;
    const bool valid = row < q_rows;
    const __nv_bfloat16* src = valid ? q + int64_t(q_begin + q_start + row) * p.q_token_stride +
                                           int64_t(head) * p.q_head_stride + chunk * 8
                                     : q;
    CpAsync16(q_base + SwizzledChunk<kQkChunks>(row, chunk), src, valid);
  }
  auto load_block = [&](int block, int buffer) {
    const uint32_t k_base = SmemAddress(s_k + buffer * Config::kKBytes);
    const uint32_t v_base = SmemAddress(s_v + buffer * Config::kVBytes);
    for (int i = tid; i < kBlockK * kQkChunks; i += Config::kThreads) {
      const int row = i / kQkChunks, chunk = i % kQkChunks;
      const int key = block * kBlockK + row;
      const bool valid = key < key_end;
      const __nv_bfloat16* src = valid ? k + int64_t(k_begin + key) * p.k_token_stride +
                                             int64_t(head) * p.k_head_stride + chunk * 8
                                       : k;
      CpAsync16(k_base + SwizzledChunk<kQkChunks>(row, chunk), src, valid);
    }
    for (int i = tid; i < kBlockK * kVChunks; i += Config::kThreads) {
      const int row = i / kVChunks, chunk = i % kVChunks;
      const int key = block * kBlockK + row;
      const bool valid = key < key_end;
      const __nv_bfloat16* src = valid ? v + int64_t(k_begin + key) * p.v_token_stride +
                                             int64_t(head) * p.v_head_stride + chunk * 8
                                       : v;
      CpAsync16(v_base + SwizzledChunk<kVChunks>(row, chunk), src, valid);
    }
  };
  if (num_blocks > 0) load_block(0, 0);
  CpAsyncCommit();

  constexpr int kQkSteps = kQkDim / 16;
  constexpr int kVTiles = kVDim / 8;
  uint32_t q_frag[kQkSteps][4];
  float o[kVTiles][4];
#pragma unroll
  for (int n = 0; n < kVTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};
  const float scale_log2 = p.scale * 1.4426950408889634f;
  const int my_rows = warp * 16;
  // Query index (in the sequence) of this thread's two rows.
  const int query[2] = {q_start + my_rows + g, q_start + my_rows + g + 8};

  for (int block = 0; block < num_blocks; ++block) {
    const int buffer = block & 1;
    if (block + 1 < num_blocks) load_block(block + 1, buffer ^ 1);
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();
    if (block == 0) {
      const int q_row = my_rows + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int ks = 0; ks < kQkSteps; ++ks) {
        LdMatrixX4(q_base + SwizzledChunk<kQkChunks>(q_row, ks * 2 + (lane >> 4)), q_frag[ks][0],
                   q_frag[ks][1], q_frag[ks][2], q_frag[ks][3]);
      }
    }
    const uint32_t k_base = SmemAddress(s_k + buffer * Config::kKBytes);
    const uint32_t v_base = SmemAddress(s_v + buffer * Config::kVBytes);

    // S = Q K^T: 16 rows x 64 keys.
    float s[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
    const int k_row = (lane & 7) + (lane >> 4) * 8;
#pragma unroll
    for (int ks = 0; ks < kQkSteps; ++ks) {
#pragma unroll
      for (int pair = 0; pair < 4; ++pair) {
        uint32_t b0, b1, b2, b3;
        LdMatrixX4(k_base + SwizzledChunk<kQkChunks>(k_row + pair * 16, ks * 2 + ((lane >> 3) & 1)),
                   b0, b1, b2, b3);
        MmaBf16(s[2 * pair], q_frag[ks], b0, b1);
        MmaBf16(s[2 * pair + 1], q_frag[ks], b2, b3);
      }
    }

    const bool needs_mask = (block + 1) * kBlockK > key_full;
    float block_max[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float value = s[j][e] * scale_log2;
        if (needs_mask) {
          const int key = block * kBlockK + j * 8 + 2 * c + (e & 1);
          const int limit = p.causal ? min(len_k, offset + query[r] + 1) : len_k;
          value = key < limit ? value : kNegInf;
        }
        s[j][e] = value;
        block_max[r] = fmaxf(block_max[r], value);
      }
    }
    float m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], QuadMax(block_max[r]));
      m_use[r] = m_new == kNegInf ? 0.f : m_new;
      const float alpha = exp2f(m[r] - m_use[r]);
      m[r] = m_new;
      l[r] *= alpha;
#pragma unroll
      for (int n = 0; n < kVTiles; ++n) {
        o[n][2 * r] *= alpha;
        o[n][2 * r + 1] *= alpha;
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = exp2f(s[j][e] - m_use[e >> 1]);
        l[e >> 1] += s[j][e];
      }
    }

    // O += P V with P from registers: k-step ks covers keys [16ks, 16ks+16) = S tiles 2ks, 2ks+1.
    const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int ks = 0; ks < kBlockK / 16; ++ks) {
      const uint32_t a[4] = {PackBf16(s[2 * ks][0], s[2 * ks][1]),
                             PackBf16(s[2 * ks][2], s[2 * ks][3]),
                             PackBf16(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                             PackBf16(s[2 * ks + 1][2], s[2 * ks + 1][3])};
#pragma unroll
      for (int pair = 0; pair < kVTiles / 2; ++pair) {
        uint32_t b0, b1, b2, b3;
        LdMatrixX4Trans(v_base + SwizzledChunk<kVChunks>(ks * 16 + v_row, pair * 2 + (lane >> 4)),
                        b0, b1, b2, b3);
        MmaBf16(o[2 * pair], a, b0, b1);
        MmaBf16(o[2 * pair + 1], a, b2, b3);
      }
    }
    __syncthreads();  // the next iteration overwrites this K/V buffer
  }
  CpAsyncWait<0>();

  const float totals[2] = {QuadSum(l[0]), QuadSum(l[1])};  // before any lane branches off
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = my_rows + g + 8 * r;
    if (row >= q_rows) continue;
    const float total = totals[r];
    const float inverse = total > 0.f ? 1.f / total : 0.f;
    const int64_t token = q_begin + q_start + row;
    const int64_t offset = token * p.out_token_stride + int64_t(head) * p.out_head_stride + 2 * c;
    if (p.out_dtype == DType::kBF16) {  // pairs: Check makes them 4-byte aligned
      auto* out = static_cast<__nv_bfloat16*>(p.out) + offset;
#pragma unroll
      for (int n = 0; n < kVTiles; ++n) {
        *reinterpret_cast<__nv_bfloat162*>(out + n * 8) =
            __floats2bfloat162_rn(o[n][2 * r] * inverse, o[n][2 * r + 1] * inverse);
      }
    } else {
      float* out = static_cast<float*>(p.out) + offset;
#pragma unroll
      for (int n = 0; n < kVTiles; ++n) {
        out[n * 8] = o[n][2 * r] * inverse;
        out[n * 8 + 1] = o[n][2 * r + 1] * inverse;
      }
    }
    if (p.lse != nullptr && c == 0) {
      p.lse[token * p.lse_token_stride + head] =
          total > 0.f ? (m[r] + log2f(total)) * 0.6931471805599453f : kNegInf;
    }
  }
}

template <int kQkDim, int kVDim>
absl::Status LaunchDenseMha(const DenseMhaParams& p, cudaStream_t stream) {
  using Config = DenseMhaConfig<kQkDim, kVDim>;
  auto kernel = DenseMhaKernel<kQkDim, kVDim>;
  // The shared-memory limit is a per-device attribute of the function: set it once per device.
  static std::atomic<uint64_t> configured{0};
  int device = 0;
  DCP_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit == 0 || (configured.load(std::memory_order_relaxed) & bit) == 0) {
    DCP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        Config::kSmemBytes));
    configured.fetch_or(bit, std::memory_order_relaxed);
  }
  // grid.z holds at most 65535 sequences: more take several launches, each over its share of
  // cu_seqlens (the offsets in them are absolute, so only the arrays' starts move).
  constexpr int kMaxSeqsPerLaunch = 65535;
  for (int first = 0; first < p.num_seqs; first += kMaxSeqsPerLaunch) {
    DenseMhaParams part = p;
    part.num_seqs = std::min(kMaxSeqsPerLaunch, p.num_seqs - first);
    part.cu_seqlens_q = p.cu_seqlens_q + first;
    part.cu_seqlens_k = p.cu_seqlens_k + first;
    const dim3 grid((p.max_seqlen_q + Config::kBlockQ - 1) / Config::kBlockQ, p.num_heads,
                    part.num_seqs);
    kernel<<<grid, Config::kThreads, Config::kSmemBytes, stream>>>(part);
    DCP_CUDA_LAUNCH_CHECK("DenseMhaKernel");
  }
  return absl::OkStatus();
}

}  // namespace dcp::cuda
