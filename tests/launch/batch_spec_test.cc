#include "launch/batch_spec.h"

#include "gtest/gtest.h"

namespace dcp::launch {
namespace {

using Requests = std::vector<RequestShape>;

TEST(BatchSpecTest, TheFormatsExamples) {
  EXPECT_EQ(*ParseBatchSpec("q2k"), (Requests{{2048, 2048}}));
  EXPECT_EQ(*ParseBatchSpec("8q1kv1k"), Requests(8, RequestShape{1024, 1}));
  EXPECT_EQ(*ParseBatchSpec("16q64kv128"), Requests(16, RequestShape{128, 64}));
  Requests mixed = Requests(2, RequestShape{2048, 2048});
  mixed.insert(mixed.end(), 32, RequestShape{1024, 1});
  EXPECT_EQ(*ParseBatchSpec("2q2k_32q1kv1k"), mixed);
  EXPECT_EQ(*SplitBatchList("q2k,8q1kv1k"), (std::vector<std::string>{"q2k", "8q1kv1k"}));
}

TEST(BatchSpecTest, SIsTheOlderSpellingOfKv) {
  EXPECT_EQ(*ParseBatchSpec("8q1s1k"), *ParseBatchSpec("8q1kv1k"));
  EXPECT_EQ(*ParseBatchSpec("16q64s128"), *ParseBatchSpec("16q64kv128"));
}

TEST(BatchSpecTest, MixedTermsKeepTheirOrder) {
  EXPECT_EQ(*ParseBatchSpec("q4_2q1kv10_q3s5"), (Requests{{4, 4}, {10, 1}, {10, 1}, {5, 3}}));
  EXPECT_EQ(*ParseBatchSpec("2q1k_q1kv2k"), (Requests{{1024, 1024}, {1024, 1024}, {2048, 1}}));
}

TEST(BatchSpecTest, CommaSeparatesBatches) {
  EXPECT_EQ(*SplitBatchList("q4_2q1kv10,q8"), (std::vector<std::string>{"q4_2q1kv10", "q8"}));
  // One batch spec holds no ',': ParseBatchSpec says where the batches split.
  absl::Status status = ParseBatchSpec("q4,q8").status();
  EXPECT_NE(status.message().find("several batches"), std::string::npos) << status;
  for (const char* bad : {"", ",", "q4,", ",q4", "q4,,q8", "q4,x"}) {
    EXPECT_FALSE(SplitBatchList(bad).ok()) << "'" << bad << "' split";
  }
}

TEST(BatchSpecTest, TheOldSemicolonFormIsRefusedWithTheNewSpelling) {
  for (const auto& [old_form, new_form] : std::vector<std::pair<std::string, std::string>>{
           {"q512,4q1s600;4q1s3k", "'q512_4q1s600,4q1s3k'"},
           {"q8;2q1s9", "'q8,2q1s9'"},
           {"q64;\tq32", "'q64,q32'"}}) {  // the spelling holds no whitespace either
    absl::Status status = SplitBatchList(old_form).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << old_form;
    EXPECT_NE(status.message().find("old form"), std::string::npos) << status;
    EXPECT_NE(status.message().find("write " + new_form), std::string::npos) << status;
    EXPECT_FALSE(ParseBatchSpec(old_form).ok()) << old_form;
  }
}

TEST(BatchSpecTest, KiloSuffixOnEveryNumber) {
  EXPECT_EQ(*ParseBatchSpec("q1ks4k"), (Requests{{4096, 1024}}));
  EXPECT_EQ(*ParseBatchSpec("q1kkv4k"), (Requests{{4096, 1024}}));
  EXPECT_EQ(*ParseBatchSpec("q1kv4k"), (Requests{{4096, 1}}));  // `kv` is no suffix
}

// vLLM's grammar puts `k` after a length only: `1kq1` is no count of 1024.
TEST(BatchSpecTest, ACountTakesNoKiloSuffix) {
  for (const char* bad : {"1kq1", "2kq1kv4k", "q4_8kq1"}) {
    const absl::Status status = ParseBatchSpec(bad).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("a count takes no 'k'"), std::string::npos) << status;
  }
  EXPECT_EQ(ParseBatchSpec("1024q1")->size(), 1024u);
}

// The grammar has no whitespace; a spec or list with some is refused, spelled without it.
TEST(BatchSpecTest, WhitespaceIsRefusedWithTheSpellingWithout) {
  for (const auto& [text, compact] : std::vector<std::pair<std::string, std::string>>{
           {"q4_ q3s5", "q4_q3s5"}, {" q2k", "q2k"}, {"q2k\t", "q2k"}, {"8q1kv1k ", "8q1kv1k"}}) {
    const absl::Status status = ParseBatchSpec(text).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(status.message().find("holds whitespace"), std::string::npos) << status;
    EXPECT_NE(status.message().find("write '" + compact + "'"), std::string::npos) << status;
  }
  const absl::Status status = SplitBatchList("q2k, 8q1kv1k").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("write 'q2k,8q1kv1k'"), std::string::npos) << status;
}

TEST(BatchSpecTest, RejectsMalformedTerms) {
  for (const char* bad : {"", " ", "q", "x2k", "8", "q0", "0q1", "q2s1", "q4s", "q4t5", "q4_",
                          "_q4", "q4__q5", "8q1s1kk", "Q4", "q-1", "q99999999999", "q4kv",
                          "q4k1", "q4v5", "q2kv1", "q4kvkv5", "q4_q8;q2"}) {
    absl::StatusOr<Requests> parsed = ParseBatchSpec(bad);
    EXPECT_FALSE(parsed.ok()) << "'" << bad << "' parsed";
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(BatchSpecTest, ErrorsNameTheTermAndTheGrammar) {
  absl::Status status = ParseBatchSpec("q4_q2kv1").status();
  EXPECT_NE(status.message().find("'q2kv1'"), std::string::npos) << status;
  EXPECT_NE(status.message().find("sequence length must be >= query length"), std::string::npos)
      << status;
  status = ParseBatchSpec("zz").status();
  EXPECT_NE(status.message().find("[count]q<qlen>[kv<kvlen>]"), std::string::npos) << status;
}

TEST(BatchSpecTest, DescribeCountsDecodesByThreshold) {
  const Requests requests = *ParseBatchSpec("2q1kv10_q4kv8_q16");
  EXPECT_EQ(DescribeBatch(requests, 1),
            "4 requests (2 decode, 2 prefill), 22 tokens, max seq_len 16");
  EXPECT_EQ(DescribeBatch(requests, 4),
            "4 requests (3 decode, 1 prefill), 22 tokens, max seq_len 16");
}

}  // namespace
}  // namespace dcp::launch
