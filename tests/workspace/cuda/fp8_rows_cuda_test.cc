// The CUDA fp8_ds_mla cache write and gather (workspace/cuda/fp8_rows_cuda.h) against the
// independent host model of tests/reference: bit-exact rows from bf16 input (random tiles,
// all-zero tiles, negative zeros, bf16 subnormals, huge values, wide dynamic ranges), skipped
// slots left untouched, the dequantizing gather, and the clear errors on bad input.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/gpu_test_util.h"
#include "tests/reference/fp8_ds_mla_reference.h"
#include "workspace/cpu/fp8_rows_cpu.h"
#include "workspace/cuda/fp8_rows_cuda.h"

namespace dcp::testing {
namespace {

constexpr int kR = 512, kDr = 64, kRow = 656, kWidth = 576;

// bf16 rows of kv_c [n, 512] and k_pe [n, 64], one corner of the format per row kind.
void MakeBf16Rows(std::mt19937_64& rng, int n, std::vector<bf16>* kv, std::vector<bf16>* k_pe) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> exponent(-40.f, 40.f);
  kv->resize(size_t(n) * kR);
  k_pe->resize(size_t(n) * kDr);
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < kR; ++i) {
      const int tile = i / 128;
      float v = normal(rng);
      switch (r % 7) {
        case 0: break;
        case 1: v = tile == 2 ? 0.f : v; break;                      // all-zero tile
        case 2: v = (tile == 0 || i % 4 == 1) ? -0.f : v; break;     // negative zeros
        case 3: v *= 1e-39f; break;                                  // bf16 subnormals
        case 4: v *= std::exp2(exponent(rng)); break;                // wide dynamic range
        case 5: v *= 1e37f; break;                                   // huge
        case 6: v = std::round(v * 8.f); break;                      // small integers: ties
      }
      (*kv)[size_t(r) * kR + i] = float_to_bf16(v);
    }
    for (int i = 0; i < kDr; ++i) (*k_pe)[size_t(r) * kDr + i] = float_to_bf16(normal(rng) * 2.f);
  }
}

class Fp8RowsCudaTest : public GpuTest {};

TEST_F(Fp8RowsCudaTest, WriteIsBitExactWithTheReference) {
  std::mt19937_64 rng(TestSeed());
  const int n = 300, num_slots = 400;
  std::vector<bf16> kv, k_pe;
  MakeBf16Rows(rng, n, &kv, &k_pe);
  // kv_c rows with a stride of 576 (a [kv_c | k_pe] row buffer), k_pe separate.
  const int64_t kv_stride = kWidth;
  std::vector<bf16> kv_strided(size_t(n) * kv_stride, float_to_bf16(7.f));
  for (int r = 0; r < n; ++r) {
    std::memcpy(&kv_strided[size_t(r) * kv_stride], &kv[size_t(r) * kR], kR * sizeof(bf16));
  }
  std::vector<int32_t> slots(n);
  for (int i = 0; i < n; ++i) {
    slots[i] = i % 11 == 3 ? -1 : (i % 17 == 5 ? num_slots + i : (i * 53 + 7) % num_slots);
  }
  DeviceArray<bf16> d_kv(kv_strided), d_pe(k_pe);
  DeviceArray<int32_t> d_slots(slots);
  DeviceArray<uint8_t> d_cache(size_t(num_slots) * kRow);
  DCP_ASSERT_CUDA(cudaMemset(d_cache.get(), 0xab, d_cache.size()));
  Fp8DsMlaWriteParams p;
  p.kv_c = d_kv.get(), p.k_pe = d_pe.get(), p.slot_mapping = d_slots.get();
  p.cache = d_cache.get();
  p.dtype = DType::kBF16;
  p.num_rows = n, p.num_slots = num_slots;
  p.kv_c_row_stride = kv_stride, p.k_pe_row_stride = kDr;
  const absl::Status status = cuda::WriteFp8DsMlaRows(p, nullptr);
  ASSERT_TRUE(status.ok()) << status;
  const std::vector<uint8_t> cache = d_cache.Download();

  // The CPU writer on the same bf16 input: the same bytes.
  std::vector<uint8_t> cpu_cache(cache.size(), 0xab);
  Fp8DsMlaWriteParams host = p;
  host.kv_c = kv_strided.data(), host.k_pe = k_pe.data(), host.slot_mapping = slots.data();
  host.cache = cpu_cache.data();
  ASSERT_TRUE(cpu::WriteFp8DsMlaRows(host).ok());
  EXPECT_EQ(cache, cpu_cache) << "CUDA and CPU writers disagree";

  std::vector<bool> written(num_slots, false);
  std::vector<float> x(kR), pe(kDr);
  for (int i = 0; i < n; ++i) {
    if (slots[i] < 0 || slots[i] >= num_slots) continue;
    written[slots[i]] = true;
    for (int c = 0; c < kR; ++c) x[c] = bf16_to_float(kv[size_t(i) * kR + c]);
    for (int c = 0; c < kDr; ++c) pe[c] = bf16_to_float(k_pe[size_t(i) * kDr + c]);
    const std::vector<uint8_t> want = reference::QuantizeFp8DsMlaRow(x.data(), pe.data());
    const uint8_t* got = cache.data() + size_t(slots[i]) * kRow;
    for (int b = 0; b < kRow; ++b) {
      ASSERT_EQ(int(got[b]), int(want[b])) << "row " << i << " (kind " << i % 7 << ") byte " << b;
    }
  }
  for (int s = 0; s < num_slots; ++s) {
    if (written[s]) continue;
    for (int b = 0; b < kRow; ++b) ASSERT_EQ(cache[size_t(s) * kRow + b], 0xab) << "slot " << s;
  }
}

