#include "launch/batch_spec.h"

#include "gtest/gtest.h"

namespace dcp::launch {
namespace {

using Requests = std::vector<RequestShape>;

TEST(BatchSpecTest, TheFormatsExamples) {
  EXPECT_EQ(*ParseBatchSpec("q2k"), (Requests{{2048, 2048}}));
  EXPECT_EQ(*ParseBatchSpec("8q1s1k"), Requests(8, RequestShape{1024, 1}));
  EXPECT_EQ(*ParseBatchSpec("16q64s128"), Requests(16, RequestShape{128, 64}));
}

TEST(BatchSpecTest, MixedTermsKeepTheirOrder) {
  EXPECT_EQ(*ParseBatchSpec("q4,2q1s10, q3s5"), (Requests{{4, 4}, {10, 1}, {10, 1}, {5, 3}}));
  // vLLM's '_' separator.
  EXPECT_EQ(*ParseBatchSpec("2q1k_q1s2k"), (Requests{{1024, 1024}, {1024, 1024}, {2048, 1}}));
}

TEST(BatchSpecTest, KiloSuffixOnEveryNumber) {
  EXPECT_EQ(*ParseBatchSpec("q1ks4k"), (Requests{{4096, 1024}}));
  EXPECT_EQ(ParseBatchSpec("1kq1")->size(), 1024u);
}

TEST(BatchSpecTest, RejectsMalformedTerms) {
  for (const char* bad : {"", " ", "q", "x2k", "8", "q0", "0q1", "q2s1", "q4s", "q4t5", "q4,",
                          ",q4", "q4,,q5", "8q1s1kk", "Q4", "q-1", "q99999999999"}) {
    absl::StatusOr<Requests> parsed = ParseBatchSpec(bad);
    EXPECT_FALSE(parsed.ok()) << "'" << bad << "' parsed";
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(BatchSpecTest, ErrorsNameTheTermAndTheGrammar) {
  absl::Status status = ParseBatchSpec("q4,q2s1").status();
  EXPECT_NE(status.message().find("'q2s1'"), std::string::npos) << status;
  EXPECT_NE(status.message().find("sequence length must be >= query length"), std::string::npos)
      << status;
  status = ParseBatchSpec("zz").status();
  EXPECT_NE(status.message().find("[count]q<qlen>[s<seqlen>]"), std::string::npos) << status;
}

TEST(BatchSpecTest, DescribeCountsDecodesByThreshold) {
  const Requests requests = *ParseBatchSpec("2q1s10,q4s8,q16");
  EXPECT_EQ(DescribeBatch(requests, 1),
            "4 requests (2 decode, 2 prefill), 22 tokens, max seq_len 16");
  EXPECT_EQ(DescribeBatch(requests, 4),
            "4 requests (3 decode, 1 prefill), 22 tokens, max seq_len 16");
}

}  // namespace
}  // namespace dcp::launch
