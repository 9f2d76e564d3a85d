// cpu::DenseMha against ReferenceSoftmaxAttention, one (sequence, head, query) at a time over
// the keys the mask lets it see: ragged causal batches, context chunks (non-causal), DeepSeek's
// 192/128 widths, bf16 storage, padded strides, huge logits, more queries than keys.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "attention/cpu/attention_cpu.h"
#include "tests/attention/attention_test_util.h"
#include "tests/reference/mla_reference.h"

namespace dcp {
namespace {

using testing::FreshSeed;
using testing::Rng;
using testing::Stored;

struct DenseCase {
  std::vector<int> query_lens, key_lens;
  int heads = 1, qk_dim = 8, v_dim = 8;
  DType dtype = DType::kF32;
  bool causal = true;
  bool with_lse = true;
  int pad = 0;              // extra elements per token row (strided layout)
  double stddev = 1.0;      // of q and k
  bool integer_qk = false;  // q, k in [-4, 4] integers: exact fp32 logits for huge-logit tests
  float scale = 0.0f;       // 0 = 1/sqrt(qk_dim)
};

std::string Describe(const DenseCase& c) {
  std::string lens;
  for (size_t s = 0; s < c.query_lens.size(); ++s) {
    lens += absl::StrFormat(" %d/%d", c.query_lens[s], c.key_lens[s]);
  }
  return absl::StrFormat("heads=%d qk=%d v=%d dtype=%s causal=%d pad=%d lens(q/k):%s", c.heads,
                         c.qk_dim, c.v_dim, dtype_name(c.dtype), c.causal, c.pad, lens);
}

// Runs the kernel on random data, checks out and lse against the reference. q, k and v are
// given when a test needs chosen values (set through `fill`).
void CheckDense(const DenseCase& c, Rng& rng, double tol = testing::kF32Tolerance) {
  const int num_seqs = static_cast<int>(c.query_lens.size());
  std::vector<int32_t> cu_q(num_seqs + 1, 0), cu_k(num_seqs + 1, 0);
  for (int s = 0; s < num_seqs; ++s) {
    cu_q[s + 1] = cu_q[s] + c.query_lens[s];
    cu_k[s + 1] = cu_k[s] + c.key_lens[s];
  }
  const int tq = cu_q[num_seqs], tk = cu_k[num_seqs], h = c.heads;
  const int64_t q_token = int64_t{h} * c.qk_dim + c.pad, v_token = int64_t{h} * c.v_dim + c.pad;
  Stored q = testing::RandomStored(rng, c.dtype, tq * q_token, c.stddev);
  Stored k = testing::RandomStored(rng, c.dtype, tk * q_token, c.stddev);
  Stored v = testing::RandomStored(rng, c.dtype, tk * v_token);
  if (c.integer_qk) {
    for (size_t i = 0; i < q.size(); ++i) q.Set(i, rng.Int(-4, 4));
    for (size_t i = 0; i < k.size(); ++i) k.Set(i, rng.Int(-4, 4));
  }
  const int64_t out_token = int64_t{h} * c.v_dim + c.pad, lse_token = h + c.pad;
  std::vector<float> out(tq * out_token), lse(tq * lse_token);
  testing::Poison(out);
  testing::Poison(lse);

  DenseMhaParams p;
  p.q = q.data(), p.k = k.data(), p.v = v.data();
  p.out = out.data(), p.lse = c.with_lse ? lse.data() : nullptr;
  p.cu_seqlens_q = cu_q.data(), p.cu_seqlens_k = cu_k.data();
  p.dtype = c.dtype;
  p.num_seqs = num_seqs, p.num_heads = h, p.qk_dim = c.qk_dim, p.v_dim = c.v_dim;
  for (int s = 0; s < num_seqs; ++s) {
    p.max_seqlen_q = std::max(p.max_seqlen_q, c.query_lens[s]);
    p.max_seqlen_k = std::max(p.max_seqlen_k, c.key_lens[s]);
  }
  p.q_token_stride = p.k_token_stride = q_token;
  p.q_head_stride = p.k_head_stride = c.qk_dim;
  p.v_token_stride = v_token, p.v_head_stride = c.v_dim;
  p.out_token_stride = out_token, p.out_head_stride = c.v_dim;
  p.lse_token_stride = lse_token;
  p.causal = c.causal;
  p.scale = c.scale != 0.0f ? c.scale : 1.0f / std::sqrt(static_cast<float>(c.qk_dim));
  ASSERT_TRUE(cpu::DenseMha(p).ok());

  // The same call with a bf16 out: every value the fp32 one rounded once, padding untouched.
  std::vector<bf16> out_bf16(out.size(), bf16{0x7fc0});  // bf16 NaN
  std::vector<float> lse_again(lse.size());
  testing::Poison(lse_again);
  DenseMhaParams pb = p;
  pb.out = out_bf16.data();
  pb.out_dtype = DType::kBF16;
  if (c.with_lse) pb.lse = lse_again.data();
  ASSERT_TRUE(cpu::DenseMha(pb).ok());
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::isnan(out[i])) {
      ASSERT_EQ(out_bf16[i].bits, 0x7fc0) << "padding " << i << " written in the bf16 out";
    } else {
      ASSERT_EQ(out_bf16[i].bits, float_to_bf16(out[i]).bits) << "out " << i;
    }
  }

