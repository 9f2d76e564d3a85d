// The top-k check on the GPU (attention/cuda/topk_validate.h) against the host check
// ValidateTopkPositions: the same verdict and the same message (both come from
// TopkErrorStatus), on random valid rows, on each kind of bad row, with positions large enough
// to leave the shared-memory bitmap for the pairwise fallback, and with nothing to check.
#include "attention/cuda/topk_validate.h"

#include <algorithm>
#include <climits>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "attention/topk_validation.h"
#include "gtest/gtest.h"
#include "tests/common/gpu_test_util.h"

namespace dcp::testing {
namespace {

// A batch of rows to check: positions, the top-k in rows of `stride` (the tail of each row
// past `width` holds garbage that must not be read as part of it).
struct Rows {
  int width = 0;
  int64_t stride = 0;
  int max_positions = 0;
  std::vector<int32_t> position, topk;
  int tokens() const { return static_cast<int>(position.size()); }
};

// Valid rows: each a random number of distinct positions in [0, position], -1 elsewhere.
Rows RandomValidRows(std::mt19937_64& rng, int tokens, int width, int64_t stride,
                     int max_positions) {
  Rows rows;
  rows.width = width;
  rows.stride = stride;
  rows.max_positions = max_positions;
  std::uniform_int_distribution<int> any_position(0, max_positions - 1);
  for (int t = 0; t < tokens; ++t) {
    const int position = any_position(rng);
    rows.position.push_back(position);
    const int count = std::uniform_int_distribution<int>(0, std::min(width, position + 1))(rng);
    std::vector<int32_t> row(stride, INT_MIN);  // the tail past width: never part of the row
    std::fill(row.begin(), row.begin() + width, -1);
    // Distinct values: a partial shuffle when the range is small, else draws until new.
    std::vector<int32_t> chosen;
    if (position + 1 <= 4 * width) {
      std::vector<int32_t> all(position + 1);
      for (int j = 0; j <= position; ++j) all[j] = j;
      std::shuffle(all.begin(), all.end(), rng);
      chosen.assign(all.begin(), all.begin() + count);
    } else {
      std::uniform_int_distribution<int> key(0, position);
      std::unordered_set<int32_t> seen;
      while (static_cast<int>(chosen.size()) < count) {
        const int32_t value = key(rng);
        if (seen.insert(value).second) chosen.push_back(value);
      }
    }
    std::copy(chosen.begin(), chosen.end(), row.begin());
    std::shuffle(row.begin(), row.begin() + width, rng);
    rows.topk.insert(rows.topk.end(), row.begin(), row.end());
  }
  return rows;
}

absl::Status CheckOnHost(const Rows& rows, int first_token) {
  TopkValidateParams p;
  p.topk = rows.topk.data();
  p.token_position = rows.position.data();
  p.num_tokens = rows.tokens();
  p.topk_width = rows.width;
  p.topk_token_stride = rows.stride;
  p.max_positions = rows.max_positions;
  p.first_token = first_token;
  return ValidateTopkPositions(p);
}

absl::Status CheckOnGpu(const Rows& rows, int first_token) {
  DeviceArray<int32_t> topk(rows.topk), position(rows.position);
  DeviceArray<char> record(sizeof(cuda::TopkValidateRecord));
  TopkValidateParams p;
  p.topk = topk.get();
  p.token_position = position.get();
  p.num_tokens = rows.tokens();
  p.topk_width = rows.width;
  p.topk_token_stride = rows.stride;
  p.max_positions = rows.max_positions;
  p.first_token = first_token;
  return cuda::ValidateTopk(p, reinterpret_cast<cuda::TopkValidateRecord*>(record.get()), nullptr);
}

// The GPU says what the host says, to the letter.
void ExpectSameVerdict(const Rows& rows, int first_token = 0) {
  const absl::Status host = CheckOnHost(rows, first_token);
  const absl::Status gpu = CheckOnGpu(rows, first_token);
  EXPECT_EQ(gpu.code(), host.code()) << "gpu: " << gpu << "\nhost: " << host;
  EXPECT_EQ(gpu.message(), host.message());
}

class TopkValidateCudaTest : public GpuTest {};

TEST_F(TopkValidateCudaTest, AcceptsValidRows) {
  std::mt19937_64 rng(TestSeed());
  struct Case {
    int tokens, width;
    int64_t stride;
    int max_positions;
  };
  for (const Case& c : std::vector<Case>{{1, 1, 1, 1},
                                         {5, 7, 7, 20},
                                         {37, 300, 301, 500},
                                         {64, 2048, 2048, 4096},
                                         {300, 64, 80, 131072},    // 16 KB bitmap
                                         {40, 256, 256, 1 << 20},  // pairwise fallback
                                         {17, 33, 40, 1 << 22},
                                         {9, 2049, 2050, 5000},    // past the held columns
                                         {6, 4096, 4100, 9000}}) {
    SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << " width " << c.width
                                      << " max_positions " << c.max_positions);
    const Rows rows = RandomValidRows(rng, c.tokens, c.width, c.stride, c.max_positions);
    ASSERT_TRUE(CheckOnHost(rows, 0).ok());
    ExpectSameVerdict(rows, 3);
  }
}

TEST_F(TopkValidateCudaTest, ReportsTheFirstBadEntryOfEachKind) {
  std::mt19937_64 rng(TestSeed());
  // Bitmap, then the pairwise fallback; rows held in registers (96, 2048 wide) and walked in a
  // loop (2500).
  for (const int max_positions : {3000, 1 << 20}) {
    for (int kind = 0; kind < 5; ++kind) {
      for (int trial = 0; trial < 6; ++trial) {
        const int width = trial < 2 ? 96 : trial < 4 ? 2048 : 2500;
        SCOPED_TRACE(::testing::Message() << "max_positions " << max_positions << " kind " << kind
                                          << " trial " << trial << " width " << width);
        Rows rows = RandomValidRows(rng, 50, width, width + 4, max_positions);
        // 1 to 3 bad rows, so the lowest one must win whatever the CTA order.
        const int bad_rows = std::uniform_int_distribution<int>(1, 3)(rng);
        for (int b = 0; b < bad_rows; ++b) {
          const int t = std::uniform_int_distribution<int>(0, rows.tokens() - 1)(rng);
          const int column = std::uniform_int_distribution<int>(1, rows.width - 1)(rng);
          int32_t* row = rows.topk.data() + t * rows.stride;
          const int position = rows.position[t];
          switch (kind) {
            case 0:
              row[column] = trial % 2 ? INT_MIN : -2;
              break;
            case 1:
              row[column] = trial % 2 ? INT_MAX : position + 1;
              break;
            case 2: {  // a repeat: the value of an earlier column (made valid first)
              const int earlier = std::uniform_int_distribution<int>(0, column - 1)(rng);
              if (row[earlier] == -1) {
                row[earlier] = std::uniform_int_distribution<int>(0, position)(rng);
                for (int c = 0; c < rows.width; ++c) {  // keep it the only earlier copy
                  if (c != earlier && row[c] == row[earlier]) row[c] = -1;
                }
              }
              row[column] = row[earlier];
              break;
            }
            case 3:
              rows.position[t] = trial % 2 ? INT_MIN : -1;
              break;
            case 4:
              rows.position[t] = max_positions + (trial % 2 ? 0 : 5);
              break;
          }
        }
        ASSERT_FALSE(CheckOnHost(rows, 0).ok());
        ExpectSameVerdict(rows, 1000);
      }
    }
  }
}

TEST_F(TopkValidateCudaTest, RepeatsReportTheirFirstTwoColumns) {
  // Token 0 at position 10: 5 at columns 1, 4 and 6; 7 at columns 2 and 3. The first repeat is
  // 7 (columns 2 and 3), found before the later 5s.
  Rows rows;
  rows.width = 8;
  rows.stride = 8;
  rows.max_positions = 11;
  rows.position = {10};
  rows.topk = {0, 5, 7, 7, 5, -1, 5, 1};
  ExpectSameVerdict(rows);
  const absl::Status gpu = CheckOnGpu(rows, 0);
  EXPECT_NE(std::string(gpu.message()).find("index 7 of token 0 is repeated (columns 2 and 3)"),
            std::string::npos)
      << gpu;
  // A range error left of every repeat wins.
  rows.topk[1] = 11;
  EXPECT_NE(std::string(CheckOnGpu(rows, 0).message()).find("index 11 of token 0 (column 1)"),
            std::string::npos);
}

TEST_F(TopkValidateCudaTest, NothingToCheck) {
  cuda::TopkValidateRecord* none = nullptr;
  TopkValidateParams p;  // T = 0: no pointer is touched, not even the record
  EXPECT_TRUE(cuda::ValidateTopk(p, none, nullptr).ok());
  p.topk_width = 2048;
  EXPECT_TRUE(cuda::ValidateTopk(p, none, nullptr).ok());
  // Width 0: only the positions are checked.
  Rows rows;
  rows.max_positions = 4;
  rows.position = {0, 3};
  ExpectSameVerdict(rows);
  rows.position = {0, 4};
  ExpectSameVerdict(rows);
  EXPECT_FALSE(CheckOnGpu(rows, 0).ok());
}

TEST_F(TopkValidateCudaTest, RejectsBadParams) {
  DeviceArray<int32_t> position(std::vector<int32_t>{0});
  DeviceArray<char> record(sizeof(cuda::TopkValidateRecord));
  auto* r = reinterpret_cast<cuda::TopkValidateRecord*>(record.get());
  TopkValidateParams p;
  p.token_position = position.get();
  p.num_tokens = 1;
  p.topk_width = 4;
  p.topk_token_stride = 4;
  p.max_positions = 1;
  EXPECT_EQ(cuda::ValidateTopk(p, r, nullptr).code(), absl::StatusCode::kInvalidArgument);  // topk
  DeviceArray<int32_t> topk(std::vector<int32_t>{0, -1, -1, -1});
  p.topk = topk.get();
  EXPECT_TRUE(cuda::ValidateTopk(p, r, nullptr).ok());
  EXPECT_EQ(cuda::ValidateTopk(p, nullptr, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.topk_token_stride = 3;
  EXPECT_EQ(cuda::ValidateTopk(p, r, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.topk_token_stride = 4;
  p.max_positions = 0;
  EXPECT_EQ(cuda::ValidateTopk(p, r, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// Many rows per CTA (grid-stride), the DeepSeek-V3.2 width, and an error in the very last row.
TEST_F(TopkValidateCudaTest, FillsTheChip) {
  std::mt19937_64 rng(TestSeed());
  Rows rows = RandomValidRows(rng, 8192, 2048, 2048, 16384);
  ExpectSameVerdict(rows);
  const int last = rows.tokens() - 1;
  rows.topk[int64_t(last) * rows.stride + 2047] = rows.position[last] + 1;
  ExpectSameVerdict(rows);
}

}  // namespace
}  // namespace dcp::testing
