// DenseMha on CPU. Thread mapping: one task = (sequence, block of kQueryBlock queries, head);
// a task packs its queries once and streams the sequence's visible keys in blocks of
// kKeyBlock through an AttentionTile. Causal tasks of late query blocks see more keys, so tasks
// are handed out dynamically.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "attention/cpu/attention_cpu.h"
#include "attention/cpu/attention_tile.h"
#include "attention/cpu/cpu_kernel_utils.h"
#include "core/status.h"

namespace dcp::cpu {
namespace {

using internal::AttentionTile;
using internal::kKeyBlock;

constexpr int kQueryBlock = 48;  // a multiple of the register tile's 6 rows

absl::Status CheckDenseMhaParams(const DenseMhaParams& p) {
  DCP_CHECK_ARG(p.num_seqs >= 0, "DenseMha: num_seqs (%d) < 0", p.num_seqs);
  DCP_CHECK_ARG(p.num_heads > 0, "DenseMha: num_heads (%d) must be positive", p.num_heads);
  DCP_CHECK_ARG(p.qk_dim > 0, "DenseMha: qk_dim (%d) must be positive", p.qk_dim);
  DCP_CHECK_ARG(p.v_dim > 0, "DenseMha: v_dim (%d) must be positive", p.v_dim);
  DCP_CHECK_ARG(internal::IsFloatDType(p.dtype), "DenseMha: dtype %s is not F32 or BF16",
                dtype_name(p.dtype));
  if (p.num_seqs == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.cu_seqlens_q != nullptr, "DenseMha: cu_seqlens_q is null");
  DCP_CHECK_ARG(p.cu_seqlens_k != nullptr, "DenseMha: cu_seqlens_k is null");
  DCP_CHECK_ARG(p.cu_seqlens_q[0] >= 0 && p.cu_seqlens_k[0] >= 0,
                "DenseMha: cu_seqlens_q[0] (%d) or cu_seqlens_k[0] (%d) is negative",
                p.cu_seqlens_q[0], p.cu_seqlens_k[0]);
  for (int s = 0; s < p.num_seqs; ++s) {
    const int lq = p.cu_seqlens_q[s + 1] - p.cu_seqlens_q[s];
    const int lk = p.cu_seqlens_k[s + 1] - p.cu_seqlens_k[s];
    DCP_CHECK_ARG(lq >= 0, "DenseMha: cu_seqlens_q decreases at sequence %d (%d -> %d)", s,
                  p.cu_seqlens_q[s], p.cu_seqlens_q[s + 1]);
    DCP_CHECK_ARG(lk >= 0, "DenseMha: cu_seqlens_k decreases at sequence %d (%d -> %d)", s,
                  p.cu_seqlens_k[s], p.cu_seqlens_k[s + 1]);
    DCP_CHECK_ARG(p.max_seqlen_q <= 0 || lq <= p.max_seqlen_q,
                  "DenseMha: sequence %d has %d queries > max_seqlen_q (%d)", s, lq,
                  p.max_seqlen_q);
    DCP_CHECK_ARG(p.max_seqlen_k <= 0 || lk <= p.max_seqlen_k,
                  "DenseMha: sequence %d has %d keys > max_seqlen_k (%d)", s, lk, p.max_seqlen_k);
  }
  if (p.cu_seqlens_q[p.num_seqs] == p.cu_seqlens_q[0]) return absl::OkStatus();
  DCP_CHECK_ARG(p.q != nullptr, "DenseMha: q is null");
  DCP_CHECK_ARG(p.out != nullptr, "DenseMha: out is null");
  DCP_CHECK_ARG(p.out_dtype == DType::kF32 || p.out_dtype == DType::kBF16,
                "DenseMha: out dtype must be F32 or BF16 (got %s)", dtype_name(p.out_dtype));
  if (p.cu_seqlens_k[p.num_seqs] > p.cu_seqlens_k[0]) {
    DCP_CHECK_ARG(p.k != nullptr, "DenseMha: k is null");
    DCP_CHECK_ARG(p.v != nullptr, "DenseMha: v is null");
  }
  DCP_CHECK_ARG(p.q_token_stride >= 0 && p.q_head_stride >= 0 && p.k_token_stride >= 0 &&
                    p.k_head_stride >= 0 && p.v_token_stride >= 0 && p.v_head_stride >= 0,
                "DenseMha: negative q/k/v stride");
  DCP_CHECK_ARG(p.out_token_stride > 0 && (p.num_heads == 1 || p.out_head_stride > 0),
                "DenseMha: out_token_stride (%d) / out_head_stride (%d) must be positive",
                p.out_token_stride, p.out_head_stride);
  DCP_CHECK_ARG(p.lse == nullptr || p.lse_token_stride >= p.num_heads,
                "DenseMha: lse_token_stride (%d) < num_heads (%d)", p.lse_token_stride,
                p.num_heads);
  return absl::OkStatus();
}

struct QueryBlock {
  int seq, first, count;  // queries [first, first + count) of the sequence
};

template <typename T>
void RunDenseMha(const DenseMhaParams& p) {
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  float* out_f32 = p.out_dtype == DType::kF32 ? static_cast<float*>(p.out) : nullptr;
  bf16* out_bf16 = p.out_dtype == DType::kBF16 ? static_cast<bf16*>(p.out) : nullptr;
  std::vector<QueryBlock> blocks;
  double flops = 0;
  for (int s = 0; s < p.num_seqs; ++s) {
    const int lq = p.cu_seqlens_q[s + 1] - p.cu_seqlens_q[s];
    const int lk = p.cu_seqlens_k[s + 1] - p.cu_seqlens_k[s];
    for (int first = 0; first < lq; first += kQueryBlock) {
      blocks.push_back({s, first, std::min(kQueryBlock, lq - first)});
    }
    flops += 2.0 * lq * lk * (p.qk_dim + p.v_dim) * p.num_heads;
  }
  const int64_t num_tasks = static_cast<int64_t>(blocks.size()) * p.num_heads;
  internal::ParallelFor(num_tasks, flops, [&](int64_t begin, int64_t end) {
    AttentionTile tile(kQueryBlock, p.qk_dim, p.v_dim);
    int visible[kQueryBlock];
    std::vector<float> row(out_bf16 != nullptr ? size_t(kQueryBlock) * p.v_dim : 0);
    for (int64_t task = begin; task < end; ++task) {
      const QueryBlock& block = blocks[task / p.num_heads];
      const int head = static_cast<int>(task % p.num_heads);
      const int lq = p.cu_seqlens_q[block.seq + 1] - p.cu_seqlens_q[block.seq];
      const int lk = p.cu_seqlens_k[block.seq + 1] - p.cu_seqlens_k[block.seq];
      const int64_t q_token0 = p.cu_seqlens_q[block.seq] + block.first;
      const int64_t k_token0 = p.cu_seqlens_k[block.seq];
      // Keys query i (of the block) sees: the bottom-right aligned causal prefix, or all.
      auto num_visible = [&](int i) {
        return p.causal ? std::clamp(lk - lq + block.first + i + 1, 0, lk) : lk;
      };
      const int num_keys = num_visible(block.count - 1);  // the block's last query sees most

      tile.Reset(block.count);
      const T* q_rows = q + q_token0 * p.q_token_stride + head * p.q_head_stride;
      internal::PackBFromColumns(
          p.qk_dim, block.count, [&](int i) { return q_rows + i * p.q_token_stride; },
          tile.q_packed());
      for (int key0 = 0; key0 < num_keys; key0 += kKeyBlock) {
        const int block_keys = std::min(kKeyBlock, num_keys - key0);
        const T* k_rows = k + (k_token0 + key0) * p.k_token_stride + head * p.k_head_stride;
        const T* v_rows = v + (k_token0 + key0) * p.v_token_stride + head * p.v_head_stride;
        for (int j = 0; j < block_keys; ++j) {
          tile.SetKeyRow(j, k_rows + j * p.k_token_stride);
          tile.SetValueRow(j, v_rows + j * p.v_token_stride);
        }
        for (int i = 0; i < block.count; ++i) visible[i] = num_visible(i) - key0;
        tile.AddKeyBlock(block_keys, p.causal ? visible : nullptr, p.scale);
      }
      // fp32 rows straight into out; bf16 rows through a row of the tile's own, rounded once.
      const auto out_offset = [&](int i) {
        return (q_token0 + i) * p.out_token_stride + head * p.out_head_stride;
      };
      tile.Finish(
          [&](int i) {
            return out_f32 != nullptr ? out_f32 + out_offset(i) : row.data() + int64_t{i} * p.v_dim;
          },
          [&](int i, float lse) {
            if (p.lse != nullptr) p.lse[(q_token0 + i) * p.lse_token_stride + head] = lse;
          });
      if (out_bf16 != nullptr) {
        for (int i = 0; i < block.count; ++i) {
          bf16* dst = out_bf16 + out_offset(i);
          const float* src = row.data() + int64_t{i} * p.v_dim;
          for (int c = 0; c < p.v_dim; ++c) dst[c] = float_to_bf16(src[c]);
        }
      }
    }
  });
}

}  // namespace

absl::Status DenseMha(const DenseMhaParams& params) {
  DCP_RETURN_IF_ERROR(CheckDenseMhaParams(params));
  if (params.num_seqs == 0) return absl::OkStatus();
  if (params.dtype == DType::kF32) {
    RunDenseMha<float>(params);
  } else {
    RunDenseMha<bf16>(params);
  }
  return absl::OkStatus();
}

}  // namespace dcp::cpu
