// SparseMqa on CPU. Thread mapping: one task = (token, block of heads); the token's in-range
// slots are gathered, and each block of kKeyBlock cache rows is copied once into the tile (as K
// over all head_dim columns and as V over the first v_dim) and shared by every head of the
// task: the MQA reuse that makes this a matrix product rather than H dot products. fp8_ds_mla
// rows are dequantized to fp32 as they are copied into the tile (no separate upconvert pass).
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "attention/cpu/attention_cpu.h"
#include "attention/cpu/attention_tile.h"
#include "attention/cpu/cpu_kernel_utils.h"
#include "core/kv_cache_format.h"
#include "core/status.h"

namespace dcp::cpu {
namespace {

using internal::AttentionTile;
using internal::kKeyBlock;

absl::Status CheckSparseMqaParams(const SparseMqaParams& p) {
  DCP_CHECK_ARG(p.num_tokens >= 0, "SparseMqa: num_tokens (%d) < 0", p.num_tokens);
  DCP_CHECK_ARG(p.num_heads > 0, "SparseMqa: num_heads (%d) must be positive", p.num_heads);
  DCP_CHECK_ARG(p.head_dim > 0, "SparseMqa: head_dim (%d) must be positive", p.head_dim);
  DCP_CHECK_ARG(p.v_dim > 0 && p.v_dim <= p.head_dim,
                "SparseMqa: v_dim (%d) must be in [1, head_dim = %d]", p.v_dim, p.head_dim);
  DCP_CHECK_ARG(p.topk >= 0, "SparseMqa: topk (%d) < 0", p.topk);
  DCP_CHECK_ARG(p.num_slots >= 0, "SparseMqa: num_slots (%d) < 0", p.num_slots);
  DCP_CHECK_ARG(internal::IsFloatDType(p.dtype), "SparseMqa: dtype %s is not F32 or BF16",
                dtype_name(p.dtype));
  DCP_RETURN_IF_ERROR(CheckKvCacheDTypeSupported(p.kv_format, "SparseMqa"));
  if (p.kv_format == KvCacheDType::kFp8DsMla) {
    DCP_CHECK_ARG(p.head_dim == fp8_ds_mla::kRowWidth && p.v_dim == fp8_ds_mla::kLatentDim,
                  "SparseMqa: fp8_ds_mla rows need head_dim %d / v_dim %d, got %d / %d",
                  fp8_ds_mla::kRowWidth, fp8_ds_mla::kLatentDim, p.head_dim, p.v_dim);
    DCP_CHECK_ARG(p.kv_row_stride == fp8_ds_mla::kRowBytes,
                  "SparseMqa: fp8_ds_mla rows are %d bytes, got a kv_row_stride of %d bytes",
                  fp8_ds_mla::kRowBytes, p.kv_row_stride);
  }
  if (p.num_tokens == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.q != nullptr, "SparseMqa: q is null");
  DCP_CHECK_ARG(p.out != nullptr, "SparseMqa: out is null");
  DCP_CHECK_ARG(p.lse != nullptr, "SparseMqa: lse is null");
  DCP_CHECK_ARG(p.topk == 0 || p.indices != nullptr, "SparseMqa: indices is null");
  DCP_CHECK_ARG(p.num_slots == 0 || p.kv_cache != nullptr, "SparseMqa: kv_cache is null");
  DCP_CHECK_ARG(p.num_slots == 0 || p.kv_row_stride >= p.head_dim,
                "SparseMqa: kv_row_stride (%d) < head_dim (%d)", p.kv_row_stride, p.head_dim);
  DCP_CHECK_ARG(p.topk == 0 || p.indices_token_stride >= p.topk,
                "SparseMqa: indices_token_stride (%d) < topk (%d)", p.indices_token_stride, p.topk);
  DCP_CHECK_ARG(p.q_token_stride >= 0 && p.q_head_stride >= 0,
                "SparseMqa: negative q stride (q_token_stride=%d, q_head_stride=%d)",
                p.q_token_stride, p.q_head_stride);
  DCP_CHECK_ARG(p.out_token_stride > 0 && (p.num_heads == 1 || p.out_head_stride > 0),
                "SparseMqa: out_token_stride (%d) / out_head_stride (%d) must be positive",
                p.out_token_stride, p.out_head_stride);
  DCP_CHECK_ARG(p.lse_token_stride >= p.num_heads,
                "SparseMqa: lse_token_stride (%d) < num_heads (%d)", p.lse_token_stride,
                p.num_heads);
  return absl::OkStatus();
}

// validate = true: every index in [-1, num_slots), none repeated in a row. Sorting a copy of
// each row keeps this O(topk log topk) whatever the number of slots.
absl::Status ValidateSlots(const SparseMqaParams& p) {
  std::vector<std::pair<int32_t, int>> row;  // (slot, column)
  for (int t = 0; t < p.num_tokens; ++t) {
    const int32_t* indices = p.indices + int64_t{t} * p.indices_token_stride;
    row.clear();
    for (int c = 0; c < p.topk; ++c) {
      const int32_t slot = indices[c];
      if (slot == -1) continue;
      if (slot < -1 || slot >= p.num_slots) {
        return DCP_ERROR(InvalidArgument,
                         "SparseMqa: token %d column %d: slot %d outside [-1, num_slots = %d)", t,
                         c, slot, p.num_slots);
      }
      row.emplace_back(slot, c);
    }
    std::sort(row.begin(), row.end());
    for (size_t i = 1; i < row.size(); ++i) {
      if (row[i].first == row[i - 1].first) {
        return DCP_ERROR(InvalidArgument,
                         "SparseMqa: token %d: slot %d repeated (columns %d and %d)", t,
                         row[i].first, row[i - 1].second, row[i].second);
      }
    }
  }
  return absl::OkStatus();
}

// Heads per task: all of them when the tokens alone keep every core busy (each K/V block is
// then packed once per token); fewer when a small decode batch must still use every core.
int HeadsPerTask(const SparseMqaParams& p) {
  const int threads = internal::NumThreads();
  if (p.num_tokens >= 2 * threads) return p.num_heads;
  const int wanted_tasks_per_token = (2 * threads + p.num_tokens - 1) / p.num_tokens;
  const int heads = (p.num_heads + wanted_tasks_per_token - 1) / wanted_tasks_per_token;
  return std::min(p.num_heads, std::max(heads, 12));
}

// T: the dtype of q (and of the cache rows for kBF16). kFormat kFp8DsMla dequantizes each
// gathered 656-byte row into fp32 on its way into the tile.
template <typename T, KvCacheDType kFormat>
void RunSparseMqa(const SparseMqaParams& p) {
  constexpr bool kFp8 = kFormat == KvCacheDType::kFp8DsMla;
  using Row = std::conditional_t<kFp8, uint8_t, T>;
  const T* q = static_cast<const T*>(p.q);
  const Row* kv = static_cast<const Row*>(p.kv_cache);
  const int heads_per_task = HeadsPerTask(p);
  const int head_blocks = (p.num_heads + heads_per_task - 1) / heads_per_task;
  const double flops = 2.0 * p.num_tokens * p.topk * p.num_heads * (p.head_dim + p.v_dim);
  internal::ParallelFor(
      int64_t{p.num_tokens} * head_blocks, flops, [&](int64_t begin, int64_t end) {
        AttentionTile tile(heads_per_task, p.head_dim, p.v_dim);
        std::vector<int32_t> slots;
        slots.reserve(p.topk);
        std::vector<float> dequantized(kFp8 ? fp8_ds_mla::kRowWidth : 0);
        for (int64_t task = begin; task < end; ++task) {
          const int64_t token = task / head_blocks;
          const int head0 = static_cast<int>(task % head_blocks) * heads_per_task;
          const int num_heads = std::min(heads_per_task, p.num_heads - head0);
          // Only rows inside the cache are ever read, checked or not.
          slots.clear();
          const int32_t* indices = p.indices + token * p.indices_token_stride;
          const int columns = p.valid_counts == nullptr
                                  ? p.topk
                                  : std::clamp(p.valid_counts[token], 0, p.topk);
          for (int c = 0; c < columns; ++c) {
            if (indices[c] >= 0 && indices[c] < p.num_slots) slots.push_back(indices[c]);
          }
          tile.Reset(num_heads);
          const T* q_heads = q + token * p.q_token_stride + head0 * p.q_head_stride;
          internal::PackBFromColumns(
              p.head_dim, num_heads, [&](int h) { return q_heads + h * p.q_head_stride; },
              tile.q_packed());
          const int num_keys = static_cast<int>(slots.size());
          for (int key0 = 0; key0 < num_keys; key0 += kKeyBlock) {
            const int block_keys = std::min(kKeyBlock, num_keys - key0);
            for (int j = 0; j < block_keys; ++j) {
              const Row* row = kv + slots[key0 + j] * p.kv_row_stride;
              if constexpr (kFp8) {
                fp8_ds_mla::DequantizeRow(row, dequantized.data());
                tile.SetKeyRow(j, dequantized.data());
                tile.SetValueRow(j, dequantized.data());
              } else {
                tile.SetKeyRow(j, row);    // the whole latent row [kv_c | k_pe]
                tile.SetValueRow(j, row);  // its first v_dim columns (kv_c)
              }
            }
            tile.AddKeyBlock(block_keys, nullptr, p.scale);
          }
          tile.Finish(
              [&](int h) {
                return p.out + token * p.out_token_stride + (head0 + h) * p.out_head_stride;
              },
              [&](int h, float lse) { p.lse[token * p.lse_token_stride + head0 + h] = lse; });
        }
      });
}

}  // namespace

absl::Status SparseMqa(const SparseMqaParams& params, bool validate) {
  DCP_CHECK_ARG(params.out_bf16 == nullptr,
                "SparseMqa (CPU): out_bf16 is a CUDA option; CPU ranks write o_lat to out");
  DCP_RETURN_IF_ERROR(CheckSparseMqaParams(params));
  if (params.deferred_merge != nullptr) *params.deferred_merge = {};  // no split: out written
  if (params.num_tokens == 0) return absl::OkStatus();
  if (validate) DCP_RETURN_IF_ERROR(ValidateSlots(params));
  constexpr KvCacheDType kBF16 = KvCacheDType::kBF16, kFp8 = KvCacheDType::kFp8DsMla;
  const bool fp8 = params.kv_format == kFp8;
  if (params.dtype == DType::kF32) {
    fp8 ? RunSparseMqa<float, kFp8>(params) : RunSparseMqa<float, kBF16>(params);
  } else {
    fp8 ? RunSparseMqa<bf16, kFp8>(params) : RunSparseMqa<bf16, kBF16>(params);
  }
  return absl::OkStatus();
}

}  // namespace dcp::cpu
