// MlaProjections::UpProject (the dense route's K/V up-projection) and CombineKvB (the
// kv_b_proj-layout weight) on the CPU device, against float64 loops written here: both paths
// (one GEMM through w_kv_b, two GEMMs without) write kv [n, Hl, Dr + Dn + Dv] = per head
// [k_pe | w_uk[h] kv_c | w_uv[h]^T kv_c], over poisoned (NaN) output, for one row, many rows,
// both storage dtypes and the DeepSeek-V3.2 / GLM-5 per-head sizes (scaled down); rows past n
// stay untouched; more rows than Prepare planned is an error that writes nothing.
#include "runtime/mla_projections.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gtest/gtest.h"
#include "runtime/device.h"

namespace dcp {
namespace {

struct Shape {
  int heads, rank, nope, rope, v;
};

// Host values rounded to the storage dtype (so the reference sees what the device holds).
std::vector<float> Random(std::mt19937_64& rng, size_t n, DType dtype, float scale = 1.f) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> values(n);
  for (float& x : values) {
    x = dist(rng);
    if (dtype == DType::kBF16) x = bf16_to_float(float_to_bf16(x));
  }
  return values;
}

class MlaProjectionsTest : public ::testing::TestWithParam<DType> {
 protected:
  // Device copy of host floats in the storage dtype.
  Buffer ToDevice(Device& device, const std::vector<float>& host) {
    const DType dtype = device.storage_dtype();
    Buffer buffer = device.Allocate(std::max<size_t>(host.size(), 1) * dtype_size(dtype)).value();
    if (dtype == DType::kF32) {
      std::memcpy(buffer.data(), host.data(), host.size() * 4);
    } else {
      auto* out = static_cast<bf16*>(buffer.data());
      for (size_t i = 0; i < host.size(); ++i) out[i] = float_to_bf16(host[i]);
    }
    return buffer;
  }
  float Read(Device& device, const void* data, size_t i) {
    if (device.storage_dtype() == DType::kF32) return static_cast<const float*>(data)[i];
    return bf16_to_float(static_cast<const bf16*>(data)[i]);
  }

