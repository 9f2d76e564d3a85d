// The workspace formula against values computed by hand from DESIGN.md section 6.
#include "workspace/workspace_size.h"

#include "gtest/gtest.h"

namespace dcp {
namespace {

struct Case {
  int64_t b, n, m, k, w, i;
  int64_t expected_s, expected_total;
  const char* why;
};

TEST(WorkspaceSizeTest, HandComputedValues) {
  const Case cases[] = {
      // 8M = 32768 beats 4NB = 16384; below both caps; W = 1 has no local region.
      {64, 64, 4096, 2048, 1, 1, 32768, 32768, "8*M wins, W=1"},
      // 8M = 131072 is capped at 65536; lcm(64, 8) = 64 keeps it; 65536 + 65536/8.
      {64, 64, 16384, 2048, 8, 1, 65536, 73728, "65536 cap, W=8"},
      // N*K = 1024 caps 32768; lcm(64, 3) = 192 rounds 1024 up to 1152; + 1152/3.
      {64, 2, 4096, 512, 3, 1, 1152, 1536, "N*K cap, W=3 alignment"},
      // N*K = 64 is below the floor N*B = 256; lcm(64, 2*64) = 128 keeps 256; + 128.
      {64, 4, 100, 16, 2, 64, 256, 384, "N*B floor, I=B"},
      // 8M = 80; lcm(16, 3*16) = 48 rounds 80 up to 96; + 32.
      {16, 1, 10, 2048, 3, 16, 96, 128, "interleave alignment"},
      // The seed's test shapes: B 64, N 2, M 1024, K 512: min(8192, 65536, 1024) = 1024.
      {64, 2, 1024, 512, 4, 1, 1024, 1280, "seed shapes, W=4"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.why);
    auto size = ComputeWorkspaceSize({c.b, c.n, c.m, c.k, c.w, c.i, 576});
    ASSERT_TRUE(size.ok()) << size.status();
    EXPECT_EQ(size->rows_per_chunk, c.expected_s);
    EXPECT_EQ(size->total_rows, c.expected_total);
    EXPECT_EQ(size->local_rows * c.w, c.expected_s);
    EXPECT_EQ(size->row_width, 576);
  }
}

TEST(WorkspaceSizeTest, RejectsNonPositiveInputs) {
  auto size = ComputeWorkspaceSize({0, 1, 1, 1, 1, 1, 576});
  EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(size.status().message().find("B 0"), std::string::npos) << size.status();
}

}  // namespace
}  // namespace dcp
