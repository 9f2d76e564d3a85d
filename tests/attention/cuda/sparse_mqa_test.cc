// The CUDA sparse MQA kernels (attention/cuda/sparse_mqa.h) against float64 loops written here:
// bf16 inputs (read back exactly), fresh random data each run (seed printed), poisoned outputs,
// skipped and out-of-range indices, empty selections, huge logits, odd head counts and strides,
// and a chip-filling size checked on sampled rows and for run-to-run determinism. Every case
// runs each variant of Variants(): both kernels (the sm_90a wgmma kernel where the device has
// it, and the mma.sync kernel), with the heuristic's split count and forced splits; compacted
// rows with per-token valid counts (0, 1, 63, 64, 65, 2047, 2048 mixed); the two kernels are
// also compared with each other, and every wgmma run's split merge (inside a thread-block
// cluster where it fits) bit for bit with the MergeSplits kernel's.
#include "attention/cuda/sparse_mqa.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention/cuda/topk_to_slots.h"
#include "core/environment.h"
#include "gtest/gtest.h"
#include "tests/common/gpu_test_util.h"

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
  // Compacted rows: token t's keys are its first counts[t % counts.size()] columns (clamped to
  // the distinct slots there are), given through valid_counts; the columns after the count
  // hold other valid slots, which the kernel must not read.
  std::vector<int> counts;
  std::vector<int> splits = {0, 3};  // split counts to run (0: the heuristic's)
  int expected_keys = 0;              // SparseMqaParams::expected_keys (the heuristic's hint)
  // The wgmma kernel's heads per CTA to run (SparseMqaParams::block_heads; 0: the heuristic's),
  // each with every split count; the mma.sync kernel runs 0 only.
  std::vector<int> block_heads = {0};
  // The wgmma kernel's grid caps to run (SparseMqaParams::sm90_ctas; 0: the default), each
  // with every block_heads and split count.
  std::vector<int> ctas = {0};
  // The wgmma kernel's split merges to run (SparseMqaParams::split_merge; 0: chosen, 2: inside
  // the cluster, required), each with every other setting.
  std::vector<int> merges = {0};
  // The wgmma kernel's consumer schedules to run (SparseMqaParams::sm90_schedule: 1 pairs,
  // 2 roles), each with every other setting but the cluster merge (split_merge 2 runs pairs).
  std::vector<int> schedules = {1, 2};
  // Non-zero: logits that climb block by block. Every query's rope part (columns 512-575) is 1
  // and the rope part of the row at position k of a token's list is rope_ramp * (k / 64), so a
  // 64-key block scores about 6.66 * rope_ramp (log2 units) above the one before it (with
  // scale 1 / sqrt(192)): the wgmma kernel's running max is then kept stale for some pairs and
  // moved on others (SparseMqaSplit::rescale_slack). One token, or the rows of tokens that
  // share a slot take the last token's ramp.
  float rope_ramp = 0.f;
  // Non-empty: added to that rope value, block_rope[(k / 64) % size] for the row at position k
  // (6.66 log2 units of score per unit, as above): jumps between the two blocks of a pair, which
  // the wgmma kernel's two consumer warpgroups score one each.
  std::vector<float> block_rope;
};

// One way of running the kernel on a case.
struct Variant {
  int kernel = 0;       // SparseMqaParams::kernel
  int splits = 0;       // SparseMqaParams::num_splits
  int block_heads = 0;  // SparseMqaParams::block_heads
  int ctas = 0;         // SparseMqaParams::sm90_ctas
  int merge = 0;        // SparseMqaParams::split_merge
  int schedule = 0;     // SparseMqaParams::sm90_schedule
};

struct MqaData {
  std::vector<bf16> q, kv;
  std::vector<int32_t> indices;
  std::vector<int32_t> counts;  // valid_counts when the case is compacted; else empty
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
  if (c.rope_ramp != 0.f || !c.block_rope.empty()) {
    for (int t = 0; t < c.tokens; ++t) {
      for (int h = 0; h < c.heads; ++h) {
        bf16* q_rope = d.q.data() + size_t(t) * d.q_token_stride + size_t(h) * c.q_head_stride;
        for (int i = kVDim; i < kHeadDim; ++i) q_rope[i] = float_to_bf16(1.f);
      }
      for (int k = 0; k < c.topk; ++k) {
        const int32_t slot = d.indices[size_t(t) * d.indices_stride + k];
        if (slot < 0 || slot >= c.slots) continue;
        const float jump = c.block_rope.empty() ? 0.f : c.block_rope[(k / 64) % c.block_rope.size()];
        const bf16 ramp = float_to_bf16(c.rope_ramp * float(k / 64) + jump);
        for (int i = kVDim; i < kHeadDim; ++i) d.kv[size_t(slot) * kHeadDim + i] = ramp;
      }
    }
  }
  if (!c.counts.empty()) {
    d.counts.resize(c.tokens);
    for (int t = 0; t < c.tokens; ++t) {
      d.counts[t] = std::min({c.counts[t % c.counts.size()], c.topk, c.slots});
    }
  }
  return d;
}

