// The built-in checks behind #wrong: partial attention states that every rank can generate
// for any (rank, block, row), the LSE merge of DESIGN.md section 3 in double precision, and
// element counters. Shared by the kernels mode (merges timed alone) and the collectives mode
// (the ag_rs and a2a combines end to end).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "launch/bench/bench_data.h"

namespace dcp::bench {

// Partial output and LSE of rank `rank` for head block `block` (the rank the partial is
// destined to), row `row` (a (token, head) pair) and column `column` of `dim`. About one LSE
// in seven is -inf (the rank selected no key of that token), and every row that is a multiple
// of 13 is -inf on every rank (no rank did: out 0, lse -inf).
// PartialOutValues(...)(row * dim + column) is the output; one stream per (rank, block) keeps
// generating gigabytes cheap.
ValueStream PartialOutValues(uint64_t seed, int rank, int block);
float PartialLse(uint64_t seed, int rank, int block, int64_t row);

// The merge of partials (outs[i], lses[i]), i in [0, n): lse = log sum e^lse_i,
// out = sum e^(lse_i - lse) out_i; all -inf gives (0, -inf). Doubles.
void MergeReference(absl::Span<const double> lses, absl::Span<const double> outs, int dim,
                    double* lse, double* out);

// |got - want| <= atol + rtol * |want| (NaN is never close); -inf matches -inf.
bool Close(float got, double want, double rtol, double atol);

}  // namespace dcp::bench