  void RunCase(const Shape& s, int64_t n, int64_t planned) {
    const DType dtype = GetParam();
    auto device = MakeCpuDevice(dtype);
    ModelDims m;
    m.kv_lora_rank = s.rank, m.qk_nope_head_dim = s.nope, m.qk_rope_head_dim = s.rope;
    m.v_head_dim = s.v, m.num_heads = s.heads;
    const int width = m.latent_width(), kv_width = MlaProjections::KvWidth(m);
    ASSERT_EQ(kv_width, s.rope + s.nope + s.v);
    std::mt19937_64 rng(0x5eed + n * 31 + s.heads);
    const float w_scale = 1.f / std::sqrt(float(s.rank));
    const std::vector<float> w_uk = Random(rng, size_t(s.heads) * s.nope * s.rank, dtype, w_scale);
    const std::vector<float> w_uv = Random(rng, size_t(s.heads) * s.rank * s.v, dtype, w_scale);
    const std::vector<float> rows = Random(rng, size_t(n) * width, dtype);
    Buffer d_uk = ToDevice(*device, w_uk), d_uv = ToDevice(*device, w_uv);
    Buffer d_rows = ToDevice(*device, rows);
    auto combined = MlaProjections::CombineKvB(*device, m, s.heads, d_uk.data(), d_uv.data());
    ASSERT_TRUE(combined.ok()) << combined.status();

    // The combined weight is a permutation: exactly w_uk[h] rows, then w_uv[h]^T rows.
    for (int h = 0; h < s.heads; ++h) {
      for (int j = 0; j < s.nope + s.v; ++j) {
        for (int c = 0; c < s.rank; ++c) {
          const float want = j < s.nope ? w_uk[(size_t(h) * s.nope + j) * s.rank + c]
                                        : w_uv[(size_t(h) * s.rank + c) * s.v + (j - s.nope)];
          ASSERT_EQ(Read(*device, combined->data(),
                         (size_t(h) * (s.nope + s.v) + j) * s.rank + c),
                    want)
              << "head " << h << " row " << j << " col " << c;
        }
      }
    }

    // Reference kv in double.
    std::vector<double> ref(size_t(n) * s.heads * kv_width);
    for (int64_t t = 0; t < n; ++t) {
      const float* kv_c = rows.data() + t * width;
      for (int h = 0; h < s.heads; ++h) {
        double* out = ref.data() + (size_t(t) * s.heads + h) * kv_width;
        for (int i = 0; i < s.rope; ++i) out[i] = kv_c[s.rank + i];
        for (int j = 0; j < s.nope; ++j) {
          double acc = 0;
          for (int c = 0; c < s.rank; ++c) {
            acc += double(w_uk[(size_t(h) * s.nope + j) * s.rank + c]) * kv_c[c];
          }
          out[s.rope + j] = acc;
        }
        for (int j = 0; j < s.v; ++j) {
          double acc = 0;
          for (int c = 0; c < s.rank; ++c) {
            acc += double(w_uv[(size_t(h) * s.rank + c) * s.v + j]) * kv_c[c];
          }
          out[s.rope + s.nope + j] = acc;
        }
      }
    }

    for (const bool one_gemm : {true, false}) {
      SCOPED_TRACE(one_gemm ? "w_kv_b" : "w_uk, w_uv");
      MlaProjections projections(*device, m, s.heads);
      ASSERT_TRUE(projections.Prepare(planned).ok());
      projections.Bind(d_uk.data(), d_uv.data(), one_gemm ? combined->data() : nullptr);
      // One poisoned row past n: nothing may write it.
      const size_t count = size_t(n + 1) * s.heads * kv_width;
      Buffer kv = device->Allocate(count * dtype_size(dtype)).value();
      std::memset(kv.data(), 0xFF, count * dtype_size(dtype));  // NaN in both dtypes
      const absl::Status status = projections.UpProject(d_rows.data(), n, kv.data());
      if (n > planned) {
        EXPECT_FALSE(status.ok()) << "more rows than planned";
        for (size_t i = 0; i < count; ++i) {
          ASSERT_TRUE(std::isnan(Read(*device, kv.data(), i))) << "written before the check";
        }
        continue;
      }
      ASSERT_TRUE(status.ok()) << status;
      double diff = 0, norm = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        const float got = Read(*device, kv.data(), i);
        ASSERT_TRUE(std::isfinite(got)) << "element " << i << " not written";
        const double tolerance = dtype == DType::kBF16 ? 1e-2 * std::max(1.0, std::abs(ref[i]))
                                                       : 1e-4 * std::max(1.0, std::abs(ref[i]));
        ASSERT_NEAR(got, ref[i], tolerance) << "element " << i;
        diff += (got - ref[i]) * (got - ref[i]);
        norm += ref[i] * ref[i];
      }
      if (norm > 0) EXPECT_LT(std::sqrt(diff / norm), dtype == DType::kBF16 ? 4e-3 : 1e-6);
      for (size_t i = ref.size(); i < count; ++i) {
        ASSERT_TRUE(std::isnan(Read(*device, kv.data(), i))) << "row past n written at " << i;
      }
    }
  }
};

TEST_P(MlaProjectionsTest, DeepSeekShapedHeads) { RunCase({4, 64, 16, 8, 16}, 37, 40); }
TEST_P(MlaProjectionsTest, Glm5ShapedHeads) { RunCase({3, 64, 24, 8, 32}, 19, 19); }
TEST_P(MlaProjectionsTest, OneRow) { RunCase({2, 32, 8, 8, 8}, 1, 1); }
TEST_P(MlaProjectionsTest, OneHeadManyRows) { RunCase({1, 48, 16, 16, 24}, 300, 300); }
TEST_P(MlaProjectionsTest, MoreRowsThanPlannedIsAnError) { RunCase({2, 32, 8, 8, 8}, 9, 4); }

INSTANTIATE_TEST_SUITE_P(StorageDtypes, MlaProjectionsTest,
                         ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));  // F32, BF16
                         });

}  // namespace
}  // namespace dcp
