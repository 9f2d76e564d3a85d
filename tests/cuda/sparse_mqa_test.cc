// The CUDA sparse MQA kernel (attention/cuda/sparse_mqa.h) against float64 loops written here:
// bf16 inputs (read back exactly), fresh random data each run (seed printed), poisoned outputs,
// skipped and out-of-range indices, empty selections, huge logits, odd head counts and strides,
// and a chip-filling size checked on sampled rows and for run-to-run determinism.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "attention/cuda/sparse_mqa.h"
#include "gtest/gtest.h"
#include "tests/cuda/gpu_test_util.h"

namespace dcp::testing {
namespace {

constexpr int kHeadDim = 576;
constexpr int kVDim = 512;

struct MqaCase {
  int tokens = 1, heads = 16, topk = 64, slots = 256;
  double skip_fraction = 0.0;          // entries set to -1
  double out_of_range_fraction = 0.0;  // entries set to >= slots or < -1
  int64_t q_head_stride = kHeadDim;
  int64_t out_head_stride = kVDim;
  int64_t lse_extra = 0;      // lse_token_stride = heads + lse_extra
  int64_t indices_extra = 0;  // indices_token_stride = topk + indices_extra
  float q_low = -1.f, q_high = 1.f, kv_low = -1.f, kv_high = 1.f;
  float scale = 1.0f / std::sqrt(192.0f);
  int check_rows = -1;  // -1: every (token, head); else this many sampled rows
};

struct MqaData {
  std::vector<bf16> q, kv;
  std::vector<int32_t> indices;
  std::vector<float> out, lse;
  int64_t q_token_stride = 0, out_token_stride = 0, lse_token_stride = 0, indices_stride = 0;
};

MqaData MakeData(const MqaCase& c, std::mt19937_64& rng) {
  MqaData d;
  d.q_token_stride = c.q_head_stride * c.heads;
  d.out_token_stride = c.out_head_stride * c.heads;
  d.lse_token_stride = c.heads + c.lse_extra;
  d.indices_stride = c.topk + c.indices_extra;
  d.q = ToBf16(RandomFloats(rng, size_t(c.tokens) * d.q_token_stride, c.q_low, c.q_high));
  d.kv = ToBf16(RandomFloats(rng, size_t(c.slots) * kHeadDim, c.kv_low, c.kv_high));
  d.indices.assign(size_t(c.tokens) * d.indices_stride, -7);  // padding columns: never read
  std::vector<int32_t> pool(c.slots);
  std::iota(pool.begin(), pool.end(), 0);
  std::uniform_real_distribution<double> unit(0, 1);
  for (int t = 0; t < c.tokens; ++t) {
    // Distinct slots: a partial Fisher-Yates shuffle of the pool.
    for (int k = 0; k < c.topk; ++k) {
      int32_t value = -1;
      if (k < c.slots) {
        std::uniform_int_distribution<int> pick(k, c.slots - 1);
        std::swap(pool[k], pool[pick(rng)]);
        value = pool[k];
      }
      const double u = unit(rng);
      if (u < c.skip_fraction) {
        value = -1;
      } else if (u < c.skip_fraction + c.out_of_range_fraction) {
        value = (k % 2 == 0) ? c.slots + k : -2 - k;
      }
      d.indices[size_t(t) * d.indices_stride + k] = value;
    }
  }
  return d;
}

// float64 reference of one (token, head): out [kVDim], lse.
void ReferenceRow(const MqaCase& c, const MqaData& d, const std::vector<double>& q,
                  const std::vector<double>& kv, int t, int h, std::vector<double>* out,
                  double* lse) {
  const double* qrow = q.data() + size_t(t) * d.q_token_stride + size_t(h) * c.q_head_stride;
  std::vector<double> scores;
  std::vector<int> rows;
  for (int k = 0; k < c.topk; ++k) {
    const int32_t slot = d.indices[size_t(t) * d.indices_stride + k];
    if (slot < 0 || slot >= c.slots) continue;
    const double* krow = kv.data() + size_t(slot) * kHeadDim;
    double dot = 0;
    for (int i = 0; i < kHeadDim; ++i) dot += qrow[i] * krow[i];
    scores.push_back(double(c.scale) * dot);
    rows.push_back(slot);
  }
  out->assign(kVDim, 0.0);
  if (scores.empty()) {
    *lse = -std::numeric_limits<double>::infinity();
    return;
  }
  const double m = *std::max_element(scores.begin(), scores.end());
  double sum = 0;
  for (size_t j = 0; j < scores.size(); ++j) {
    const double w = std::exp(scores[j] - m);
    sum += w;
    const double* vrow = kv.data() + size_t(rows[j]) * kHeadDim;
    for (int i = 0; i < kVDim; ++i) (*out)[i] += w * vrow[i];
  }
  for (double& v : *out) v /= sum;
  *lse = m + std::log(sum);
}

SparseMqaParams Params(const MqaCase& c, const MqaData& d, const DeviceArray<bf16>& q,
                       const DeviceArray<bf16>& kv, const DeviceArray<int32_t>& indices,
                       DeviceArray<float>& out, DeviceArray<float>& lse) {
  SparseMqaParams p;
  p.q = q.get();
  p.kv_cache = kv.get();
  p.indices = indices.get();
  p.out = out.get();
  p.lse = lse.get();
  p.dtype = DType::kBF16;
  p.num_tokens = c.tokens;
  p.num_heads = c.heads;
  p.head_dim = kHeadDim;
  p.v_dim = kVDim;
  p.topk = c.topk;
  p.num_slots = c.slots;
  p.q_token_stride = d.q_token_stride;
  p.q_head_stride = c.q_head_stride;
  p.kv_row_stride = kHeadDim;
  p.indices_token_stride = d.indices_stride;
  p.out_token_stride = d.out_token_stride;
  p.out_head_stride = c.out_head_stride;
  p.lse_token_stride = d.lse_token_stride;
  p.scale = c.scale;
  return p;
}

class SparseMqaCudaTest : public GpuTest {
 protected:
  // Runs the kernel on fresh data and checks the requested rows against float64.
  void RunAndCheck(const MqaCase& c) {
    std::mt19937_64 rng(TestSeed());
    MqaData d = MakeData(c, rng);
    DeviceArray<bf16> q(d.q), kv(d.kv);
    DeviceArray<int32_t> indices(d.indices);
    DeviceArray<float> out(size_t(c.tokens) * d.out_token_stride);
    DeviceArray<float> lse(size_t(c.tokens) * d.lse_token_stride);
    out.Poison();
    lse.Poison();
    const SparseMqaParams p = Params(c, d, q, kv, indices, out, lse);
    ASSERT_TRUE(cuda::SparseMqa(p, nullptr).ok());
    DCP_ASSERT_CUDA(cudaDeviceSynchronize());
    const std::vector<float> got = out.Download();
    const std::vector<float> got_lse = lse.Download();

    // Every row written and finite (lse may be -inf only for empty rows, checked below).
    for (int t = 0; t < c.tokens; ++t) {
      for (int h = 0; h < c.heads; ++h) {
        const float* row = got.data() + size_t(t) * d.out_token_stride + size_t(h) * c.out_head_stride;
        for (int i = 0; i < kVDim; ++i) {
          ASSERT_TRUE(std::isfinite(row[i])) << "token " << t << " head " << h << " col " << i;
        }
        ASSERT_FALSE(std::isnan(got_lse[size_t(t) * d.lse_token_stride + h]));
      }
    }

    const std::vector<double> qd = ToDouble(d.q), kvd = ToDouble(d.kv);
    std::vector<std::pair<int, int>> rows;
    if (c.check_rows < 0) {
      for (int t = 0; t < c.tokens; ++t)
        for (int h = 0; h < c.heads; ++h) rows.emplace_back(t, h);
    } else {
      std::uniform_int_distribution<int> tok(0, c.tokens - 1), head(0, c.heads - 1);
      for (int i = 0; i < c.check_rows; ++i) rows.emplace_back(tok(rng), head(rng));
    }
    double diff = 0, norm = 0;
    std::vector<double> ref;
    for (auto [t, h] : rows) {
      double ref_lse = 0;
      ReferenceRow(c, d, qd, kvd, t, h, &ref, &ref_lse);
      const float* row = got.data() + size_t(t) * d.out_token_stride + size_t(h) * c.out_head_stride;
      const float row_lse = got_lse[size_t(t) * d.lse_token_stride + h];
      if (std::isinf(ref_lse)) {
        EXPECT_TRUE(std::isinf(row_lse) && row_lse < 0) << "token " << t << " head " << h;
        for (int i = 0; i < kVDim; ++i) ASSERT_EQ(row[i], 0.f) << "empty row " << t << "," << h;
        continue;
      }
      EXPECT_NEAR(row_lse, ref_lse, 2e-3 * std::max(1.0, std::abs(ref_lse)))
          << "token " << t << " head " << h;
      const Comparison cmp = Compare(row, ref.data(), kVDim);
      EXPECT_LT(cmp.relative_error, 2e-2) << "token " << t << " head " << h;
      for (int i = 0; i < kVDim; ++i) {
        diff += (row[i] - ref[i]) * (row[i] - ref[i]);
        norm += ref[i] * ref[i];
      }
    }
    if (norm > 0) {
      EXPECT_LT(std::sqrt(diff / norm), 1e-2) << "relative L2 error over all rows";
    }
  }
};

TEST_F(SparseMqaCudaTest, RaggedTopkWithSkippedAndOutOfRangeIndices) {
  MqaCase c;
  c.tokens = 7;
  c.heads = 16;
  c.topk = 200;  // not a multiple of the 64-key block
  c.slots = 3000;
  c.skip_fraction = 0.25;
  c.out_of_range_fraction = 0.05;
  c.indices_extra = 5;
  RunAndCheck(c);
}

TEST_F(SparseMqaCudaTest, DeepSeekShapeAllHeads) {
  MqaCase c;
  c.tokens = 3;
  c.heads = 128;
  c.topk = 2048;
  c.slots = 8192;
  c.skip_fraction = 0.1;
  RunAndCheck(c);
}

TEST_F(SparseMqaCudaTest, OddHeadCountAndPaddedStrides) {
  MqaCase c;
  c.tokens = 3;
  c.heads = 72;  // one full and one partial block of 64 heads
  c.topk = 130;
  c.slots = 500;
  c.q_head_stride = 640;
  c.out_head_stride = 520;
  c.lse_extra = 3;
  RunAndCheck(c);
}

TEST_F(SparseMqaCudaTest, OneHead) {
  MqaCase c;
  c.tokens = 5;
  c.heads = 1;
  c.topk = 70;
  c.slots = 100;
  c.skip_fraction = 0.5;
  RunAndCheck(c);
}

TEST_F(SparseMqaCudaTest, FewerSlotsThanTopk) {
  MqaCase c;  // only 40 distinct slots exist: the rest of each row is -1
  c.tokens = 2;
  c.heads = 8;
  c.topk = 128;
  c.slots = 40;
  RunAndCheck(c);
}

TEST_F(SparseMqaCudaTest, OneKeyEmptySelectionsAndZeroTopk) {
  std::mt19937_64 rng(TestSeed());
  MqaCase c;
  c.tokens = 4;
  c.heads = 8;
  c.topk = 64;
  c.slots = 300;
  MqaData d = MakeData(c, rng);
  for (int k = 0; k < c.topk; ++k) {
    d.indices[0 * d.indices_stride + k] = -1;                          // lone query, all -1
    if (k != 17) d.indices[1 * d.indices_stride + k] = -1;             // exactly one key
    d.indices[2 * d.indices_stride + k] = c.slots + k;                 // all out of range
  }
  DeviceArray<bf16> q(d.q), kv(d.kv);
  DeviceArray<int32_t> indices(d.indices);
  DeviceArray<float> out(size_t(c.tokens) * d.out_token_stride), lse(size_t(c.tokens) * c.heads);
  out.Poison();
  lse.Poison();
  ASSERT_TRUE(cuda::SparseMqa(Params(c, d, q, kv, indices, out, lse), nullptr).ok());
  const auto got = out.Download();
  const auto got_lse = lse.Download();
  const auto qd = ToDouble(d.q), kvd = ToDouble(d.kv);
  for (int h = 0; h < c.heads; ++h) {
    for (int t : {0, 2}) {
      EXPECT_TRUE(std::isinf(got_lse[t * c.heads + h]) && got_lse[t * c.heads + h] < 0);
      for (int i = 0; i < kVDim; ++i) ASSERT_EQ(got[(size_t(t) * c.heads + h) * kVDim + i], 0.f);
    }
    // One key: out is that key's value row exactly (p = 1), lse its score.
    const int32_t slot = d.indices[1 * d.indices_stride + 17];
    for (int i = 0; i < kVDim; ++i) {
      ASSERT_NEAR(got[(size_t(1) * c.heads + h) * kVDim + i], kvd[size_t(slot) * kHeadDim + i],
                  1e-6);
    }
    std::vector<double> ref;
    double ref_lse = 0;
    ReferenceRow(c, d, qd, kvd, 1, h, &ref, &ref_lse);
    EXPECT_NEAR(got_lse[1 * c.heads + h], ref_lse, 1e-3 * std::max(1.0, std::abs(ref_lse)));
    ReferenceRow(c, d, qd, kvd, 3, h, &ref, &ref_lse);
    EXPECT_LT(Compare(&got[(size_t(3) * c.heads + h) * kVDim], ref.data(), kVDim).relative_error,
              2e-2);
  }

  // topk == 0: every row empty.
  SparseMqaParams p = Params(c, d, q, kv, indices, out, lse);
  p.topk = 0;
  out.Poison();
  lse.Poison();
  ASSERT_TRUE(cuda::SparseMqa(p, nullptr).ok());
  for (float v : out.Download()) ASSERT_EQ(v, 0.f);
  for (float v : lse.Download()) ASSERT_TRUE(std::isinf(v) && v < 0);
}

TEST_F(SparseMqaCudaTest, HugePositiveLogits) {
  MqaCase c;  // logits with a spread of about +-50..80: softmax is nearly one-hot
  c.tokens = 4;
  c.heads = 16;
  c.topk = 256;
  c.slots = 1024;
  c.q_low = -4.f;
  c.q_high = 4.f;
  c.scale = 0.5f;
  RunAndCheck(c);
}

TEST_F(SparseMqaCudaTest, HugeNegativeLogits) {
  MqaCase c;  // every logit near -80: exp underflows without the running max
  c.tokens = 3;
  c.heads = 16;
  c.topk = 192;
  c.slots = 600;
  c.q_low = -1.f;
  c.q_high = -0.5f;
  c.kv_low = 0.5f;
  c.kv_high = 1.f;
  c.scale = 0.25f;
  RunAndCheck(c);
}

TEST_F(SparseMqaCudaTest, FillsTheChipAndIsDeterministic) {
  MqaCase c;  // 264 tokens x 2 head blocks = 528 CTAs, 4 waves on 132 SMs
  c.tokens = 264;
  c.heads = 128;
  c.topk = 2048;
  c.slots = 100000;
  c.skip_fraction = 0.05;
  c.check_rows = 160;
  RunAndCheck(c);

  // The same inputs twice give bit-identical outputs (a moving result would be a race).
  std::mt19937_64 rng(TestSeed());
  MqaData d = MakeData(c, rng);
  DeviceArray<bf16> q(d.q), kv(d.kv);
  DeviceArray<int32_t> indices(d.indices);
  DeviceArray<float> out(size_t(c.tokens) * d.out_token_stride), lse(size_t(c.tokens) * c.heads);
  const SparseMqaParams p = Params(c, d, q, kv, indices, out, lse);
  ASSERT_TRUE(cuda::SparseMqa(p, nullptr).ok());
  const auto first = out.Download();
  out.Poison();
  ASSERT_TRUE(cuda::SparseMqa(p, nullptr).ok());
  const auto second = out.Download();
  ASSERT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * sizeof(float)));
}

TEST_F(SparseMqaCudaTest, RejectsUncompiledSizesAndDtypes) {
  SparseMqaParams p;
  p.num_tokens = 1;
  p.num_heads = 1;
  p.head_dim = 512;
  p.v_dim = 512;
  p.dtype = DType::kBF16;
  absl::Status status = cuda::SparseMqa(p, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("576"), std::string::npos) << status;
  p.head_dim = 576;
  p.dtype = DType::kF32;
  status = cuda::SparseMqa(p, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("BF16"), std::string::npos) << status;
}

}  // namespace
}  // namespace dcp::testing