// The variants a case runs: the wgmma kernel when the device has it, the mma.sync kernel; each
// with the requested split counts.
std::vector<Variant> Variants(const MqaCase& c) {
  std::vector<int> kernels = {1};
  // DCP_TEST_MQA_KERNELS=1 runs the mma.sync kernel alone (a wgmma kernel under repair).
  if (cuda::SparseMqaSm90Available() && EnvInteger("DCP_TEST_MQA_KERNELS", 0, 0, 1) != 1) {
    kernels.insert(kernels.begin(), 2);
  }
  int device = 0, major = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (major == 9 && !cuda::SparseMqaSm90Available()) {
    ADD_FAILURE() << "an sm_90 device without the wgmma kernel: build with "
                     "CMAKE_CUDA_ARCHITECTURES=90a";
  }
  // DCP_TEST_MQA_SCHEDULE=1 or 2 runs that wgmma schedule alone (a sanitizer's time budget).
  std::vector<int> schedules = c.schedules;
  if (const int64_t schedule = EnvInteger("DCP_TEST_MQA_SCHEDULE", 0, 0, 2); schedule != 0) {
    schedules = {static_cast<int>(schedule)};
  }
  std::vector<Variant> variants;
  for (int kernel : kernels) {
    for (int block_heads : c.block_heads) {
      if (kernel != 2 && block_heads != 0) continue;
      for (int ctas : c.ctas) {
        if (kernel != 2 && ctas != c.ctas.front()) continue;
        for (int splits : c.splits) {
          for (int merge : c.merges) {
            if (kernel != 2 && merge != c.merges.front()) continue;
            for (int schedule : schedules) {
              if ((kernel != 2 || merge == 2) && schedule != schedules.front()) continue;
              variants.push_back({kernel, splits, block_heads, kernel == 2 ? ctas : 0,
                                  kernel == 2 ? merge : 0, kernel == 2 ? schedule : 0});
            }
          }
        }
      }
    }
  }
  return variants;
}

