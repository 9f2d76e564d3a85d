// The key property of DESIGN.md section 1: for seq_len <= K with the full causal top-k, the
// dense MHA route (K/V up-projected through Gemm, DenseMha causal) and the sparse MQA route
// (q absorbed through Gemm, SparseMqa over the latent rows, w_uv through Gemm) compute the same
// out and lse, and both match ReferenceAttention. Storage F32 or BF16 (inputs and the stored
// intermediates in that dtype; the reference sees the rounded inputs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "attention/cpu/attention_cpu.h"
#include "tests/attention/attention_test_util.h"
#include "tests/reference/mla_reference.h"

namespace dcp {
namespace {

using reference::MlaProblem;
using testing::FreshSeed;
using testing::Rng;
using testing::Stored;

struct Routed {
  std::vector<float> out, lse;  // [T, H, Dv], [T, H]
};

// The problem's tensors in storage dtype `dtype`; the problem's doubles are replaced by the
// stored (rounded) values so that the reference sees what the kernels see.
struct Inputs {
  Stored q_nope, q_rope, kv_c, k_pe, w_uk, w_uv;
};

Inputs StoreInputs(MlaProblem& pb, DType dtype) {
  auto store = [&](std::vector<double>& values) {
    Stored stored(dtype, values.size());
    for (size_t i = 0; i < values.size(); ++i) stored.Set(i, values[i]);
    values = stored.exact;
    return stored;
  };
  return {store(pb.q_nope), store(pb.q_rope), store(pb.kv_c),
          store(pb.k_pe),   store(pb.w_uk),   store(pb.w_uv)};
}

int TotalTokens(const MlaProblem& pb) {
  return std::accumulate(pb.query_lens.begin(), pb.query_lens.end(), 0);
}
int TotalRows(const MlaProblem& pb) {
  return std::accumulate(pb.seq_lens.begin(), pb.seq_lens.end(), 0);
}
float Scale(const MlaProblem& pb) {
  return static_cast<float>(1.0 / std::sqrt(double(pb.qk_nope_head_dim + pb.qk_rope_head_dim)));
}

// Copies a [rows, width] block of `source` (row stride source_stride) into `dest` (row stride
// dest_stride, column offset dest_col). Same dtype, so the copy is exact.
void CopyColumns(const Stored& source, int64_t rows, int width, int64_t source_stride, Stored& dest,
                 int64_t dest_stride, int64_t dest_col) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int c = 0; c < width; ++c) {
      dest.Set(r * dest_stride + dest_col + c, source.Get(r * source_stride + c));
    }
  }
}

Routed DenseRoute(const MlaProblem& pb, const Inputs& in, DType dtype) {
  const int h = pb.num_heads, r = pb.kv_lora_rank, dn = pb.qk_nope_head_dim;
  const int dr = pb.qk_rope_head_dim, dv = pb.v_head_dim, qk = dn + dr;
  const int t = TotalTokens(pb), n = TotalRows(pb);
  // k[n][h] = [w_uk[h] @ kv_c[n] | k_pe[n]]: per head, kv_c [N, R] @ w_uk[h]^T [R, Dn].
  Stored k(dtype, int64_t{n} * h * qk), v(dtype, int64_t{n} * h * dv);
  Stored q(dtype, int64_t{t} * h * qk);
  GemmParams up;
  up.a = in.kv_c.data(), up.b = in.w_uk.data(), up.c = k.data();
  up.a_dtype = up.b_dtype = up.c_dtype = dtype;
  up.trans_b = true;
  up.m = n, up.n = dn, up.k = r, up.batch = h;
  up.lda = r, up.ldb = r, up.ldc = int64_t{h} * qk;
  up.stride_a = 0, up.stride_b = int64_t{dn} * r, up.stride_c = qk;
  EXPECT_TRUE(cpu::Gemm(up).ok());
  for (int head = 0; head < h; ++head) {
    CopyColumns(in.k_pe, n, dr, dr, k, int64_t{h} * qk, int64_t{head} * qk + dn);
  }
  // v[n][h] = w_uv[h]^T @ kv_c[n]: kv_c [N, R] @ w_uv[h] [R, Dv].
  GemmParams vp = up;
  vp.b = in.w_uv.data(), vp.c = v.data();
  vp.trans_b = false;
  vp.n = dv, vp.ldb = dv, vp.ldc = int64_t{h} * dv;
  vp.stride_b = int64_t{r} * dv, vp.stride_c = dv;
  EXPECT_TRUE(cpu::Gemm(vp).ok());
  // q = [q_nope | q_rope] per (token, head).
  CopyColumns(in.q_nope, int64_t{t} * h, dn, dn, q, qk, 0);
  CopyColumns(in.q_rope, int64_t{t} * h, dr, dr, q, qk, dn);
  std::vector<int32_t> cu_q(pb.seq_lens.size() + 1, 0), cu_k(pb.seq_lens.size() + 1, 0);
  for (size_t b = 0; b < pb.seq_lens.size(); ++b) {
    cu_q[b + 1] = cu_q[b] + pb.query_lens[b];
    cu_k[b + 1] = cu_k[b] + pb.seq_lens[b];
  }
  Routed result;
  result.out.resize(int64_t{t} * h * dv);
  result.lse.resize(int64_t{t} * h);
  testing::Poison(result.out);
  testing::Poison(result.lse);
  DenseMhaParams p;
  p.q = q.data(), p.k = k.data(), p.v = v.data();
  p.out = result.out.data(), p.lse = result.lse.data();
  p.cu_seqlens_q = cu_q.data(), p.cu_seqlens_k = cu_k.data();
  p.dtype = dtype;
  p.num_seqs = static_cast<int>(pb.seq_lens.size()), p.num_heads = h, p.qk_dim = qk, p.v_dim = dv;
  p.q_token_stride = p.k_token_stride = int64_t{h} * qk;
  p.q_head_stride = p.k_head_stride = qk;
  p.v_token_stride = p.out_token_stride = int64_t{h} * dv;
  p.v_head_stride = p.out_head_stride = dv;
  p.lse_token_stride = h;
  p.causal = true;
  p.scale = Scale(pb);
  EXPECT_TRUE(cpu::DenseMha(p).ok());
  return result;
}