TEST_F(Fp8RowsCudaTest, GatherDequantizesToBf16LikeTheReference) {
  std::mt19937_64 rng(TestSeed());
  const int num_src = 257, n = 1000;
  std::vector<bf16> kv, k_pe;
  MakeBf16Rows(rng, num_src, &kv, &k_pe);
  std::vector<uint8_t> cache;
  std::vector<float> x(kR), pe(kDr);
  for (int r = 0; r < num_src; ++r) {
    for (int c = 0; c < kR; ++c) x[c] = bf16_to_float(kv[size_t(r) * kR + c]);
    for (int c = 0; c < kDr; ++c) pe[c] = bf16_to_float(k_pe[size_t(r) * kDr + c]);
    const std::vector<uint8_t> row = reference::QuantizeFp8DsMlaRow(x.data(), pe.data());
    cache.insert(cache.end(), row.begin(), row.end());
  }
  std::vector<int32_t> index(n);
  std::uniform_int_distribution<int> pick(-2, num_src + 1);
  for (int32_t& i : index) i = pick(rng);
  const int64_t stride = kWidth + 16;
  DeviceArray<uint8_t> d_cache(cache);
  DeviceArray<int32_t> d_index(index);
  DeviceArray<bf16> d_out(size_t(n) * stride);
  d_out.Poison();
  Fp8DsMlaGatherParams p;
  p.cache = d_cache.get(), p.index = d_index.get(), p.dst = d_out.get();
  p.dst_dtype = DType::kBF16;
  p.num_rows = n, p.num_src_rows = num_src, p.dst_row_stride = stride;
  const absl::Status status = cuda::GatherFp8DsMlaRows(p, nullptr);
  ASSERT_TRUE(status.ok()) << status;
  const std::vector<bf16> out = d_out.Download();
  for (int i = 0; i < n; ++i) {
    const bool valid = index[i] >= 0 && index[i] < num_src;
    const std::vector<double> want =
        valid ? reference::DequantizeFp8DsMlaRow(cache.data() + size_t(index[i]) * kRow)
              : std::vector<double>(kWidth, 0.0);
    for (int c = 0; c < kWidth; ++c) {
      ASSERT_EQ(out[size_t(i) * stride + c].bits, reference::Bf16Nearest(float(want[c])))
          << "row " << i << " (index " << index[i] << ") col " << c;
    }
    ASSERT_EQ(out[size_t(i) * stride + kWidth].bits, 0xffff) << "padding written, row " << i;
  }
}

TEST_F(Fp8RowsCudaTest, BadInputIsAClearError) {
  DeviceArray<bf16> kv(kWidth * 2);
  DeviceArray<int32_t> slots(std::vector<int32_t>{0, 1});
  DeviceArray<uint8_t> cache(2 * 1152);
  Fp8DsMlaWriteParams p;
  p.kv_c = kv.get(), p.k_pe = kv.get() + kR, p.slot_mapping = slots.get(), p.cache = cache.get();
  p.dtype = DType::kBF16, p.num_rows = 2, p.num_slots = 2;
  p.kv_c_row_stride = kWidth, p.k_pe_row_stride = kWidth;
  p.cache_row_bytes = 1152;
  absl::Status status = cuda::WriteFp8DsMlaRows(p, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("656"), std::string::npos) << status.message();
  p.cache_row_bytes = 656;
  p.dtype = DType::kF32;
  status = cuda::WriteFp8DsMlaRows(p, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("BF16"), std::string::npos) << status.message();
  p.dtype = DType::kBF16;
  p.kv_c_row_stride = kWidth + 1;  // not a multiple of 8: no 16-byte rows
  status = cuda::WriteFp8DsMlaRows(p, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("16-byte"), std::string::npos) << status.message();

  Fp8DsMlaGatherParams g;
  g.cache = cache.get(), g.index = slots.get(), g.dst = kv.get(), g.dst_dtype = DType::kBF16;
  g.num_rows = 2, g.num_src_rows = 2, g.dst_row_stride = kWidth;
  g.cache_row_bytes = 576;
  status = cuda::GatherFp8DsMlaRows(g, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("656"), std::string::npos) << status.message();
  DCP_ASSERT_CUDA(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace dcp::testing
