// Row gather/scatter on the GPU (workspace/cuda/rows_cuda.h) against host loops: bf16 rows of
// the cache width (16-byte units), odd widths and strides (narrower units), -1 and out-of-range
// indices (zero rows / skipped), empty calls, and a large paged gather.
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/gpu_test_util.h"
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

}  // namespace
}  // namespace dcp::testing