Routed SparseRoute(const MlaProblem& pb, const Inputs& in, DType dtype) {
  const int h = pb.num_heads, r = pb.kv_lora_rank, dn = pb.qk_nope_head_dim;
  const int dr = pb.qk_rope_head_dim, dv = pb.v_head_dim, width = r + dr;
  const int t = TotalTokens(pb), n = TotalRows(pb);
  // q' = [w_uk[h]^T @ q_nope | q_rope]: per head, q_nope [T, Dn] @ w_uk[h] [Dn, R].
  Stored q(dtype, int64_t{t} * h * width), cache(dtype, int64_t{n} * width);
  GemmParams absorb;
  absorb.a = in.q_nope.data(), absorb.b = in.w_uk.data(), absorb.c = q.data();
  absorb.a_dtype = absorb.b_dtype = absorb.c_dtype = dtype;
  absorb.m = t, absorb.n = r, absorb.k = dn, absorb.batch = h;
  absorb.lda = int64_t{h} * dn, absorb.ldb = r, absorb.ldc = int64_t{h} * width;
  absorb.stride_a = dn, absorb.stride_b = int64_t{dn} * r, absorb.stride_c = width;
  EXPECT_TRUE(cpu::Gemm(absorb).ok());
  CopyColumns(in.q_rope, int64_t{t} * h, dr, dr, q, width, r);
  CopyColumns(in.kv_c, n, r, r, cache, width, 0);
  CopyColumns(in.k_pe, n, dr, dr, cache, width, r);
  // Slots: the request's first row + the top-k position (-1 stays -1).
  std::vector<int32_t> slots(int64_t{t} * pb.topk_width, -1);
  int token = 0, first_row = 0;
  for (size_t b = 0; b < pb.seq_lens.size(); ++b) {
    for (int i = 0; i < pb.query_lens[b]; ++i, ++token) {
      for (int c = 0; c < pb.topk_width; ++c) {
        const int32_t position = pb.topk[int64_t{token} * pb.topk_width + c];
        if (position >= 0) slots[int64_t{token} * pb.topk_width + c] = first_row + position;
      }
    }
    first_row += pb.seq_lens[b];
  }
  std::vector<float> o_lat(int64_t{t} * h * r);
  Routed result;
  result.out.resize(int64_t{t} * h * dv);
  result.lse.resize(int64_t{t} * h);
  testing::Poison(o_lat);
  testing::Poison(result.out);
  testing::Poison(result.lse);
  SparseMqaParams p;
  p.q = q.data(), p.kv_cache = cache.data(), p.indices = slots.data();
  p.out = o_lat.data(), p.lse = result.lse.data();
  p.dtype = dtype;
  p.num_tokens = t, p.num_heads = h, p.head_dim = width, p.v_dim = r, p.topk = pb.topk_width;
  p.num_slots = n;
  p.q_token_stride = int64_t{h} * width, p.q_head_stride = width;
  p.kv_row_stride = width, p.indices_token_stride = pb.topk_width;
  p.out_token_stride = int64_t{h} * r, p.out_head_stride = r;
  p.lse_token_stride = h;
  p.scale = Scale(pb);
  EXPECT_TRUE(cpu::SparseMqa(p, /*validate=*/true).ok());
  // out = w_uv[h]^T @ o_lat: per head, o_lat [T, R] @ w_uv[h] [R, Dv].
  GemmParams up;
  up.a = o_lat.data(), up.b = in.w_uv.data(), up.c = result.out.data();
  up.a_dtype = DType::kF32, up.b_dtype = dtype, up.c_dtype = DType::kF32;
  up.m = t, up.n = dv, up.k = r, up.batch = h;
  up.lda = int64_t{h} * r, up.ldb = dv, up.ldc = int64_t{h} * dv;
  up.stride_a = r, up.stride_b = int64_t{r} * dv, up.stride_c = dv;
  EXPECT_TRUE(cpu::Gemm(up).ok());
  return result;
}

