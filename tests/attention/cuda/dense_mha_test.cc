// The CUDA dense MHA kernel (attention/cuda/dense_mha.h) against float64 loops written here:
// causal varlen with bottom-right alignment (ragged lengths, decode rows, more queries than
// keys, empty sequences), the non-causal context-chunk mode, K and V interleaved in one buffer
// (strides), huge logits, a chip-filling size checked on sampled rows and for determinism, and
// the errors for uncompiled sizes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "attention/cuda/dense_mha.h"
#include "gtest/gtest.h"
#include "tests/common/gpu_test_util.h"

namespace dcp::testing {
namespace {

constexpr int kQk = 192;
constexpr int kV = 128;
constexpr int kKvWidth = kQk + kV;  // k and v of a head side by side: [k (192) | v (128)]

struct MhaCase {
  std::vector<std::pair<int, int>> seqs;  // (len_q, len_k) per sequence
  int heads = 4;
  bool causal = true;
  float q_scale = 1.f;
  float scale = 1.0f / std::sqrt(float(kQk));
  int check_rows = -1;  // -1: all (query, head) rows; else this many sampled
  bool with_lse = true;
};

class DenseMhaCudaTest : public GpuTest {
 protected:
  void RunAndCheck(const MhaCase& c) {
    std::mt19937_64 rng(TestSeed());
    const int num_seqs = int(c.seqs.size());
    std::vector<int32_t> cu_q{0}, cu_k{0};
    int max_q = 0;
    for (auto [lq, lk] : c.seqs) {
      cu_q.push_back(cu_q.back() + lq);
      cu_k.push_back(cu_k.back() + lk);
      max_q = std::max(max_q, lq);
    }
    const int total_q = cu_q.back(), total_k = cu_k.back(), heads = c.heads;
    const std::vector<bf16> q =
        ToBf16(RandomFloats(rng, size_t(total_q) * heads * kQk, -c.q_scale, c.q_scale));
    const std::vector<bf16> kv = ToBf16(RandomFloats(rng, size_t(total_k) * heads * kKvWidth));
    DeviceArray<bf16> q_dev(q), kv_dev(kv);
    DeviceArray<int32_t> cu_q_dev(cu_q), cu_k_dev(cu_k);
    DeviceArray<float> out(size_t(std::max(total_q, 1)) * heads * kV);
    DeviceArray<float> lse(size_t(std::max(total_q, 1)) * heads);
    out.Poison();
    lse.Poison();

    DenseMhaParams p;
    p.q = q_dev.get();
    p.k = kv_dev.get();
    p.v = kv_dev.get() + kQk;
    p.out = out.get();
    p.lse = c.with_lse ? lse.get() : nullptr;
    p.cu_seqlens_q = cu_q_dev.get();
    p.cu_seqlens_k = cu_k_dev.get();
    p.dtype = DType::kBF16;
    p.num_seqs = num_seqs;
    p.num_heads = heads;
    p.qk_dim = kQk;
    p.v_dim = kV;
    p.max_seqlen_q = max_q;
    p.max_seqlen_k = 0;
    p.q_token_stride = int64_t(heads) * kQk;
    p.q_head_stride = kQk;
    p.k_token_stride = p.v_token_stride = int64_t(heads) * kKvWidth;
    p.k_head_stride = p.v_head_stride = kKvWidth;
    p.out_token_stride = int64_t(heads) * kV;
    p.out_head_stride = kV;
    p.lse_token_stride = heads;
    p.causal = c.causal;
    p.scale = c.scale;
    const absl::Status status = cuda::DenseMha(p, nullptr);
    ASSERT_TRUE(status.ok()) << status;
    DCP_ASSERT_CUDA(cudaDeviceSynchronize());
    const auto got = out.Download();
    const auto got_lse = lse.Download();
    if (total_q == 0) return;
    for (size_t i = 0; i < size_t(total_q) * heads * kV; ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << "out[" << i << "] = " << got[i];
    }

    // Rows to check: (sequence, query index in it, head).
    struct Row {
      int seq, query, head;
    };
    std::vector<Row> rows;
    for (int s = 0; s < num_seqs; ++s)
      for (int i = 0; i < c.seqs[s].first; ++i)
        for (int h = 0; h < heads; ++h) rows.push_back({s, i, h});
    if (c.check_rows >= 0 && size_t(c.check_rows) < rows.size()) {
      std::shuffle(rows.begin(), rows.end(), rng);
      rows.resize(c.check_rows);
    }
    const std::vector<double> qd = ToDouble(q), kvd = ToDouble(kv);
    double diff = 0, norm = 0;
    std::vector<double> ref(kV), scores;
    for (const Row& r : rows) {
      const auto [lq, lk] = c.seqs[r.seq];
      const int limit = c.causal ? std::min(lk, lk - lq + r.query + 1) : lk;
      const int64_t token = cu_q[r.seq] + r.query;
      const double* qrow = qd.data() + (size_t(token) * heads + r.head) * kQk;
      scores.clear();
      for (int j = 0; j < std::max(limit, 0); ++j) {
        const double* krow = kvd.data() + (size_t(cu_k[r.seq] + j) * heads + r.head) * kKvWidth;
        double dot = 0;
        for (int i = 0; i < kQk; ++i) dot += qrow[i] * krow[i];
        scores.push_back(c.scale * dot);
      }
      const float* row = got.data() + (size_t(token) * heads + r.head) * kV;
      const float row_lse = got_lse[size_t(token) * heads + r.head];
      if (scores.empty()) {
        for (int i = 0; i < kV; ++i) ASSERT_EQ(row[i], 0.f) << "query with no key";
        if (c.with_lse) {
          EXPECT_TRUE(std::isinf(row_lse) && row_lse < 0);
        }
        continue;
      }
      const double m = *std::max_element(scores.begin(), scores.end());
      double sum = 0;
      std::fill(ref.begin(), ref.end(), 0.0);
      for (size_t j = 0; j < scores.size(); ++j) {
        const double w = std::exp(scores[j] - m);
        sum += w;
        const double* vrow =
            kvd.data() + (size_t(cu_k[r.seq] + j) * heads + r.head) * kKvWidth + kQk;
        for (int i = 0; i < kV; ++i) ref[i] += w * vrow[i];
      }
      for (double& v : ref) v /= sum;
      if (c.with_lse) {
        const double want = m + std::log(sum);
        EXPECT_NEAR(row_lse, want, 2e-3 * std::max(1.0, std::abs(want)))
            << "seq " << r.seq << " query " << r.query << " head " << r.head;
      }
      EXPECT_LT(Compare(row, ref.data(), kV).relative_error, 2e-2)
          << "seq " << r.seq << " query " << r.query << " head " << r.head;
      for (int i = 0; i < kV; ++i) {
        diff += (row[i] - ref[i]) * (row[i] - ref[i]);
        norm += ref[i] * ref[i];
      }
    }
    if (norm > 0) {
      EXPECT_LT(std::sqrt(diff / norm), 1e-2);
    }
  }
};

TEST_F(DenseMhaCudaTest, CausalRaggedBatch) {
  MhaCase c;
  // seq_len 1, a block edge, multi-block, decode over context, bottom-right chunk with
  // context, an empty query set.
  c.seqs = {{1, 1}, {5, 5}, {64, 64}, {70, 70}, {1, 300}, {130, 200}, {0, 10}, {129, 129}};
  c.heads = 3;
  RunAndCheck(c);
}

TEST_F(DenseMhaCudaTest, CausalMoreQueriesThanKeys) {
  MhaCase c;  // the first Lq - Lk queries see no key: out 0, lse -inf
  c.seqs = {{10, 4}, {70, 3}, {5, 0}};
  c.heads = 2;
  RunAndCheck(c);
}

TEST_F(DenseMhaCudaTest, NonCausalContextChunks) {
  MhaCase c;
  c.causal = false;
  c.seqs = {{37, 250}, {100, 1}, {1, 64}, {65, 129}, {3, 0}};
  c.heads = 4;
  RunAndCheck(c);
}

TEST_F(DenseMhaCudaTest, HugeLogitsWithoutLse) {
  MhaCase c;
  c.seqs = {{90, 90}, {17, 150}};
  c.heads = 2;
  c.q_scale = 8.f;  // logits spread about +-80
  c.scale = 0.5f;
  c.with_lse = false;
  RunAndCheck(c);
}

TEST_F(DenseMhaCudaTest, FillsTheChip) {
  MhaCase c;  // 8 x 1024 causal, 32 heads: 16 x 32 x 8 = 4096 CTAs
  c.seqs.assign(8, {1024, 1024});
  c.heads = 32;
  c.check_rows = 300;
  RunAndCheck(c);
}

// More sequences than a grid's z dimension holds (65535): the launcher splits them over several
// launches; every row is checked, those past the split included. Before, this was an error.
TEST_F(DenseMhaCudaTest, MoreSequencesThanOneLaunchHolds) {
  MhaCase c;
  c.seqs.reserve(70001);
  for (int s = 0; s < 70001; ++s) {
    const int lq = 1 + s % 3;
    c.seqs.push_back({lq, lq + (s % 5 == 0 ? 2 : 0)});
  }
  c.heads = 1;
  RunAndCheck(c);
}

TEST_F(DenseMhaCudaTest, RejectsUncompiledSizesAndDtypes) {
  DenseMhaParams p;
  p.num_seqs = 1;
  p.num_heads = 1;
  p.max_seqlen_q = 1;
  p.qk_dim = 128;
  p.v_dim = 128;
  p.dtype = DType::kBF16;
  absl::Status status = cuda::DenseMha(p, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("192"), std::string::npos) << status;
  p.qk_dim = 192;
  p.dtype = DType::kF32;
  status = cuda::DenseMha(p, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("BF16"), std::string::npos) << status;
}

}  // namespace
}  // namespace dcp::testing
