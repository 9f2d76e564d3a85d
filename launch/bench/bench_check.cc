#include "launch/bench/bench_check.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "launch/bench/bench_data.h"

namespace dcp::bench {
namespace {

constexpr uint64_t kStreamPartialOut = 7000, kStreamPartialLse = 8000;

}  // namespace

ValueStream PartialOutValues(uint64_t seed, int rank, int block) {
  return ValueStream(seed, kStreamPartialOut + uint64_t(rank) * 4096 + uint64_t(block));
}

float PartialLse(uint64_t seed, int rank, int block, int64_t row) {
  if (row % 13 == 0) return -std::numeric_limits<float>::infinity();
  const ValueStream value(seed, kStreamPartialLse + uint64_t(rank) * 4096 + uint64_t(block));
  if (value.Bits(uint64_t(row)) % 7 == 0) return -std::numeric_limits<float>::infinity();
  return 4.0f * value(uint64_t(row));
}

void MergeReference(absl::Span<const double> lses, absl::Span<const double> outs, int dim,
                    double* lse, double* out) {
  double top = -std::numeric_limits<double>::infinity();
  for (double l : lses) top = std::max(top, l);
  std::fill(out, out + dim, 0.0);
  if (std::isinf(top)) {
    *lse = -std::numeric_limits<double>::infinity();
    return;
  }
  double sum = 0;
  for (double l : lses) sum += std::exp(l - top);
  *lse = top + std::log(sum);
  for (size_t i = 0; i < lses.size(); ++i) {
    const double weight = std::exp(lses[i] - *lse);
    for (int d = 0; d < dim; ++d) out[d] += weight * outs[i * dim + d];
  }
}

bool Close(float got, double want, double rtol, double atol) {
  const double g = got;
  if (std::isinf(want) && std::isinf(g) && (want < 0) == (g < 0)) return true;
  return std::fabs(g - want) <= atol + rtol * std::fabs(want);
}

}  // namespace dcp::bench