struct Dims {
  int heads, rank, nope, rope, v;
};

// Random requests with seq_len <= max_len: pure prefills, prefills with context and decodes.
MlaProblem RandomProblem(Rng& rng, const Dims& dims, int max_requests, int max_len) {
  MlaProblem pb;
  pb.num_heads = dims.heads, pb.kv_lora_rank = dims.rank, pb.qk_nope_head_dim = dims.nope;
  pb.qk_rope_head_dim = dims.rope, pb.v_head_dim = dims.v;
  const int requests = rng.Int(1, max_requests);
  for (int b = 0; b < requests; ++b) {
    const int seq_len = rng.Int(0, 3) == 0 ? 1 : rng.Int(1, max_len);
    const int kind = rng.Int(0, 2);
    pb.seq_lens.push_back(seq_len);
    pb.query_lens.push_back(kind == 0 ? seq_len : kind == 1 ? rng.Int(1, seq_len) : 1);
  }
  const int t = TotalTokens(pb), n = TotalRows(pb), h = dims.heads;
  auto normal = [&](size_t size, double stddev) {
    std::vector<double> values(size);
    for (double& x : values) x = stddev * rng.Normal();
    return values;
  };
  pb.q_nope = normal(size_t(t) * h * dims.nope, 1.0);
  pb.q_rope = normal(size_t(t) * h * dims.rope, 1.0);
  pb.kv_c = normal(size_t(n) * dims.rank, 1.0);
  pb.k_pe = normal(size_t(n) * dims.rope, 1.0);
  // Weights scaled so that k_nope and v have unit variance (logits of order 1).
  pb.w_uk = normal(size_t(h) * dims.nope * dims.rank, 1.0 / std::sqrt(dims.rank));
  pb.w_uv = normal(size_t(h) * dims.rank * dims.v, 1.0 / std::sqrt(dims.rank));
  return pb;
}

// topk = every causal position, shuffled, padded with -1 to a width K >= every seq_len.
void FullCausalTopk(MlaProblem& pb, Rng& rng, int width) {
  pb.topk_width = width;
  pb.topk.clear();
  for (size_t b = 0; b < pb.seq_lens.size(); ++b) {
    for (int i = 0; i < pb.query_lens[b]; ++i) {
      const int position = pb.seq_lens[b] - pb.query_lens[b] + i;
      std::vector<int32_t> row(width, -1);
      std::iota(row.begin(), row.begin() + position + 1, 0);
      std::shuffle(row.begin(), row.end(), rng.engine());
      pb.topk.insert(pb.topk.end(), row.begin(), row.end());
    }
  }
}

std::string Describe(const MlaProblem& pb, DType dtype) {
  std::string lens;
  for (size_t b = 0; b < pb.seq_lens.size(); ++b) {
    lens += absl::StrFormat(" %d/%d", pb.query_lens[b], pb.seq_lens[b]);
  }
  return absl::StrFormat("H=%d R=%d Dn=%d Dr=%d Dv=%d K=%d dtype=%s lens(q/seq):%s", pb.num_heads,
                         pb.kv_lora_rank, pb.qk_nope_head_dim, pb.qk_rope_head_dim, pb.v_head_dim,
                         pb.topk_width, dtype_name(dtype), lens);
}

