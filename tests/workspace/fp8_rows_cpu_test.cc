// The fp8_ds_mla format as code (core/kv_cache_format.h) and the CPU cache write / gather
// (workspace/cpu/fp8_rows_cpu.h) against the independent host model of tests/reference:
// bit-exact rows for random tiles, all-zero tiles, negative zeros, float subnormals, huge
// values and wide dynamic ranges; the E4M3 encoder on values past 448 and on every rounding
// boundary; skipped slots; dequantized gathers; and the clear errors on bad input.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/kv_cache_format.h"
#include "tests/reference/fp8_ds_mla_reference.h"
#include "workspace/cpu/fp8_rows_cpu.h"

namespace dcp {
namespace {

constexpr int kR = 512, kDr = 64, kRow = 656, kWidth = 576;

uint64_t Seed() {
  std::random_device device;
  return (uint64_t{device()} << 32) | device();
}

std::string Hex(uint8_t byte) {
  char text[8];
  std::snprintf(text, sizeof(text), "0x%02x", byte);
  return text;
}

TEST(Fp8DsMlaFormatTest, LayoutConstants) {
  EXPECT_EQ(fp8_ds_mla::kRowBytes, 656);
  EXPECT_EQ(fp8_ds_mla::kScaleOffset, 512);
  EXPECT_EQ(fp8_ds_mla::kRopeOffset, 528);
  EXPECT_EQ(fp8_ds_mla::kRowWidth, 576);
  EXPECT_EQ(fp8_ds_mla::kNumTiles * fp8_ds_mla::kTileSize, 512);
}

TEST(Fp8DsMlaFormatTest, EncoderMatchesReferenceOnEveryBoundaryAndPast448) {
  std::vector<float> values = {0.0f, -0.0f, 448.0f, -448.0f, 448.5f, 449.0f, 463.9f, 464.0f,
                               465.0f, 480.0f, 1e6f, -1e30f, FLT_MAX,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(), FLT_MIN,
                               std::numeric_limits<float>::denorm_min(), -1e-40f};
  // Every code's value, the midpoints between neighbours (ties) and one float ulp either side.
  for (int code = 0; code <= 0x7e; ++code) {
    const double value = reference::E4m3Value(uint8_t(code));
    const double next = code < 0x7e ? reference::E4m3Value(uint8_t(code + 1)) : 464.0;
    for (double x : {value, 0.5 * (value + next)}) {
      const float f = static_cast<float>(x);
      for (float v : {f, std::nextafter(f, 0.0f), std::nextafter(f, 1e9f)}) {
        values.push_back(v);
        values.push_back(-v);
      }
    }
  }
  // And a sweep over float bit patterns.
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 65521) {
    float v;
    const uint32_t word = static_cast<uint32_t>(bits);
    std::memcpy(&v, &word, 4);
    if (!std::isnan(v)) values.push_back(v);
  }
  int mismatches = 0;
  for (float v : values) {
    const uint8_t got = fp8_ds_mla::FloatToE4m3(v), want = reference::E4m3Nearest(v);
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << "FloatToE4m3(" << v << ") = " << Hex(got) << ", reference " << Hex(want);
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << values.size() << " values";
  EXPECT_EQ(fp8_ds_mla::FloatToE4m3(-0.0f), 0x80);
  EXPECT_EQ(fp8_ds_mla::FloatToE4m3(1000.0f), 0x7e);
  EXPECT_EQ(fp8_ds_mla::FloatToE4m3(-1000.0f), 0xfe);
  EXPECT_EQ(fp8_ds_mla::FloatToE4m3(std::nanf("")) & 0x7f, 0x7f);
}

TEST(Fp8DsMlaFormatTest, DecoderMatchesReferenceOnEveryCode) {
  for (int code = 0; code < 256; ++code) {
    const float got = fp8_ds_mla::E4m3ToFloat(uint8_t(code));
    const double want = reference::E4m3Value(uint8_t(code));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << Hex(uint8_t(code));
    } else {
      EXPECT_EQ(double(got), want) << Hex(uint8_t(code));
      EXPECT_EQ(std::signbit(got), code >= 128) << Hex(uint8_t(code));
    }
  }
}

// Rows of kv_c / k_pe that exercise the format's corners, one kind per row.
std::vector<float> MakeRows(std::mt19937_64& rng, int num_rows, std::vector<float>* k_pe) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-40.0f, 40.0f);
  std::vector<float> kv(size_t(num_rows) * kR);
  k_pe->resize(size_t(num_rows) * kDr);
  for (int r = 0; r < num_rows; ++r) {
    float* x = kv.data() + size_t(r) * kR;
    const int kind = r % 8;
    for (int i = 0; i < kR; ++i) {
      const int tile = i / 128;
      float v = normal(rng);
      switch (kind) {
        case 0: break;                                                // plain random
        case 1: v = tile == 1 ? 0.0f : v; break;                      // one all-zero tile
        case 2: v = tile == 2 ? -0.0f : (i % 3 == 0 ? -0.0f : v); break;  // negative zeros
        case 3: v = v * 1e-39f; break;                                // float subnormals
        case 4: v = v * std::exp2(exponent(rng)); break;              // wide dynamic range
        case 5: v = v * 1e37f; break;                                 // huge values
        case 6: v = (i % 128 == 5) ? 3e38f : v; break;                // one near-FLT_MAX outlier
        case 7: v = std::round(v * 8.0f); break;                      // small integers: ties
      }
      x[i] = v;
    }
    for (int i = 0; i < kDr; ++i) (*k_pe)[size_t(r) * kDr + i] = normal(rng) * 3.0f;
  }
  return kv;
}

