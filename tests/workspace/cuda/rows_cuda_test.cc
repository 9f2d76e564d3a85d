// Row gather/scatter on the GPU (workspace/cuda/rows_cuda.h) against host loops: bf16 rows of
// the cache width (16-byte units), odd widths and strides (narrower units), -1 and out-of-range
// indices (zero rows / skipped), empty calls, and a large paged gather.
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/gpu_test_util.h"
#include "workspace/cpu/rows_cpu.h"
#include "workspace/cuda/rows_cuda.h"

namespace dcp::testing {
namespace {

class RowsCudaTest : public GpuTest {};

struct Layout {
  DType dtype;
  int width;
  int64_t src_stride, dst_stride;
};

TEST_F(RowsCudaTest, GatherAndScatterMatchHostLoops) {
  std::mt19937_64 rng(TestSeed());
  for (const Layout& l : {Layout{DType::kBF16, 576, 576, 576}, Layout{DType::kBF16, 576, 584, 600},
                          Layout{DType::kF32, 7, 9, 7}, Layout{DType::kBF16, 3, 5, 3},
                          Layout{DType::kF32, 512, 512, 520}}) {
    const size_t element = dtype_size(l.dtype);
    const int64_t src_rows = 333, rows = 200;
    std::vector<uint8_t> src(size_t(src_rows * l.src_stride) * element);
    for (auto& b : src) b = uint8_t(rng());
    std::vector<int32_t> index(rows);
    std::uniform_int_distribution<int> pick(-3, int(src_rows) + 3);  // some -1 / out of range
    for (auto& i : index) i = pick(rng);
    DeviceArray<uint8_t> d_src(src), d_dst(size_t(rows * l.dst_stride) * element);
    DeviceArray<int32_t> d_index(index);
    d_dst.Poison();
    GatherRowsParams g{d_src.get(), d_index.get(), d_dst.get(), l.dtype, rows, src_rows,
                       l.width, l.src_stride, l.dst_stride};
    ASSERT_TRUE(cuda::GatherRows(g, nullptr).ok());
    const auto dst = d_dst.Download();
    const size_t row_bytes = size_t(l.width) * element;
    for (int64_t i = 0; i < rows; ++i) {
      const uint8_t* got = &dst[size_t(i * l.dst_stride) * element];
      if (index[i] < 0 || index[i] >= src_rows) {
        for (size_t b = 0; b < row_bytes; ++b) ASSERT_EQ(got[b], 0) << "row " << i;
      } else {
        ASSERT_EQ(0, std::memcmp(got, &src[size_t(index[i] * l.src_stride) * element], row_bytes))
            << "row " << i << " width " << l.width;
      }
      // Padding between rows untouched (still poison).
      for (size_t b = row_bytes; b < size_t(l.dst_stride) * element && i + 1 < rows; ++b) {
        ASSERT_EQ(got[b], 0xFF);
      }
    }

    // Scatter: distinct destinations (a permutation), some skipped.
    const int64_t dst_rows = 260;
    std::vector<int32_t> targets(dst_rows);
    for (int64_t i = 0; i < dst_rows; ++i) targets[i] = int32_t(i);
    std::shuffle(targets.begin(), targets.end(), rng);
    std::vector<int32_t> scatter_index(rows);
    for (int64_t i = 0; i < rows; ++i) scatter_index[i] = (i % 7 == 3) ? -1 : targets[i];
    scatter_index[5] = int32_t(dst_rows + 10);  // out of range: skipped
    std::vector<uint8_t> rows_in(size_t(rows * l.src_stride) * element);
    for (auto& b : rows_in) b = uint8_t(rng());
    DeviceArray<uint8_t> d_rows(rows_in), d_cache(size_t(dst_rows * l.dst_stride) * element);
    DeviceArray<int32_t> d_scatter(scatter_index);
    d_cache.Poison();
    ScatterRowsParams s{d_rows.get(), d_scatter.get(), d_cache.get(), l.dtype, rows, dst_rows,
                        l.width, l.src_stride, l.dst_stride};
    ASSERT_TRUE(cuda::ScatterRows(s, nullptr).ok());
    auto want = std::vector<uint8_t>(size_t(dst_rows * l.dst_stride) * element, 0xFF);
    for (int64_t i = 0; i < rows; ++i) {
      const int32_t to = scatter_index[i];
      if (to < 0 || to >= dst_rows) continue;
      std::memcpy(&want[size_t(to * l.dst_stride) * element],
                  &rows_in[size_t(i * l.src_stride) * element], row_bytes);
    }
    ASSERT_EQ(want, d_cache.Download()) << "scatter, width " << l.width;
  }
}

TEST_F(RowsCudaTest, EmptyCallsAndBadStrides) {
  EXPECT_TRUE(cuda::GatherRows(GatherRowsParams{}, nullptr).ok());
  EXPECT_TRUE(cuda::ScatterRows(ScatterRowsParams{}, nullptr).ok());
  GatherRowsParams g;
  g.num_rows = 1;
  g.width = 8;
  g.src_row_stride = 4;
  g.dst_row_stride = 8;
  int dummy = 0;
  g.src = g.dst = &dummy;
  g.index = &dummy;
  EXPECT_EQ(cuda::GatherRows(g, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RowsCudaTest, LargePagedGather) {
  std::mt19937_64 rng(TestSeed());
  const int width = 576;
  const int64_t cache_rows = 1 << 18, rows = 1 << 17;  // 300 MB cache, 150 MB gathered
  std::vector<bf16> cache(size_t(cache_rows) * width);
  for (size_t i = 0; i < cache.size(); ++i) cache[i].bits = uint16_t(rng());
  std::vector<int32_t> index(rows);
  std::uniform_int_distribution<int32_t> pick(0, int32_t(cache_rows - 1));
  for (auto& i : index) i = pick(rng);
  DeviceArray<bf16> d_cache(cache), d_out(size_t(rows) * width);
  DeviceArray<int32_t> d_index(index);
  d_out.Poison();
  ASSERT_TRUE(cuda::GatherRows({d_cache.get(), d_index.get(), d_out.get(), DType::kBF16, rows,
                                cache_rows, width, width, width},
                               nullptr)
                  .ok());
  const auto out = d_out.Download();
  for (int64_t i = 0; i < rows; ++i) {
    ASSERT_EQ(0, std::memcmp(&out[size_t(i) * width], &cache[size_t(index[i]) * width],
                             width * sizeof(bf16)))
        << "row " << i;
  }
}

// CopyRows (several strided copies, source rows repeated, one launch) against a host model
// written here element by element: the dense route's own use (q = [q_rope | q_nope] and k_pe
// broadcast to the heads, bf16: 16-byte units), odd widths / strides / repeats (narrow units),
// a repeat that does not divide the rows, empty copies; the CPU implementation the same.
struct CopySpec {
  int64_t rows;
  int width;
  int64_t src_stride, dst_stride;
  int repeat;
  int64_t dst_offset;  // elements into the shared destination
};

void CheckCopyRows(DType dtype, const std::vector<CopySpec>& specs, int64_t dst_elements,
                   std::mt19937_64& rng) {
  const size_t element = dtype_size(dtype);
  std::vector<std::vector<uint8_t>> sources;
  std::vector<DeviceArray<uint8_t>> d_sources;
  for (const CopySpec& c : specs) {
    const int64_t src_rows = c.rows == 0 ? 0 : (c.rows - 1) / c.repeat + 1;
    std::vector<uint8_t> src(size_t(std::max<int64_t>(src_rows * c.src_stride, 1)) * element);
    for (auto& b : src) b = uint8_t(rng());
    sources.push_back(src);
    d_sources.emplace_back(src);
  }
  // Host model: poison, then every destination element from its source element.
  std::vector<uint8_t> want(size_t(dst_elements) * element, 0xFF);
  for (size_t k = 0; k < specs.size(); ++k) {
    const CopySpec& c = specs[k];
    for (int64_t r = 0; r < c.rows; ++r) {
      const int64_t source_row = r / c.repeat;
      for (int e = 0; e < c.width; ++e) {
        const size_t to = size_t(c.dst_offset + r * c.dst_stride + e) * element;
        const size_t from = size_t(source_row * c.src_stride + e) * element;
        for (size_t b = 0; b < element; ++b) want[to + b] = sources[k][from + b];
      }
    }
  }
  DeviceArray<uint8_t> d_dst(want.size());
  d_dst.Poison();
  CopyRowsParams p;
  p.dtype = dtype;
  std::vector<uint8_t> host_dst(want.size(), 0xFF);
  CopyRowsParams host = p;
  for (size_t k = 0; k < specs.size(); ++k) {
    const CopySpec& c = specs[k];
    RowCopy copy;
    copy.src = d_sources[k].get();
    copy.dst = d_dst.get() + c.dst_offset * element;
    copy.rows = c.rows;
    copy.width = c.width;
    copy.src_row_stride = c.src_stride;
    copy.dst_row_stride = c.dst_stride;
    copy.src_row_repeat = c.repeat;
    p.copies[p.num_copies++] = copy;
    copy.src = sources[k].data();
    copy.dst = host_dst.data() + c.dst_offset * element;
    host.copies[host.num_copies++] = copy;
  }
  ASSERT_TRUE(cuda::CopyRows(p, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = d_dst.Download();
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << "byte " << i << " (element " << i / element << ")";
  }
  ASSERT_TRUE(cpu::CopyRows(host).ok());
  ASSERT_EQ(host_dst, want) << "CPU";
}

TEST_F(RowsCudaTest, CopyRowsMatchesHostModel) {
  std::mt19937_64 rng(TestSeed());
  // The dense route at small size: 37 tokens x 3 heads; q [T, H, 64 + 128] from q_rope and
  // q_nope, then kv [T, H, 64 + 128 + 128] takes k_pe (latent row [512 | 64]) per head.
  const int64_t t = 37, h = 3;
  const int64_t q_elements = t * h * 192;
  const int64_t kv_elements = t * h * 320;
  CheckCopyRows(DType::kBF16,
                {{t * h, 64, 64, 192, 1, 0},
                 {t * h, 128, 128, 192, 1, 64},
                 {t * h, 64, 576, 320, int(h), q_elements}},
                q_elements + kv_elements, rng);
  // Odd sizes: narrow units, a repeat that leaves a partial last group, an empty copy.
  CheckCopyRows(DType::kF32, {{50, 3, 5, 7, 4, 0}, {0, 9, 9, 9, 1, 400}, {9, 1, 1, 2, 1, 351}},
                400, rng);
  CheckCopyRows(DType::kBF16, {{17, 5, 5, 13, 3, 1}, {1, 7, 7, 7, 1000, 300}}, 320, rng);
  // One large copy (many units per thread of the grid-stride loop).
  CheckCopyRows(DType::kBF16, {{4096 * 16, 64, 576, 320, 16, 0}}, 4096 * 16 * 320, rng);
}

TEST_F(RowsCudaTest, CopyRowsRejectsBadArguments) {
  EXPECT_TRUE(cuda::CopyRows(CopyRowsParams{}, nullptr).ok());
  int dummy[16] = {};
  CopyRowsParams p;
  p.dtype = DType::kF32;
  p.num_copies = 1;
  p.copies[0] = {dummy, dummy + 8, 1, 4, 4, 4, 1};  // host pointers: never launched
  p.copies[0].src_row_stride = 3;                   // < width
  EXPECT_EQ(cuda::CopyRows(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu::CopyRows(p).code(), absl::StatusCode::kInvalidArgument);
  p.copies[0].src_row_stride = 4;
  p.copies[0].src_row_repeat = 0;
  EXPECT_EQ(cuda::CopyRows(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.copies[0].src_row_repeat = 1;
  p.copies[0].src = nullptr;
  EXPECT_EQ(cpu::CopyRows(p).code(), absl::StatusCode::kInvalidArgument);
  p.num_copies = CopyRowsParams::kMaxCopies + 1;
  EXPECT_EQ(cuda::CopyRows(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dcp::testing
