// LSE merges on CPU (DESIGN.md section 3, "Merge"): MergeStates of two partials and the two DCP
// combine forms. An LSE that is NaN or +inf counts as -inf (an empty partial), and an empty
// partial's out is never read, so garbage behind it cannot leak; all empty gives (0, -inf).
// Memory-bound: threads split the (token, head) rows when there are many.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attention/cpu/attention_cpu.h"
#include "attention/cpu/cpu_kernel_utils.h"
#include "core/status.h"

namespace dcp::cpu {
namespace {

using internal::kNegInf;

// NaN and +inf are not the LSE of any real partial: treat them as the empty set.
inline float SanitizeLse(float lse) {
  return (std::isnan(lse) || lse == std::numeric_limits<float>::infinity()) ? kNegInf : lse;
}

absl::Status CheckGrid(const char* name, int world_size, int num_tokens, int num_heads, int dim) {
  DCP_CHECK_ARG(world_size >= 1, "%s: world_size (%d) must be positive", name, world_size);
  DCP_CHECK_ARG(num_tokens >= 0, "%s: num_tokens (%d) < 0", name, num_tokens);
  DCP_CHECK_ARG(num_heads > 0, "%s: num_heads (%d) must be positive", name, num_heads);
  DCP_CHECK_ARG(dim > 0, "%s: dim (%d) must be positive", name, dim);
  return absl::OkStatus();
}

// Splits rows (token, head) over threads; each row moves about `bytes_per_row` bytes.
template <typename Fn>
void ForEachRow(int64_t num_rows, double bytes_per_row, Fn&& fn) {
  internal::ParallelFor(num_rows, num_rows * bytes_per_row, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) fn(row);
  });
}

}  // namespace

absl::Status MergeStates(const MergeStatesParams& p) {
  DCP_RETURN_IF_ERROR(CheckGrid("MergeStates", 1, p.num_tokens, p.num_heads, p.dim));
  if (p.num_tokens == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.out_a != nullptr && p.lse_a != nullptr, "MergeStates: out_a or lse_a is null");
  DCP_CHECK_ARG(p.out_b != nullptr && p.lse_b != nullptr, "MergeStates: out_b or lse_b is null");
  DCP_CHECK_ARG(p.out != nullptr && p.lse != nullptr, "MergeStates: out or lse is null");
  const int dim = p.dim;
  ForEachRow(int64_t{p.num_tokens} * p.num_heads, 12.0 * dim, [&](int64_t row) {
    // Read both LSEs before writing: out/lse may alias a or b.
    const float lse_a = SanitizeLse(p.lse_a[row]);
    const float lse_b = SanitizeLse(p.lse_b[row]);
    const float* a = p.out_a + row * dim;
    const float* b = p.out_b + row * dim;
    float* out = p.out + row * dim;
    const float max = std::max(lse_a, lse_b);
    if (max == kNegInf) {
      std::fill(out, out + dim, 0.0f);
      p.lse[row] = kNegInf;
      return;
    }
    const float weight_a = std::exp(lse_a - max);  // exactly 0 for an empty side
    const float weight_b = std::exp(lse_b - max);
    const float sum = weight_a + weight_b;
    const float scale_a = weight_a / sum, scale_b = weight_b / sum;
    if (lse_a == kNegInf) {
      for (int c = 0; c < dim; ++c) out[c] = b[c];
    } else if (lse_b == kNegInf) {
      for (int c = 0; c < dim; ++c) out[c] = a[c];
    } else {
      for (int c = 0; c < dim; ++c) out[c] = scale_a * a[c] + scale_b * b[c];
    }
    p.lse[row] = max + std::log(sum);
  });
  return absl::OkStatus();
}

absl::Status DcpCorrect(const DcpCorrectParams& p) {
  DCP_RETURN_IF_ERROR(CheckGrid("DcpCorrect", p.world_size, p.num_tokens, p.num_heads, p.dim));
  DCP_CHECK_ARG(p.rank >= 0 && p.rank < p.world_size, "DcpCorrect: rank %d outside [0, %d)", p.rank,
                p.world_size);
  if (p.num_tokens == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.out != nullptr, "DcpCorrect: out is null");
  DCP_CHECK_ARG(p.lse_all != nullptr, "DcpCorrect: lse_all is null");
  const int64_t num_rows = int64_t{p.num_tokens} * p.num_heads;
  const int dim = p.dim;
  ForEachRow(num_rows, 8.0 * dim, [&](int64_t row) {
    float max = kNegInf;
    for (int w = 0; w < p.world_size; ++w) {
      max = std::max(max, SanitizeLse(p.lse_all[w * num_rows + row]));
    }
    float* out = p.out + row * dim;
    const float own = SanitizeLse(p.lse_all[p.rank * num_rows + row]);
    if (max == kNegInf) {
      std::fill(out, out + dim, 0.0f);
      if (p.lse_total != nullptr) p.lse_total[row] = kNegInf;
      return;
    }
    float sum = 0.0f;
    for (int w = 0; w < p.world_size; ++w) {
      sum += std::exp(SanitizeLse(p.lse_all[w * num_rows + row]) - max);
    }
    const float total = max + std::log(sum);
    if (own == kNegInf) {
      std::fill(out, out + dim, 0.0f);  // not 0 * out: an empty partial may hold anything
    } else {
      // e^(own - max) / sum, not e^(own - total): far from zero, fp32 total loses log(sum).
      const float scale = std::exp(own - max) / sum;
      for (int c = 0; c < dim; ++c) out[c] *= scale;
    }
    if (p.lse_total != nullptr) p.lse_total[row] = total;
  });
  return absl::OkStatus();
}

absl::Status DcpCombine(const DcpCombineParams& p) {
  DCP_RETURN_IF_ERROR(CheckGrid("DcpCombine", p.world_size, p.num_tokens, p.num_heads, p.dim));
  if (p.num_tokens == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.outs != nullptr, "DcpCombine: outs is null");
  DCP_CHECK_ARG(p.lses != nullptr, "DcpCombine: lses is null");
  DCP_CHECK_ARG(p.out != nullptr, "DcpCombine: out is null");
  const int64_t num_rows = int64_t{p.num_tokens} * p.num_heads;
  const int dim = p.dim;
  ForEachRow(num_rows, 4.0 * dim * (p.world_size + 1), [&](int64_t row) {
    float max = kNegInf;
    for (int w = 0; w < p.world_size; ++w) {
      max = std::max(max, SanitizeLse(p.lses[w * num_rows + row]));
    }
    float* out = p.out + row * dim;
    std::fill(out, out + dim, 0.0f);
    if (max == kNegInf) {
      if (p.lse != nullptr) p.lse[row] = kNegInf;
      return;
    }
    float sum = 0.0f;
    for (int w = 0; w < p.world_size; ++w) {
      sum += std::exp(SanitizeLse(p.lses[w * num_rows + row]) - max);
    }
    const float total = max + std::log(sum), inverse = 1.0f / sum;
    for (int w = 0; w < p.world_size; ++w) {
      const float lse = SanitizeLse(p.lses[w * num_rows + row]);
      if (lse == kNegInf) continue;
      const float scale = std::exp(lse - max) * inverse;  // as in DcpCorrect
      const float* partial = p.outs + (w * num_rows + row) * dim;
      for (int c = 0; c < dim; ++c) out[c] += scale * partial[c];
    }
    if (p.lse != nullptr) p.lse[row] = total;
  });
  return absl::OkStatus();
}

}  // namespace dcp::cpu