TEST(Fp8DsMlaRowsCpuTest, WriteIsBitExactWithTheReference) {
  const uint64_t seed = Seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int num_rows = 64, num_slots = 100;
  std::vector<float> k_pe;
  const std::vector<float> kv = MakeRows(rng, num_rows, &k_pe);
  // Distinct slots, some -1 and some out of range (skipped).
  std::vector<int32_t> slots(num_rows);
  for (int i = 0; i < num_rows; ++i) {
    slots[i] = i % 9 == 4 ? -1 : (i % 13 == 7 ? num_slots + i : (i * 37 + 11) % num_slots);
  }
  std::vector<uint8_t> cache(size_t(num_slots) * kRow, 0xab);
  Fp8DsMlaWriteParams p;
  p.kv_c = kv.data(), p.k_pe = k_pe.data(), p.slot_mapping = slots.data(), p.cache = cache.data();
  p.dtype = DType::kF32;
  p.num_rows = num_rows, p.num_slots = num_slots;
  p.kv_c_row_stride = kR, p.k_pe_row_stride = kDr;
  ASSERT_TRUE(cpu::WriteFp8DsMlaRows(p).ok());

  std::vector<bool> written(num_slots, false);
  for (int i = 0; i < num_rows; ++i) {
    if (slots[i] < 0 || slots[i] >= num_slots) continue;
    written[slots[i]] = true;
    const std::vector<uint8_t> want =
        reference::QuantizeFp8DsMlaRow(kv.data() + size_t(i) * kR, k_pe.data() + size_t(i) * kDr);
    const uint8_t* got = cache.data() + size_t(slots[i]) * kRow;
    for (int b = 0; b < kRow; ++b) {
      ASSERT_EQ(got[b], want[b]) << "row " << i << " (kind " << i % 8 << ") byte " << b;
    }
  }
  for (int s = 0; s < num_slots; ++s) {
    if (written[s]) continue;
    for (int b = 0; b < kRow; ++b) ASSERT_EQ(cache[size_t(s) * kRow + b], 0xab) << "slot " << s;
  }
  // Spot checks of the corners against the format's text.
  const int zero_tile_row = 1;  // kind 1: tile 1 all zero -> scale FLT_MIN, codes 0
  const uint8_t* row = cache.data() + size_t(slots[zero_tile_row]) * kRow;
  float scale;
  std::memcpy(&scale, row + 512 + 4, 4);
  EXPECT_EQ(scale, FLT_MIN);
  for (int i = 128; i < 256; ++i) EXPECT_EQ(row[i], 0) << i;
  const uint8_t* negative = cache.data() + size_t(slots[2]) * kRow;  // kind 2: tile 2 all -0
  for (int i = 256; i < 384; ++i) EXPECT_EQ(negative[i], 0x80) << i;
}

TEST(Fp8DsMlaRowsCpuTest, Bf16InputIsBitExactToo) {
  const uint64_t seed = Seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int num_rows = 16;
  std::vector<float> k_pe_f;
  std::vector<float> kv_f = MakeRows(rng, num_rows, &k_pe_f);
  std::vector<bf16> kv(kv_f.size()), k_pe(k_pe_f.size());
  for (size_t i = 0; i < kv.size(); ++i) {
    kv[i] = float_to_bf16(kv_f[i]);
    kv_f[i] = bf16_to_float(kv[i]);  // what the reference sees: the stored value
  }
  for (size_t i = 0; i < k_pe.size(); ++i) {
    k_pe[i] = float_to_bf16(k_pe_f[i]);
    k_pe_f[i] = bf16_to_float(k_pe[i]);
  }
  std::vector<int32_t> slots(num_rows);
  for (int i = 0; i < num_rows; ++i) slots[i] = num_rows - 1 - i;
  std::vector<uint8_t> cache(size_t(num_rows) * kRow, 0xab);
  Fp8DsMlaWriteParams p;
  p.kv_c = kv.data(), p.k_pe = k_pe.data(), p.slot_mapping = slots.data(), p.cache = cache.data();
  p.dtype = DType::kBF16;
  p.num_rows = p.num_slots = num_rows;
  p.kv_c_row_stride = kR, p.k_pe_row_stride = kDr;
  ASSERT_TRUE(cpu::WriteFp8DsMlaRows(p).ok());
  for (int i = 0; i < num_rows; ++i) {
    const std::vector<uint8_t> want = reference::QuantizeFp8DsMlaRow(
        kv_f.data() + size_t(i) * kR, k_pe_f.data() + size_t(i) * kDr);
    ASSERT_EQ(std::memcmp(want.data(), cache.data() + size_t(slots[i]) * kRow, kRow), 0)
        << "row " << i;
  }
}

