// Thread mapping: one CTA per top-k row (grid-stride over rows), each thread a strided share of
// the row's columns, so the row is read coalesced. Repeats: each in-range index sets its bit in
// a shared-memory bitmap of max_positions bits with atomicOr (a bit already set is a repeat; in
// rows up to kHeldColumns x 256 wide the lanes of a warp that share a word OR their bits first
// and one atomicOr sets them, MarkHeldColumn);
// the bits are cleared through the row itself afterwards, so a row costs O(topk) whatever the
// request length. When the bitmap does not fit in shared memory (kBitmap false), each column
// instead compares itself with the columns before it (O(topk^2) per row, no extra memory).
// A row that looks bad takes the exact pass: the lowest column that is out of range or repeats
// an earlier column, then atomicMin of (row << 32 | column) into the record, so the first error
// of the whole call (lowest row, then column) wins whatever the CTA order.
#pragma once

#include <climits>
#include <cstdint>

#include "attention/cuda/topk_validate.h"

namespace dcp::cuda {

constexpr int kTopkValidateThreads = 256;

__device__ __forceinline__ bool TopkRepeatsEarlier(const int32_t* __restrict__ row, int column,
                                                   int32_t index) {
  for (int c = 0; c < column; ++c) {
    if (row[c] == index) return true;
  }
  return false;
}

// Columns of a row each thread holds in registers: rows up to kHeldColumns x 256 = 2048 wide
// (index_topk's usual width) are loaded once, every load of a thread issued before the first
// is used (one memory round trip per row instead of one per column, which made the check of
// 8192 rows of 2048 take tens of us), and the bitmap is cleared from the registers. Wider rows
// walk the row in a loop and read it again for the clear.
constexpr int kHeldColumns = 8;

// Whether column `column` (value `index`) of a row for a token at `position` looks bad: out of
// range, or a repeat (its bit already set; without the bitmap, an equal earlier column).
template <bool kBitmap>
__device__ __forceinline__ bool SuspectColumn(const int32_t* __restrict__ row, int column,
                                              int32_t index, int position, uint32_t* bitmap) {
  if (index == -1) return false;
  if (index < -1 || index > position) return true;
  if constexpr (kBitmap) {
    const uint32_t bit = 1u << (index & 31);
    return (atomicOr(&bitmap[index >> 5], bit) & bit) != 0;
  } else {
    return TopkRepeatsEarlier(row, column, index);
  }
}

// The held columns' bitmap update, one call by all 32 lanes of a warp: lanes whose indices
// share a bitmap word OR their bits together and one of them does the atomicOr. Lane by lane,
// the 32 lanes of a row of consecutive indices (a short prefill's top-k: every key) hit one
// word and the atomics ran one after another. A repeat is two equal indices among the lanes
// (fewer distinct bits than lanes in the group) or a bit an earlier column set.
__device__ __forceinline__ bool MarkHeldColumn(uint32_t* bitmap, bool in_range, int32_t index) {
  const unsigned word = in_range ? static_cast<unsigned>(index) >> 5 : 0xffffffffu;
  const uint32_t bit = in_range ? 1u << (index & 31) : 0u;
  const unsigned peers = __match_any_sync(0xffffffffu, word);
  const uint32_t bits = __reduce_or_sync(peers, bit);
  if (!in_range) return false;
  bool repeat = __popc(bits) != __popc(peers);
  if (__ffs(peers) - 1 == static_cast<int>(threadIdx.x % 32)) {
    repeat |= (atomicOr(&bitmap[word], bits) & bits) != 0;
  }
  return repeat;
}

template <bool kBitmap>
__global__ void __launch_bounds__(kTopkValidateThreads)
    TopkValidateKernel(const int32_t* __restrict__ topk, const int32_t* __restrict__ token_position,
                       int num_tokens, int width, int64_t token_stride, int max_positions,
                       unsigned long long* __restrict__ first_error) {
  extern __shared__ uint32_t bitmap[];  // [ceil(max_positions / 32)] when kBitmap
  __shared__ int row_error_column;
  if constexpr (kBitmap) {
    const int words = (max_positions + 31) / 32;
    for (int w = threadIdx.x; w < words; w += blockDim.x) bitmap[w] = 0;
  }
  const bool held = width <= kHeldColumns * kTopkValidateThreads;
  for (int token = blockIdx.x; token < num_tokens; token += gridDim.x) {
    if (threadIdx.x == 0) row_error_column = INT_MAX;
    // Orders the bitmap clear (first row: the zeroing above) before this row's atomicOr.
    __syncthreads();
    const int position = token_position[token];
    if (position < 0 || position >= max_positions) {  // the same for the whole CTA
      if (threadIdx.x == 0) atomicMin(first_error, (unsigned long long)token << 32);
      continue;
    }
    const int32_t* row = topk + token * token_stride;
    bool suspect = false;
    int32_t values[kHeldColumns];
    if (held) {
#pragma unroll
      for (int k = 0; k < kHeldColumns; ++k) {
        const int c = threadIdx.x + k * kTopkValidateThreads;
        values[k] = c < width ? row[c] : -1;  // -1: nothing to check
      }
#pragma unroll
      for (int k = 0; k < kHeldColumns; ++k) {
        const int32_t index = values[k];
        if constexpr (kBitmap) {  // every lane of the warp takes part (kHeldColumns is fixed)
          suspect |= index < -1 || index > position;
          suspect |= MarkHeldColumn(bitmap, index >= 0 && index <= position, index);
        } else {
          suspect |= SuspectColumn<false>(row, threadIdx.x + k * kTopkValidateThreads, index,
                                          position, bitmap);
        }
      }
    } else {
      for (int c = threadIdx.x; c < width; c += blockDim.x) {
        suspect |= SuspectColumn<kBitmap>(row, c, row[c], position, bitmap);
      }
    }
    if (__syncthreads_or(suspect)) {
      // Error path: which column is the first bad one (a set bit does not say which of the
      // equal columns came first).
      for (int c = threadIdx.x; c < width; c += blockDim.x) {
        const int32_t index = row[c];
        if (index != -1 && (index < -1 || index > position || TopkRepeatsEarlier(row, c, index))) {
          atomicMin(&row_error_column, c);
        }
      }
      __syncthreads();
      if (threadIdx.x == 0 && row_error_column != INT_MAX) {
        atomicMin(first_error, ((unsigned long long)token << 32) | unsigned(row_error_column));
      }
    }
    if constexpr (kBitmap) {
      // Every set bit came from an in-range index of this row: zero their words.
      if (held) {
#pragma unroll
        for (int k = 0; k < kHeldColumns; ++k) {
          if (values[k] >= 0 && values[k] <= position) bitmap[values[k] >> 5] = 0;
        }
      } else {
        for (int c = threadIdx.x; c < width; c += blockDim.x) {
          const int32_t index = row[c];
          if (index >= 0 && index <= position) bitmap[index >> 5] = 0;
        }
      }
    }
  }
}

// One thread: turns the record's first_error into a TopkError (kind kNone when there is none).
__global__ void TopkDescribeKernel(const int32_t* __restrict__ topk,
                                   const int32_t* __restrict__ token_position, int64_t token_stride,
                                   int max_positions, int first_token,
                                   TopkValidateRecord* __restrict__ record) {
  TopkError error;
  error.max_positions = max_positions;
  const unsigned long long first = record->first_error;
  if (first != ~0ull) {
    const int token = static_cast<int>(first >> 32);
    const int column = static_cast<int>(first & 0xffffffffu);
    error.token = first_token + token;
    error.position = token_position[token];
    if (error.position < 0) {
      error.kind = TopkErrorKind::kNegativePosition;
    } else if (error.position >= max_positions) {
      error.kind = TopkErrorKind::kPositionPastLimit;
    } else {
      const int32_t* row = topk + token * token_stride;
      error.column = column;
      error.value = row[column];
      if (error.value < -1) {
        error.kind = TopkErrorKind::kBelowMinusOne;
      } else if (error.value > error.position) {
        error.kind = TopkErrorKind::kFutureKey;
      } else {
        error.kind = TopkErrorKind::kRepeated;
        for (int c = 0; c < column; ++c) {
          if (row[c] == error.value) {
            error.earlier_column = c;
            break;
          }
        }
      }
    }
  }
  record->error = error;
}

}  // namespace dcp::cuda