  std::vector<double> want_out, want_lse;
  std::vector<float> got_out, got_lse;
  std::vector<double> keys, values, query(c.qk_dim), o(c.v_dim);
  for (int s = 0; s < num_seqs; ++s) {
    const int lq = c.query_lens[s], lk = c.key_lens[s];
    for (int i = 0; i < lq; ++i) {
      const int t = cu_q[s] + i;
      // Bottom-right aligned causal: query i sees keys [0, lk - lq + i].
      const int n = c.causal ? std::clamp(lk - lq + i + 1, 0, lk) : lk;
      for (int head = 0; head < h; ++head) {
        for (int d = 0; d < c.qk_dim; ++d) query[d] = q.exact[t * q_token + head * c.qk_dim + d];
        keys.assign(static_cast<size_t>(n) * c.qk_dim, 0.0);
        values.assign(static_cast<size_t>(n) * c.v_dim, 0.0);
        for (int j = 0; j < n; ++j) {
          const int64_t row = cu_k[s] + j;
          for (int d = 0; d < c.qk_dim; ++d) {
            keys[j * c.qk_dim + d] = k.exact[row * q_token + head * c.qk_dim + d];
          }
          for (int e = 0; e < c.v_dim; ++e) {
            values[j * c.v_dim + e] = v.exact[row * v_token + head * c.v_dim + e];
          }
        }
        double l;
        reference::ReferenceSoftmaxAttention(query.data(), keys.data(), values.data(), n, c.qk_dim,
                                             c.v_dim, p.scale, o.data(), &l);
        for (int e = 0; e < c.v_dim; ++e) {
          want_out.push_back(o[e]);
          got_out.push_back(out[t * out_token + head * c.v_dim + e]);
        }
        want_lse.push_back(l);
        got_lse.push_back(lse[t * lse_token + head]);
      }
    }
  }
  EXPECT_TRUE(testing::AllClose("out", got_out, want_out, tol));
  if (c.with_lse) EXPECT_TRUE(testing::LseClose("lse", got_lse, want_lse, tol));
  // Padding of out/lse is never written.
  for (int t = 0; t < tq; ++t) {
    for (int e = h * c.v_dim; e < out_token; ++e) ASSERT_TRUE(std::isnan(out[t * out_token + e]));
    for (int e = 0; e < lse_token; ++e) {
      if (e >= h || !c.with_lse) ASSERT_TRUE(std::isnan(lse[t * lse_token + e]));
    }
  }
}

// Lengths that hit the 48-query and 64-key blocks exactly, around them, and seq_len 1.
int RandomLength(Rng& rng, int max) {
  static const int kEdges[] = {1, 2, 16, 47, 48, 49, 63, 64, 65, 128};
  if (rng.Bool()) {
    const int edge = kEdges[rng.Int(0, 9)];
    if (edge <= max) return edge;
  }
  return rng.Int(1, max);
}

TEST(DenseMhaCpuTest, RandomCausalRaggedBatches) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  for (int iteration = 0; iteration < 30; ++iteration) {
    DenseCase c;
    const int num_seqs = rng.Int(1, 4);
    for (int s = 0; s < num_seqs; ++s) {
      const int lk = RandomLength(rng, 130);
      // A prefill with context (lq < lk), a pure prefill (lq == lk) or a decode (lq == 1).
      const int kind = rng.Int(0, 2);
      c.key_lens.push_back(lk);
      c.query_lens.push_back(kind == 0 ? rng.Int(1, lk) : kind == 1 ? lk : 1);
    }
    c.heads = rng.Int(1, 4), c.qk_dim = rng.Int(1, 40), c.v_dim = rng.Int(1, 40);
    c.dtype = testing::RandomFloatDType(rng);
    c.pad = rng.Int(0, 2);
    SCOPED_TRACE(Describe(c));
    CheckDense(c, rng);
    if (::testing::Test::HasFailure()) return;
  }
}

// A context chunk: every query of the request sees every key of the chunk (empty chunks too).
TEST(DenseMhaCpuTest, RandomNonCausalContextChunks) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  for (int iteration = 0; iteration < 20; ++iteration) {
    DenseCase c;
    c.causal = false;
    const int num_seqs = rng.Int(1, 4);
    for (int s = 0; s < num_seqs; ++s) {
      c.query_lens.push_back(RandomLength(rng, 70));
      c.key_lens.push_back(rng.Int(0, 5) == 0 ? 0 : RandomLength(rng, 140));
    }
    c.heads = rng.Int(1, 3), c.qk_dim = rng.Int(1, 48), c.v_dim = rng.Int(1, 48);
    c.dtype = testing::RandomFloatDType(rng);
    c.with_lse = rng.Int(0, 3) != 0;
    SCOPED_TRACE(Describe(c));
    CheckDense(c, rng);
    if (::testing::Test::HasFailure()) return;
  }
}