void CheckRoutesAgree(MlaProblem pb, DType dtype) {
  SCOPED_TRACE(Describe(pb, dtype));
  const Inputs in = StoreInputs(pb, dtype);
  const reference::MlaResult want = reference::ReferenceAttention(pb);
  const Routed dense = DenseRoute(pb, in, dtype);
  const Routed sparse = SparseRoute(pb, in, dtype);
  // fp32 storage rounds nothing but arithmetic; bf16 storage also rounds the stored
  // intermediates (k, v of the dense route; q' of the sparse route).
  const double tol = dtype == DType::kF32 ? testing::kF32Tolerance : testing::kBf16Tolerance;
  EXPECT_TRUE(testing::AllClose("dense out", dense.out, want.out, tol));
  EXPECT_TRUE(testing::LseClose("dense lse", dense.lse, want.lse, tol));
  EXPECT_TRUE(testing::AllClose("sparse out", sparse.out, want.out, tol));
  EXPECT_TRUE(testing::LseClose("sparse lse", sparse.lse, want.lse, tol));
  std::vector<double> sparse_out(sparse.out.begin(), sparse.out.end());
  std::vector<double> sparse_lse(sparse.lse.begin(), sparse.lse.end());
  EXPECT_TRUE(testing::AllClose("dense vs sparse out", dense.out, sparse_out, 2 * tol));
  EXPECT_TRUE(testing::LseClose("dense vs sparse lse", dense.lse, sparse_lse, 2 * tol));
}

TEST(RoutesEquivalenceTest, DenseAndSparseAgreeOnFullCausalTopk) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  for (int iteration = 0; iteration < 20; ++iteration) {
    const Dims dims{rng.Int(1, 4), rng.Int(4, 48), rng.Int(1, 24), rng.Int(1, 12), rng.Int(1, 24)};
    MlaProblem pb = RandomProblem(rng, dims, 3, 80);
    const int max_len = *std::max_element(pb.seq_lens.begin(), pb.seq_lens.end());
    FullCausalTopk(pb, rng, max_len + rng.Int(0, 6));
    CheckRoutesAgree(pb, testing::RandomFloatDType(rng));
    if (::testing::Test::HasFailure()) return;
  }
}

// DeepSeek-V3.2's widths (R 512, Dn 128, Dr 64, Dv 128) with two heads.
TEST(RoutesEquivalenceTest, DeepSeekWidths) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    MlaProblem pb = RandomProblem(rng, Dims{2, 512, 128, 64, 128}, 2, 40);
    const int max_len = *std::max_element(pb.seq_lens.begin(), pb.seq_lens.end());
    FullCausalTopk(pb, rng, max_len);
    CheckRoutesAgree(pb, dtype);
  }
}

// Beyond the property: the sparse route with a true subset top-k (some tokens selecting
// nothing) against the reference.
TEST(RoutesEquivalenceTest, SparseRouteMatchesReferenceOnSubsetTopk) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  for (int iteration = 0; iteration < 15; ++iteration) {
    const Dims dims{rng.Int(1, 4), rng.Int(4, 40), rng.Int(1, 16), rng.Int(1, 8), rng.Int(1, 16)};
    MlaProblem pb = RandomProblem(rng, dims, 3, 90);
    const DType dtype = testing::RandomFloatDType(rng);
    pb.topk_width = rng.Int(1, 24);
    pb.topk.clear();
    for (size_t b = 0; b < pb.seq_lens.size(); ++b) {
      for (int i = 0; i < pb.query_lens[b]; ++i) {
        const int position = pb.seq_lens[b] - pb.query_lens[b] + i;
        std::vector<int32_t> all(position + 1);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng.engine());
        std::vector<int32_t> row(pb.topk_width, -1);
        const int count =
            rng.Int(0, 4) == 0 ? 0 : rng.Int(1, std::min(pb.topk_width, position + 1));
        std::copy(all.begin(), all.begin() + count, row.begin());
        std::shuffle(row.begin(), row.end(), rng.engine());
        pb.topk.insert(pb.topk.end(), row.begin(), row.end());
      }
    }
    SCOPED_TRACE(Describe(pb, dtype));
    const Inputs in = StoreInputs(pb, dtype);
    const reference::MlaResult want = reference::ReferenceAttention(pb);
    const Routed sparse = SparseRoute(pb, in, dtype);
    const double tol = dtype == DType::kF32 ? testing::kF32Tolerance : testing::kBf16Tolerance;
    EXPECT_TRUE(testing::AllClose("sparse out", sparse.out, want.out, tol));
    EXPECT_TRUE(testing::LseClose("sparse lse", sparse.lse, want.lse, tol));
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace dcp