// float64 reference of one (token, head): out [kVDim], lse.
void ReferenceRow(const MqaCase& c, const MqaData& d, const std::vector<double>& q,
                  const std::vector<double>& kv, int t, int h, std::vector<double>* out,
                  double* lse) {
  const double* qrow = q.data() + size_t(t) * d.q_token_stride + size_t(h) * c.q_head_stride;
  std::vector<double> scores;
  std::vector<int> rows;
  const int columns = d.counts.empty() ? c.topk : d.counts[t];
  for (int k = 0; k < columns; ++k) {
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
                       DeviceArray<float>& out, DeviceArray<float>& lse,
                       const int32_t* counts = nullptr) {
  SparseMqaParams p;
  p.valid_counts = counts;
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
  // The same launch with SparseMqaParams::out_bf16 (out null): o_lat lands in the bf16 buffer
  // (same strides) equal bit for bit to float_to_bf16 of the fp32 run's values `want`, the
  // LSEs bit for bit equal to `want_lse`, and nothing else of the bf16 buffer is written.
  void CheckBf16Output(const MqaCase& c, const MqaData& d, SparseMqaParams p,
                       const std::vector<float>& want, const std::vector<float>& want_lse,
                       DeviceArray<float>& out, DeviceArray<float>& lse) {
    SCOPED_TRACE("out_bf16");
    const size_t count = size_t(c.tokens) * d.out_token_stride;
    const bf16 poison = float_to_bf16(std::nanf(""));
    DeviceArray<bf16> out_bf16(std::vector<bf16>(count, poison));
    out.Poison();
    lse.Poison();
    p.out = nullptr;
    p.out_bf16 = out_bf16.get();
    const absl::Status status = cuda::SparseMqa(p, nullptr);
    ASSERT_TRUE(status.ok()) << status;
    DCP_ASSERT_CUDA(cudaDeviceSynchronize());
    const std::vector<bf16> got = out_bf16.Download();
    const std::vector<float> got_lse = lse.Download();
    int64_t wrong = 0, stray = 0;
    for (size_t i = 0; i < count; ++i) {
      const size_t in_token = i % size_t(d.out_token_stride);
      const bool inside = in_token < size_t(c.heads) * c.out_head_stride &&
                          in_token % c.out_head_stride < size_t(kVDim);
      if (!inside) {
        stray += got[i].bits != poison.bits;
      } else {
        wrong += got[i].bits != float_to_bf16(want[i]).bits;
      }
    }
    EXPECT_EQ(wrong, 0) << "bf16 values that are not the rounded fp32 output";
    EXPECT_EQ(stray, 0) << "bf16 elements outside the rows written";
    for (int t = 0; t < c.tokens; ++t) {
      for (int h = 0; h < c.heads; ++h) {
        const size_t at = size_t(t) * d.lse_token_stride + h;
        ASSERT_EQ(std::memcmp(&got_lse[at], &want_lse[at], sizeof(float)), 0)
            << "lse of token " << t << " head " << h;
      }
    }
    for (float v : out.Download()) ASSERT_TRUE(std::isnan(v)) << "out written beside out_bf16";
  }

  // The same launch with the MergeSplits kernel (split_merge 1) gives the same bits as `want`
  // (the run with p.split_merge): the merge inside the cluster follows its rule and order.
  void CheckMergesAgree(SparseMqaParams p, const std::vector<float>& want,
                        const std::vector<float>& want_lse, DeviceArray<float>& out,
                        DeviceArray<float>& lse) {
    SCOPED_TRACE("split_merge 1 against the launch's merge");
    out.Poison();
    lse.Poison();
    p.split_merge = 1;
    const absl::Status status = cuda::SparseMqa(p, nullptr);
    ASSERT_TRUE(status.ok()) << status;
    DCP_ASSERT_CUDA(cudaDeviceSynchronize());
    const std::vector<float> got = out.Download();
    const std::vector<float> got_lse = lse.Download();
    ASSERT_EQ(got.size(), want.size());
    ASSERT_EQ(got_lse.size(), want_lse.size());
    auto differing = [](const std::vector<float>& a, const std::vector<float>& b) {
      int64_t count = 0;
      for (size_t i = 0; i < a.size(); ++i) count += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
      return count;
    };
    EXPECT_EQ(differing(got, want), 0) << "out elements (poisoned padding included) differ";
    EXPECT_EQ(differing(got_lse, want_lse), 0) << "lse entries differ";
  }

  // Runs every variant on fresh data and checks the requested rows against float64; the
  // variants are also compared with the first one (bf16 tolerance).
  void RunAndCheck(const MqaCase& c) {
    std::mt19937_64 rng(TestSeed());
    MqaData d = MakeData(c, rng);
    DeviceArray<bf16> q(d.q), kv(d.kv);
    DeviceArray<int32_t> indices(d.indices);
    std::vector<int32_t> no_counts(1, 0);
    DeviceArray<int32_t> counts(d.counts.empty() ? no_counts : d.counts);
    DeviceArray<float> out(size_t(c.tokens) * d.out_token_stride);
    DeviceArray<float> lse(size_t(c.tokens) * d.lse_token_stride);
    SparseMqaParams p =
        Params(c, d, q, kv, indices, out, lse, d.counts.empty() ? nullptr : counts.get());
    DeviceArray<uint8_t> workspace(std::max<int64_t>(16, cuda::SparseMqaWorkspaceBytes(p, 64)));
    p.workspace = workspace.get();
    p.workspace_bytes = cuda::SparseMqaWorkspaceBytes(p, 64);
    p.expected_keys = c.expected_keys;

    // The reference rows.
    const std::vector<double> qd = ToDouble(d.q), kvd = ToDouble(d.kv);
    std::vector<std::pair<int, int>> rows;
    if (c.check_rows < 0) {
      for (int t = 0; t < c.tokens; ++t)
        for (int h = 0; h < c.heads; ++h) rows.emplace_back(t, h);
    } else {
      std::uniform_int_distribution<int> tok(0, c.tokens - 1), head(0, c.heads - 1);
      for (int i = 0; i < c.check_rows; ++i) rows.emplace_back(tok(rng), head(rng));
    }
    std::vector<std::vector<double>> refs(rows.size());
    std::vector<double> ref_lses(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      ReferenceRow(c, d, qd, kvd, rows[i].first, rows[i].second, &refs[i], &ref_lses[i]);
    }

    std::vector<float> first_out;
    for (const Variant& v : Variants(c)) {
      SCOPED_TRACE(::testing::Message()
                   << "kernel " << v.kernel << " splits " << v.splits << " block_heads "
                   << v.block_heads << " ctas " << v.ctas << " split_merge " << v.merge
                   << " schedule " << v.schedule);
      p.kernel = v.kernel;
      p.num_splits = v.splits;
      p.block_heads = v.block_heads;
      p.sm90_ctas = v.ctas;
      p.split_merge = v.merge;
      p.sm90_schedule = v.schedule;
      out.Poison();
      lse.Poison();
      const absl::Status status = cuda::SparseMqa(p, nullptr);
      ASSERT_TRUE(status.ok()) << status;
      DCP_ASSERT_CUDA(cudaDeviceSynchronize());
      const std::vector<float> got = out.Download();
      const std::vector<float> got_lse = lse.Download();

      // Every row written and finite (lse may be -inf only for empty rows, checked below).
      for (int t = 0; t < c.tokens; ++t) {
        for (int h = 0; h < c.heads; ++h) {
          const float* row =
              got.data() + size_t(t) * d.out_token_stride + size_t(h) * c.out_head_stride;
          for (int i = 0; i < kVDim; ++i) {
            ASSERT_TRUE(std::isfinite(row[i])) << "token " << t << " head " << h << " col " << i;
          }
          ASSERT_FALSE(std::isnan(got_lse[size_t(t) * d.lse_token_stride + h]));
        }
      }
      double diff = 0, norm = 0;
      for (size_t i = 0; i < rows.size(); ++i) {
        const auto [t, h] = rows[i];
        const std::vector<double>& ref = refs[i];
        const double ref_lse = ref_lses[i];
        const float* row =
            got.data() + size_t(t) * d.out_token_stride + size_t(h) * c.out_head_stride;
        const float row_lse = got_lse[size_t(t) * d.lse_token_stride + h];
        if (std::isinf(ref_lse)) {
          EXPECT_TRUE(std::isinf(row_lse) && row_lse < 0) << "token " << t << " head " << h;
          for (int j = 0; j < kVDim; ++j) ASSERT_EQ(row[j], 0.f) << "empty row " << t << "," << h;
          continue;
        }
        EXPECT_NEAR(row_lse, ref_lse, 2e-3 * std::max(1.0, std::abs(ref_lse)))
            << "token " << t << " head " << h;
        const Comparison cmp = Compare(row, ref.data(), kVDim);
        EXPECT_LT(cmp.relative_error, 2e-2) << "token " << t << " head " << h;
        for (int j = 0; j < kVDim; ++j) {
          diff += (row[j] - ref[j]) * (row[j] - ref[j]);
          norm += ref[j] * ref[j];
        }
      }
      if (norm > 0) {
        EXPECT_LT(std::sqrt(diff / norm), 1e-2) << "relative L2 error over all rows";
      }
      // The same result as the first variant within bf16 rounding (P is rounded to bf16).
      if (first_out.empty()) {
        first_out = got;
      } else {
        double d2 = 0, n2 = 0;
        for (int t = 0; t < c.tokens; ++t) {
          for (int h = 0; h < c.heads; ++h) {
            const size_t at = size_t(t) * d.out_token_stride + size_t(h) * c.out_head_stride;
            for (int j = 0; j < kVDim; ++j) {
              d2 += double(got[at + j] - first_out[at + j]) * (got[at + j] - first_out[at + j]);
              n2 += double(first_out[at + j]) * first_out[at + j];
            }
          }
        }
        if (n2 > 0) EXPECT_LT(std::sqrt(d2 / n2), 1e-2) << "against the first variant";
      }
      if (HasFatalFailure()) return;
      CheckBf16Output(c, d, p, got, got_lse, out, lse);
      if (HasFatalFailure()) return;
      if (v.kernel == 2) {
        CheckMergesAgree(p, got, got_lse, out, lse);
        if (HasFatalFailure()) return;
      }
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
  c.splits = {0, 1, 3};
  RunAndCheck(c);
}

// Output rows that are not 16-byte aligned (the wgmma kernel's bulk stores need it) keep the
// kernel's direct stores: float pairs at an even stride, single floats at an odd one.
TEST_F(SparseMqaCudaTest, UnalignedOutputRows) {
  for (int64_t stride : {514, 513}) {
    MqaCase c;
    c.tokens = 4;
    c.heads = 80;
    c.topk = 200;
    c.slots = 600;
    c.out_head_stride = stride;
    c.skip_fraction = 0.2;
    c.splits = {1, 2};  // 1: the kernel writes out itself
    RunAndCheck(c);
  }
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
    d.indices[0 * d.indices_stride + k] = -1;               // lone query, all -1
    if (k != 17) d.indices[1 * d.indices_stride + k] = -1;  // exactly one key
    d.indices[2 * d.indices_stride + k] = c.slots + k;      // all out of range
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

// Logits that climb through the key list, so the running max grows on most pairs: by ~6 log2
// units a pair (kept stale on every other pair by the wgmma kernel's slack of 8) and by ~2.7
// (kept for two pairs, then moved); one CTA walking all 2048 keys (1 split) and split ones.
TEST_F(SparseMqaCudaTest, RunningMaxClimbingThroughTheKeys) {
  for (float ramp : {0.45f, 0.2f}) {
    SCOPED_TRACE(::testing::Message() << "rope ramp " << ramp);
    MqaCase c;
    c.tokens = 1;
    c.heads = 64;
    c.topk = 2048;
    c.slots = 3000;
    c.skip_fraction = 0.02;
    c.rope_ramp = ramp;
    c.splits = {1, 0, 3};
    RunAndCheck(c);
    if (HasFatalFailure()) return;
  }
}

// The two blocks of a pair scored far apart (80-240 log2 units): the wgmma kernel's two
// consumer warpgroups score one block each, so the max jumps between them, one way and the
// other, beside blocks that are all masked for one warpgroup (counts 1, 64, 65, 127) and jumps
// inside a split.
TEST_F(SparseMqaCudaTest, LogitJumpsBetweenTheBlocksOfAPair) {
  const std::vector<std::vector<float>> patterns = {
      {0.f, 12.f, 0.f, 0.f, 0.f, 24.f, 36.f, 0.f},  // WG1 ahead, twice; then WG0 far ahead
      {-12.f, 0.f, 24.f, -12.f},                    // WG0 ahead by 36 units of rope
      {0.f, -30.f, 0.f, 30.f, -30.f, 0.f}};
  for (size_t i = 0; i < patterns.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "pattern " << i);
    MqaCase c;
    c.tokens = 6;
    c.heads = 64;
    c.topk = 1024;
    c.slots = 8000;
    c.skip_fraction = 0.02;
    c.block_rope = patterns[i];
    c.counts = {1024, 1, 64, 65, 127, 700};
    c.splits = {1, 0, 3};
    c.block_heads = {0, 32};
    RunAndCheck(c);
    if (HasFatalFailure()) return;
  }
}

// A grid smaller than the work items (SparseMqaParams::sm90_ctas): each CTA walks several
// items, so the producer gathers an item's first pair and loads its Q tile while the consumers
// finish the one before, across items without keys (count 0, empty splits), ragged counts and
// partial head blocks.
TEST_F(SparseMqaCudaTest, PersistentCtasMatchTheReference) {
  std::vector<MqaCase> cases(4);
  cases[0].tokens = 9, cases[0].heads = 48, cases[0].topk = 300, cases[0].slots = 2000;
  cases[0].counts = {0, 1, 64, 65, 300, 130, 0, 127, 129}, cases[0].splits = {1, 2, 7};
  cases[0].block_heads = {0, 16, 32, 64}, cases[0].skip_fraction = 0.1;
  cases[1].tokens = 5, cases[1].heads = 128, cases[1].topk = 2048, cases[1].slots = 6000;
  cases[1].counts = {2048, 63, 2047, 0, 1000}, cases[1].splits = {0, 1, 3};
  cases[1].check_rows = 128;
  cases[2].tokens = 1, cases[2].heads = 64, cases[2].topk = 2048, cases[2].slots = 3000;
  cases[2].rope_ramp = 0.45f, cases[2].splits = {1, 5};  // a climbing max, several items a CTA
  cases[3].tokens = 6, cases[3].heads = 16, cases[3].topk = 256, cases[3].slots = 1024;
  cases[3].q_low = -4.f, cases[3].q_high = 4.f, cases[3].scale = 0.5f;  // huge logits
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "case " << i);
    cases[i].ctas = {1, 3, 7};
    RunAndCheck(cases[i]);
    if (HasFatalFailure()) return;
  }
}

// A few small persistent grids (the racecheck case of scripts/device_test.sh and
// scripts/sparse_mqa_device.sh: the test above does not finish under racecheck in 100-150 s):
// an empty token between ragged ones, one and two CTAs walking 16- and 64-head items, one and
// two splits, both consumer schedules.
TEST_F(SparseMqaCudaTest, PersistentCtasSmallCases) {
  MqaCase c;
  c.tokens = 3;
  c.heads = 32;
  c.topk = 300;
  c.slots = 1000;
  c.counts = {300, 0, 130};
  c.splits = {1, 2};
  c.block_heads = {16, 64};
  c.ctas = {1, 2};
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

TEST_F(SparseMqaCudaTest, ValidCountsMixedWithinABatch) {
  MqaCase c;  // compacted rows; every count class in one batch, twice
  c.tokens = 14;
  c.heads = 16;
  c.topk = 2048;
  c.slots = 6000;
  c.counts = {0, 1, 63, 64, 65, 2047, 2048};
  c.splits = {0, 1, 2, 5, 16};
  RunAndCheck(c);
}

// SparseMqaParams::expected_keys plans the split and the tiling; each token's own count is
// still walked in full, whether the hint is far below the counts or far above them.
TEST_F(SparseMqaCudaTest, ExpectedKeysOnlyPlan) {
  MqaCase c;
  c.tokens = 7;
  c.heads = 32;
  c.topk = 2048;
  c.slots = 6000;
  c.counts = {0, 1, 65, 700, 2048};
  c.splits = {0};
  for (int expected : {1, 64, 512, 2048}) {
    SCOPED_TRACE(::testing::Message() << "expected_keys " << expected);
    c.expected_keys = expected;
    RunAndCheck(c);
  }
}

TEST_F(SparseMqaCudaTest, SmallSplitsAndCounts) {
  MqaCase c;  // small enough for racecheck: a split of a short list leaves empty splits
  c.tokens = 3;
  c.heads = 16;
  c.topk = 300;
  c.slots = 1000;
  c.counts = {0, 130, 300};
  c.splits = {0, 2, 7};
  RunAndCheck(c);
}

TEST_F(SparseMqaCudaTest, HeadCounts) {
  for (int heads : {16, 32, 48, 64, 128}) {
    SCOPED_TRACE(::testing::Message() << heads << " heads");
    MqaCase c;
    c.tokens = 3;
    c.heads = heads;
    c.topk = 256;
    c.slots = 1000;
    c.skip_fraction = 0.1;
    c.splits = {0, 2};
    c.block_heads = {0, 16, 32};  // 48 heads at 32: a full block and a half-padded one
    RunAndCheck(c);
    if (HasFatalFailure()) return;
  }
}

TEST_F(SparseMqaCudaTest, EverySplitCountOfADecodeToken) {
  MqaCase c;  // one decode token at 128 heads: the heuristic splits it; every count is run
  c.tokens = 1;
  c.heads = 128;
  c.topk = 2048;
  c.slots = 5000;
  c.skip_fraction = 0.05;
  c.check_rows = 48;
  c.splits = {0};
  for (int splits = 1; splits <= 33; ++splits) c.splits.push_back(splits);
  c.splits.push_back(64);
  RunAndCheck(c);
}

// A few decode tokens with 16 and 32 heads per CTA (the wgmma kernel's narrow head blocks: the
// tile's other rows are zero padding, never stored), against the reference and the 64-head
// block, split and not, with compacted counts that leave some splits empty.
TEST_F(SparseMqaCudaTest, NarrowHeadBlocksOfDecodeTokens) {
  MqaCase c;
  c.tokens = 3;
  c.heads = 128;
  c.topk = 2048;
  c.slots = 6000;
  c.counts = {2048, 1, 700};
  c.skip_fraction = 0.05;
  c.check_rows = 96;
  c.splits = {1, 4, 16};
  c.block_heads = {64, 32, 16};
  RunAndCheck(c);
}

TEST_F(SparseMqaCudaTest, DecodeBatchWithValidCounts) {
  MqaCase c;  // 64 decode tokens, a rank's share of the keys (compacted)
  c.tokens = 64;
  c.heads = 128;
  c.topk = 2048;
  c.slots = 20000;
  c.counts = {512, 2048, 700, 1, 0, 1500};
  c.check_rows = 64;
  c.splits = {0, 1};
  RunAndCheck(c);
}

// Back-to-back launches on one stream with no host sync in between, sharing one split
// workspace: the kernels are programmatic dependents of the previous kernel (sm_90), so each
// must wait for it before touching memory. Problem B's attention kernel overwrites the
// partials that problem A's merge reads, and A's merge reads what A's attention kernel wrote;
// a missing or misplaced griddepcontrol.wait shows up as wrong rows of A or B.
TEST_F(SparseMqaCudaTest, BackToBackLaunchesShareTheWorkspace) {
  MqaCase c;
  c.tokens = 2;
  c.heads = 128;
  c.topk = 1024;
  c.slots = 4000;
  c.skip_fraction = 0.05;
  std::mt19937_64 rng(TestSeed());
  const MqaData a = MakeData(c, rng), b = MakeData(c, rng);
  DeviceArray<bf16> qa(a.q), kva(a.kv), qb(b.q), kvb(b.kv);
  DeviceArray<int32_t> ia(a.indices), ib(b.indices);
  DeviceArray<float> outa(size_t(c.tokens) * a.out_token_stride),
      lsea(size_t(c.tokens) * a.lse_token_stride);
  DeviceArray<float> outb(size_t(c.tokens) * b.out_token_stride),
      lseb(size_t(c.tokens) * b.lse_token_stride);
  SparseMqaParams pa = Params(c, a, qa, kva, ia, outa, lsea);
  SparseMqaParams pb = Params(c, b, qb, kvb, ib, outb, lseb);
  const int64_t bytes = cuda::SparseMqaWorkspaceBytes(pa, 64);
  DeviceArray<uint8_t> workspace(bytes);
  for (SparseMqaParams* p : {&pa, &pb}) {
    p->workspace = workspace.get();
    p->workspace_bytes = bytes;
  }
  const std::vector<double> qad = ToDouble(a.q), kvad = ToDouble(a.kv);
  const std::vector<double> qbd = ToDouble(b.q), kvbd = ToDouble(b.kv);
  cudaStream_t stream = nullptr;
  DCP_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const Variant& v : Variants(c)) {
    for (int splits : {0, 4, 16}) {
      SCOPED_TRACE(::testing::Message() << "kernel " << v.kernel << " splits " << splits
                                        << " schedule " << v.schedule);
      outa.Poison();
      outb.Poison();
      lsea.Poison();
      lseb.Poison();
      for (SparseMqaParams* p : {&pa, &pb}) {
        p->kernel = v.kernel;
        p->num_splits = splits;
        p->sm90_schedule = v.schedule;
      }
      // A, B, A again: the second A overwrites the partials B's merge reads.
      ASSERT_TRUE(cuda::SparseMqa(pa, stream).ok());
      ASSERT_TRUE(cuda::SparseMqa(pb, stream).ok());
      ASSERT_TRUE(cuda::SparseMqa(pa, stream).ok());
      DCP_ASSERT_CUDA(cudaStreamSynchronize(stream));
      const auto got_a = outa.Download(), got_b = outb.Download();
      const auto got_la = lsea.Download(), got_lb = lseb.Download();
      std::vector<double> ref;
      double ref_lse = 0;
      for (int t = 0; t < c.tokens; ++t) {
        for (int h = 0; h < c.heads; h += 9) {
          ReferenceRow(c, a, qad, kvad, t, h, &ref, &ref_lse);
          const size_t at = size_t(t) * a.out_token_stride + size_t(h) * c.out_head_stride;
          EXPECT_LT(Compare(&got_a[at], ref.data(), kVDim).relative_error, 2e-2)
              << "A token " << t << " head " << h;
          EXPECT_NEAR(got_la[size_t(t) * a.lse_token_stride + h], ref_lse,
                      2e-3 * std::max(1.0, std::abs(ref_lse)));
          ReferenceRow(c, b, qbd, kvbd, t, h, &ref, &ref_lse);
          EXPECT_LT(Compare(&got_b[at], ref.data(), kVDim).relative_error, 2e-2)
              << "B token " << t << " head " << h;
          EXPECT_NEAR(got_lb[size_t(t) * b.lse_token_stride + h], ref_lse,
                      2e-3 * std::max(1.0, std::abs(ref_lse)));
        }
      }
      if (HasFailure()) break;
    }
  }
  DCP_ASSERT_CUDA(cudaStreamDestroy(stream));
}

// The split choice is host logic (no GPU needed). At 128 heads and top-k 2048 on 132 SMs it
// picks the counts measured fastest on the H200 for one decode token (wgmma 16, mma.sync 32;
// docs/sparse_mqa_sm90.md), splits small batches, and leaves full ones alone.
// The consumer schedule (host logic): roles where each split walks two pairs of blocks or more
// (measured faster there), pairs for one-pair splits and for fp8 rows (not compiled with roles).
TEST(SparseMqaSplitTest, ScheduleFollowsThePairsPerSplit) {
  SparseMqaParams p;
  p.topk = 2048;  // 32 blocks, 16 pairs
  EXPECT_EQ(cuda::SparseMqaChooseSchedule(p, 1), 2);
  EXPECT_EQ(cuda::SparseMqaChooseSchedule(p, 8), 2);   // 2 pairs a split
  EXPECT_EQ(cuda::SparseMqaChooseSchedule(p, 9), 2);   // 4 blocks a split
  EXPECT_EQ(cuda::SparseMqaChooseSchedule(p, 16), 1);  // one pair a split: a decode token
  EXPECT_EQ(cuda::SparseMqaChooseSchedule(p, 32), 1);
  p.topk = 128;
  EXPECT_EQ(cuda::SparseMqaChooseSchedule(p, 1), 1);
  p.topk = 129;
  EXPECT_EQ(cuda::SparseMqaChooseSchedule(p, 1), 2);
  p.topk = 0;
  EXPECT_EQ(cuda::SparseMqaChooseSchedule(p, 1), 1);
  p.topk = 2048;
  p.kv_format = KvCacheDType::kFp8DsMla;
  EXPECT_EQ(cuda::SparseMqaChooseSchedule(p, 1), 1);
}

// The choices plan for SparseMqaParams::expected_keys (at most topk) where it is set: a rank's
// share of each selection under DCP, not the top-k width.
TEST(SparseMqaSplitTest, ExpectedKeysPlanLikeThatTopk) {
  SparseMqaParams p;
  p.num_heads = 128;
  p.head_dim = 576;
  p.v_dim = 512;
  for (int kernel : {1, 2}) {
    for (int tokens : {1, 2, 8, 64}) {
      for (int keys : {64, 512, 1000}) {
        SCOPED_TRACE(::testing::Message() << "kernel " << kernel << " tokens " << tokens
                                          << " keys " << keys);
        p.num_tokens = tokens;
        p.topk = keys;
        p.expected_keys = 0;
        const cuda::SparseMqaTiling want = cuda::SparseMqaChooseTiling(p, kernel, 132);
        const int want_schedule = cuda::SparseMqaChooseSchedule(p, want.splits);
        p.topk = 2048;
        p.expected_keys = keys;
        EXPECT_EQ(cuda::SparseMqaPlannedKeys(p), keys);
        const cuda::SparseMqaTiling got = cuda::SparseMqaChooseTiling(p, kernel, 132);
        EXPECT_EQ(got.splits, want.splits);
        EXPECT_EQ(got.block_heads, want.block_heads);
        EXPECT_EQ(cuda::SparseMqaChooseSchedule(p, got.splits), want_schedule);
      }
    }
  }
  // One decode token at W = 4 (512 of 2048 keys): fewer splits than at 2048 keys.
  p.num_tokens = 1;
  p.topk = 2048;
  p.expected_keys = 0;
  const int full = cuda::SparseMqaChooseSplits(p, 2, 132);
  p.expected_keys = 512;
  EXPECT_LT(cuda::SparseMqaChooseSplits(p, 2, 132), full);
  // Above topk it is topk.
  p.expected_keys = 4096;
  EXPECT_EQ(cuda::SparseMqaPlannedKeys(p), 2048);
  EXPECT_EQ(cuda::SparseMqaChooseSplits(p, 2, 132), full);
}

TEST(SparseMqaSplitTest, PersistentGridForLongRolesLaunches) {
  const int sms = 132;
  const int64_t waves = cuda::kPersistentMinWaves;
  // Prefill with the roles schedule: one CTA per SM from kPersistentMinWaves waves of items.
  EXPECT_EQ(cuda::SparseMqaChoosePersistentCtas(true, waves * sms, sms), sms);
  EXPECT_EQ(cuda::SparseMqaChoosePersistentCtas(true, 4096 * 2, sms), sms);
  EXPECT_EQ(cuda::SparseMqaChoosePersistentCtas(true, waves * sms - 1, sms), 0);
  // Decode batches (fewer items than that) and the pairs schedule keep one CTA per item.
  EXPECT_EQ(cuda::SparseMqaChoosePersistentCtas(true, 128, sms), 0);
  EXPECT_EQ(cuda::SparseMqaChoosePersistentCtas(false, 4096 * 2, sms), 0);
  EXPECT_EQ(cuda::SparseMqaChoosePersistentCtas(true, 4096 * 2, 0), 0);
}

TEST(SparseMqaSplitTest, HeuristicPicksTheMeasuredBest) {
  SparseMqaParams p;
  p.num_heads = 128;
  p.head_dim = 576;
  p.v_dim = 512;
  p.topk = 2048;
  p.num_tokens = 1;
  EXPECT_EQ(cuda::SparseMqaChooseSplits(p, 2, 132), 16);
  EXPECT_EQ(cuda::SparseMqaChooseSplits(p, 1, 132), 32);
  for (int kernel : {1, 2}) {
    for (int tokens : {1, 2, 8, 33}) {
      p.num_tokens = tokens;
      const int splits = cuda::SparseMqaChooseSplits(p, kernel, 132);
      EXPECT_GT(splits, 1) << "kernel " << kernel << " tokens " << tokens;
      EXPECT_LE(splits, 64);
    }
    for (int tokens : {64, 1024}) {  // 128 and 2048 CTAs: no split (measured: 1 is fastest)
      p.num_tokens = tokens;
      EXPECT_EQ(cuda::SparseMqaChooseSplits(p, kernel, 132), 1) << tokens << " tokens";
    }
    p.num_tokens = 1;
    p.topk = 64;  // one block: nothing to split
    EXPECT_EQ(cuda::SparseMqaChooseSplits(p, kernel, 132), 1);
    p.topk = 2048;
  }
  // Heads per CTA (the wgmma kernel): 32 for one decode token (measured 1-1.5 us faster than
  // 64 at 16 splits), 64 from 16 tokens on (32 measured slower there); the mma.sync kernel and
  // a forced block_heads keep theirs.
  p.num_tokens = 1;
  cuda::SparseMqaTiling tiling = cuda::SparseMqaChooseTiling(p, 2, 132);
  EXPECT_EQ(tiling.block_heads, 32);
  EXPECT_EQ(tiling.splits, 16);
  EXPECT_EQ(cuda::SparseMqaChooseTiling(p, 1, 132).block_heads, 64);
  p.block_heads = 64;
  EXPECT_EQ(cuda::SparseMqaChooseTiling(p, 2, 132).block_heads, 64);
  EXPECT_EQ(cuda::SparseMqaChooseTiling(p, 2, 132).splits, 16);
  p.block_heads = 0;
  for (int tokens : {16, 64, 1024}) {
    p.num_tokens = tokens;
    EXPECT_EQ(cuda::SparseMqaChooseTiling(p, 2, 132).block_heads, 64) << tokens << " tokens";
  }
  p.num_tokens = 3;
  EXPECT_EQ(cuda::SparseMqaWorkspaceBytes(p, 1), 0);
  EXPECT_GE(cuda::SparseMqaWorkspaceBytes(p, 4), int64_t(4) * 3 * 128 * (512 + 1) * 4);
}

// The splits merged inside a thread-block cluster (split_merge 2: required, so a device that
// cannot fails here rather than quietly running MergeSplits): every cluster size 2..16 of one
// decode token at 128 heads and each head block, then a few tokens with ragged counts (empty
// splits, a token with no keys, partial head blocks) and huge logits; each also bit for bit
// against the MergeSplits kernel (RunAndCheck).
TEST_F(SparseMqaCudaTest, SplitsMergedInsideTheCluster) {
  if (!cuda::SparseMqaSm90Available()) GTEST_SKIP() << "no wgmma kernel on this device";
  for (int splits = 2; splits <= 16; ++splits) {  // for the record (docs/sparse_mqa_sm90.md)
    std::cout << "clusters of " << splits << " CTAs held at once: "
              << cuda::SparseMqaSm90MaxClusters<576, 512>(splits) << "\n";
  }
  MqaCase c;
  c.tokens = 1;
  c.heads = 128;
  c.topk = 2048;
  c.slots = 5000;
  c.skip_fraction = 0.05;
  c.check_rows = 48;
  c.splits.clear();
  for (int splits = 2; splits <= 16; ++splits) c.splits.push_back(splits);
  c.block_heads = {16, 32, 64};
  c.merges = {2};
  RunAndCheck(c);
  if (HasFatalFailure()) return;
  MqaCase r;
  r.tokens = 5;
  r.heads = 48;
  r.topk = 700;
  r.slots = 3000;
  r.counts = {700, 0, 1, 65, 300};
  r.out_head_stride = kVDim + 2;  // rows not 16-byte (fp32) or 8-byte (bf16) aligned
  r.lse_extra = 3;
  r.splits = {2, 3, 6, 11};
  r.block_heads = {0, 16, 32};
  r.merges = {2};
  RunAndCheck(r);
  if (HasFatalFailure()) return;
  MqaCase h;
  h.tokens = 2;
  h.heads = 64;
  h.topk = 1024;
  h.slots = 2000;
  h.q_low = -4.f, h.q_high = 4.f, h.scale = 0.5f;  // huge logits
  h.splits = {4, 16};
  h.merges = {2};
  RunAndCheck(h);
}

// A few small clusters (the racecheck case of scripts/device_test.sh: the whole test above is
// too large for compute-sanitizer's time): ragged counts with an empty token and a token of one
// block, unaligned output rows, two and three splits of 16 and 32 heads.
TEST_F(SparseMqaCudaTest, ClusterMergeSmallCases) {
  if (!cuda::SparseMqaSm90Available()) GTEST_SKIP() << "no wgmma kernel on this device";
  MqaCase c;
  c.tokens = 3;
  c.heads = 32;
  c.topk = 300;
  c.slots = 1000;
  c.counts = {300, 0, 65};
  c.out_head_stride = kVDim + 2;
  c.splits = {2, 3};
  c.block_heads = {16, 32};
  c.merges = {2};
  RunAndCheck(c);
}

// One token of 64 heads over 512 keys on the device, for the tests of single launches.
struct OneTokenLaunch {
  static MqaCase Case() {
    MqaCase c;
    c.tokens = 1;
    c.heads = 64;
    c.topk = 512;
    c.slots = 2000;
    return c;
  }
  explicit OneTokenLaunch(std::mt19937_64& rng)
      : c(Case()),
        d(MakeData(c, rng)),
        q(d.q),
        kv(d.kv),
        indices(d.indices),
        out(size_t(c.tokens) * d.out_token_stride),
        lse(size_t(c.heads)),
        p(Params(c, d, q, kv, indices, out, lse)) {}
  MqaCase c;
  MqaData d;
  DeviceArray<bf16> q, kv;
  DeviceArray<int32_t> indices;
  DeviceArray<float> out, lse;
  SparseMqaParams p;
};

TEST_F(SparseMqaCudaTest, SplitMergeOptionsAreChecked) {
  std::mt19937_64 rng(TestSeed());
  OneTokenLaunch launch(rng);
  SparseMqaParams& p = launch.p;
  DeviceArray<uint8_t> workspace(cuda::SparseMqaWorkspaceBytes(p, 32));
  p.workspace = workspace.get();
  p.workspace_bytes = cuda::SparseMqaWorkspaceBytes(p, 32);
  p.num_splits = 4;
  p.split_merge = 3;
  absl::Status status = cuda::SparseMqa(p, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("split_merge 3"), std::string::npos) << status;
  p.split_merge = 0;
  for (int schedule : {-1, 3}) {
    p.sm90_schedule = schedule;
    status = cuda::SparseMqa(p, nullptr);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("sm90_schedule " + std::to_string(schedule)),
              std::string::npos)
        << status;
  }
  p.sm90_schedule = 0;
  p.split_merge = 2;
  p.sm90_ctas = 2;
  status = cuda::SparseMqa(p, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  p.sm90_ctas = 0;
  p.kernel = 1;  // the mma.sync kernel has no cluster merge
  status = cuda::SparseMqa(p, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
  if (cuda::SparseMqaSm90Available()) {
    p.kernel = 2;
    p.num_splits = 17;  // more splits than a cluster holds
    status = cuda::SparseMqa(p, nullptr);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
  }
}

TEST_F(SparseMqaCudaTest, NoWorkspaceRunsUnsplit) {
  std::mt19937_64 rng(TestSeed());
  OneTokenLaunch launch(rng);
  const MqaCase& c = launch.c;
  const MqaData& d = launch.d;
  DeviceArray<float>& out = launch.out;
  SparseMqaParams& p = launch.p;
  p.num_splits = 8;  // asked for, but no workspace: one split, still right
  ASSERT_TRUE(cuda::SparseMqa(p, nullptr).ok());
  const auto got = out.Download();
  const auto qd = ToDouble(d.q), kvd = ToDouble(d.kv);
  std::vector<double> ref;
  double ref_lse = 0;
  for (int h = 0; h < c.heads; h += 9) {
    ReferenceRow(c, d, qd, kvd, 0, h, &ref, &ref_lse);
    EXPECT_LT(Compare(&got[size_t(h) * kVDim], ref.data(), kVDim).relative_error, 2e-2);
  }
  p.workspace_bytes = -1;
  EXPECT_EQ(cuda::SparseMqa(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
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
  p.dtype = DType::kBF16;
  p.block_heads = 48;
  status = cuda::SparseMqa(p, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("block_heads 48"), std::string::npos) << status;
  p.block_heads = 0;
  p.sm90_ctas = -1;
  status = cuda::SparseMqa(p, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("sm90_ctas -1"), std::string::npos) << status;
  p.sm90_ctas = 0;
  p.expected_keys = -5;
  status = cuda::SparseMqa(p, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("expected_keys -5"), std::string::npos) << status;
}

}  // namespace
}  // namespace dcp::testing