TEST(Fp8DsMlaRowsCpuTest, GatherDequantizesLikeTheReference) {
  const uint64_t seed = Seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int num_src = 40, num_rows = 50;
  std::vector<float> k_pe;
  const std::vector<float> kv = MakeRows(rng, num_src, &k_pe);
  std::vector<uint8_t> cache;
  for (int r = 0; r < num_src; ++r) {
    const std::vector<uint8_t> row =
        reference::QuantizeFp8DsMlaRow(kv.data() + size_t(r) * kR, k_pe.data() + size_t(r) * kDr);
    cache.insert(cache.end(), row.begin(), row.end());
  }
  std::vector<int32_t> index(num_rows);
  std::uniform_int_distribution<int> pick(-3, num_src + 2);
  for (int32_t& i : index) i = pick(rng);
  index[0] = -1;
  index[1] = num_src;  // out of range: zero row
  const int64_t stride = kWidth + 8;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    std::vector<float> out_f(size_t(num_rows) * stride, std::nanf(""));
    std::vector<bf16> out_b(size_t(num_rows) * stride, bf16{0xffff});
    Fp8DsMlaGatherParams p;
    p.cache = cache.data(), p.index = index.data();
    p.dst = dtype == DType::kF32 ? static_cast<void*>(out_f.data()) : out_b.data();
    p.dst_dtype = dtype;
    p.num_rows = num_rows, p.num_src_rows = num_src, p.dst_row_stride = stride;
    ASSERT_TRUE(cpu::GatherFp8DsMlaRows(p).ok());
    for (int i = 0; i < num_rows; ++i) {
      const bool valid = index[i] >= 0 && index[i] < num_src;
      const std::vector<double> want =
          valid ? reference::DequantizeFp8DsMlaRow(cache.data() + size_t(index[i]) * kRow)
                : std::vector<double>(kWidth, 0.0);
      for (int c = 0; c < kWidth; ++c) {
        const size_t at = size_t(i) * stride + c;
        if (dtype == DType::kF32) {
          ASSERT_EQ(double(out_f[at]), want[c]) << "row " << i << " col " << c;
        } else {
          ASSERT_EQ(out_b[at].bits, reference::Bf16Nearest(float(want[c])))
              << "row " << i << " col " << c;
        }
      }
      // Padding columns untouched.
      if (dtype == DType::kF32) EXPECT_TRUE(std::isnan(out_f[size_t(i) * stride + kWidth]));
    }
  }
}

TEST(Fp8DsMlaRowsCpuTest, BadInputIsAClearError) {
  std::vector<float> kv(kR), k_pe(kDr);
  std::vector<int32_t> slots = {0};
  std::vector<uint8_t> cache(2 * 1152);
  Fp8DsMlaWriteParams p;
  p.kv_c = kv.data(), p.k_pe = k_pe.data(), p.slot_mapping = slots.data(), p.cache = cache.data();
  p.dtype = DType::kF32;
  p.num_rows = 1, p.num_slots = 1, p.kv_c_row_stride = kR, p.k_pe_row_stride = kDr;
  p.cache_row_bytes = 1152;  // a bf16 row stride
  absl::Status status = cpu::WriteFp8DsMlaRows(p);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("656"), std::string::npos) << status.message();
  p.cache_row_bytes = 656;
  p.dtype = DType::kI32;
  status = cpu::WriteFp8DsMlaRows(p);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("I32"), std::string::npos) << status.message();

  Fp8DsMlaGatherParams g;
  std::vector<float> out(kWidth);
  g.cache = cache.data(), g.index = slots.data(), g.dst = out.data();
  g.dst_dtype = DType::kF32, g.num_rows = 1, g.num_src_rows = 1;
  g.cache_row_bytes = 640;
  status = cpu::GatherFp8DsMlaRows(g);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("656"), std::string::npos) << status.message();

  KvCacheDType parsed;
  EXPECT_TRUE(ParseKvCacheDType("fp8_ds_mla", &parsed).ok());
  EXPECT_EQ(parsed, KvCacheDType::kFp8DsMla);
  EXPECT_FALSE(ParseKvCacheDType("fp8", &parsed).ok());
  status = CheckKvCacheDTypeSupported(static_cast<KvCacheDType>(7), "test");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("not supported by this build"), std::string::npos);
}

}  // namespace
}  // namespace dcp