// DeepSeek-V3.2 widths: qk = Dn + Dr = 192, v = 128, enough work to use both cores.
TEST(DenseMhaCpuTest, DeepSeekWidths) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    DenseCase c;
    c.heads = 4, c.qk_dim = 192, c.v_dim = 128, c.dtype = dtype;
    c.query_lens = {rng.Int(60, 150), 1, rng.Int(2, 20)};
    c.key_lens = {c.query_lens[0] + rng.Int(0, 40), rng.Int(1, 200), c.query_lens[2]};
    c.scale = static_cast<float>(1.0 / std::sqrt(192.0));
    SCOPED_TRACE(Describe(c));
    CheckDense(c, rng);
  }
}

// Causal with more queries than keys: the first lq - lk queries see nothing (out 0, lse -inf).
TEST(DenseMhaCpuTest, CausalQueriesWithoutKeys) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  DenseCase c;
  c.query_lens = {rng.Int(5, 60), 3};
  c.key_lens = {rng.Int(0, 4), 0};
  c.heads = 2, c.qk_dim = 12, c.v_dim = 10;
  SCOPED_TRACE(Describe(c));
  CheckDense(c, rng);
}

// One query, one key: out = v, lse = scale q.k.
TEST(DenseMhaCpuTest, OneKey) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  DenseCase c;
  c.query_lens = {1}, c.key_lens = {1};
  c.heads = 3, c.qk_dim = 17, c.v_dim = 9;
  CheckDense(c, rng);
}

// Logits around +-80: exp overflows fp32 near 88, so only max-subtraction gets these right.
TEST(DenseMhaCpuTest, HugeLogits) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::SeedTrace(seed));
  Rng rng(seed);
  DenseCase c;
  c.query_lens = {40}, c.key_lens = {90};
  c.heads = 2, c.qk_dim = 16, c.v_dim = 8;
  // Integer q, k in [-4, 4] and a power-of-two scale make every logit exact in fp32 (so the
  // check measures the softmax, not the dot product's rounding); q.k has sd ~27, times 2 gives
  // logits of +-54 sd: many beyond +-80, where e^x overflows fp32 (88).
  c.integer_qk = true;
  c.scale = 2.0f;
  SCOPED_TRACE(Describe(c));
  CheckDense(c, rng);
}

TEST(DenseMhaCpuTest, RejectsBadParams) {
  std::vector<float> q(16, 0.0f), out(16), lse(4);
  const int32_t cu[2] = {0, 2};
  DenseMhaParams good;
  good.q = good.k = good.v = q.data();
  good.out = out.data(), good.lse = lse.data();
  good.cu_seqlens_q = good.cu_seqlens_k = cu;
  good.num_seqs = 1, good.num_heads = 2, good.qk_dim = 4, good.v_dim = 4;
  good.q_token_stride = good.k_token_stride = good.v_token_stride = good.out_token_stride = 8;
  good.q_head_stride = good.k_head_stride = good.v_head_stride = good.out_head_stride = 4;
  good.lse_token_stride = 2;
  ASSERT_TRUE(cpu::DenseMha(good).ok());
  auto expect_error = [&](const DenseMhaParams& p, const std::string& needle) {
    const absl::Status status = cpu::DenseMha(p);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(std::string(status.message()).find(needle), std::string::npos) << status.message();
  };
  DenseMhaParams p = good;
  p.q = nullptr;
  expect_error(p, "q is null");
  p = good, p.k = nullptr;
  expect_error(p, "k is null");
  p = good, p.out = nullptr;
  expect_error(p, "out is null");
  p = good, p.cu_seqlens_k = nullptr;
  expect_error(p, "cu_seqlens_k");
  p = good, p.num_heads = 0;
  expect_error(p, "num_heads");
  p = good, p.qk_dim = -3;
  expect_error(p, "qk_dim");
  p = good, p.dtype = DType::kI32;
  expect_error(p, "dtype");
  p = good, p.max_seqlen_q = 1;
  expect_error(p, "max_seqlen_q");
  const int32_t decreasing[2] = {2, 1};
  p = good, p.cu_seqlens_q = decreasing;
  expect_error(p, "cu_seqlens_q decreases");
  p = good, p.out_token_stride = 0;
  expect_error(p, "out_token_stride");
  p = good, p.out_dtype = DType::kI32;
  expect_error(p, "out dtype");
}

}  // namespace
}  // namespace dcp
