#include "launch/problem.h"

#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "launch/limits.h"

namespace dcp::launch {
namespace {

// H 4, R 8, Dn 4, Dr 2, Dv 3; requests (seq 5, query 2) and (seq 3, query 1).
constexpr int kH = 4, kR = 8, kDn = 4, kDr = 2, kDv = 3;
const std::vector<int32_t> kSeqLens = {5, 3}, kQueryLens = {2, 1};
constexpr int64_t kTokens = 3, kRows = 8;

std::vector<float> Iota(size_t count, float start) {
  std::vector<float> values(count);
  std::iota(values.begin(), values.end(), start);
  return values;
}

SafetensorsFile ValidFile() {
  SafetensorsFile file;
  file.tensors["q_nope"] = MakeTensor<float>({kTokens, kH, kDn}, Iota(kTokens * kH * kDn, 0));
  file.tensors["q_rope"] = MakeTensor<float>({kTokens, kH, kDr}, Iota(kTokens * kH * kDr, 100));
  file.tensors["kv_c"] = MakeTensor<float>({kRows, kR}, Iota(kRows * kR, 1000));
  file.tensors["k_pe"] = MakeTensor<float>({kRows, kDr}, Iota(kRows * kDr, 2000));
  file.tensors["w_uk"] = MakeTensor<float>({kH, kDn, kR}, Iota(kH * kDn * kR, 0));
  file.tensors["w_uv"] = MakeTensor<float>({kH, kR, kDv}, Iota(kH * kR * kDv, 0));
  file.tensors["seq_lens"] = MakeTensor<int32_t>({2}, kSeqLens);
  file.tensors["query_lens"] = MakeTensor<int32_t>({2}, kQueryLens);
  // Token positions 3, 4 (request 0) and 2 (request 1).
  file.tensors["topk_indices"] = MakeTensor<int32_t>({kTokens, 3}, {3, 0, -1, 4, 2, 1, -1, -1, -1});
  return file;
}

std::string ErrorOf(const SafetensorsFile& file, int configured_topk = 2048) {
  absl::StatusOr<Problem> problem = ProblemFromFile(file, "p.safetensors", configured_topk);
  EXPECT_FALSE(problem.ok());
  if (!problem.ok()) EXPECT_EQ(problem.status().code(), absl::StatusCode::kInvalidArgument);
  return problem.ok() ? "" : std::string(problem.status().message());
}

TEST(ProblemTest, ReadsDimsLengthsAndRows) {
  absl::StatusOr<Problem> problem = ProblemFromFile(ValidFile(), "p", 2048);
  ASSERT_TRUE(problem.ok()) << problem.status();
  EXPECT_EQ(problem->model.num_heads, kH);
  EXPECT_EQ(problem->model.kv_lora_rank, kR);
  EXPECT_EQ(problem->model.qk_nope_head_dim, kDn);
  EXPECT_EQ(problem->model.qk_rope_head_dim, kDr);
  EXPECT_EQ(problem->model.v_head_dim, kDv);
  EXPECT_EQ(problem->index_topk, 3);  // the width of topk_indices
  EXPECT_EQ(problem->num_tokens(), kTokens);
  EXPECT_EQ(problem->num_rows(), kRows);
  EXPECT_EQ(problem->input_dtype, "F32");
  // kv rows are [kv_c | k_pe].
  ASSERT_EQ(problem->kv.size(), size_t(kRows * (kR + kDr)));
  EXPECT_EQ(problem->kv[1 * (kR + kDr) + 0], 1000 + kR);
  EXPECT_EQ(problem->kv[1 * (kR + kDr) + kR + 1], 2000 + kDr + 1);
}

TEST(ProblemTest, Bf16InputsAndMetadata) {
  SafetensorsFile file = ValidFile();
  std::vector<bf16> values(kRows * kR);
  for (size_t i = 0; i < values.size(); ++i) values[i] = float_to_bf16(0.5f + float(i));
  file.tensors["kv_c"] = MakeTensor<bf16>({kRows, kR}, values);
  file.tensors.erase("topk_indices");
  file.metadata = {{"softmax_scale", "0.25"}, {"index_topk", "16"}};
  absl::StatusOr<Problem> problem = ProblemFromFile(file, "p", 2048);
  ASSERT_TRUE(problem.ok()) << problem.status();
  EXPECT_EQ(problem->kv[0], 0.5f);
  EXPECT_EQ(problem->kv[3], 3.5f);
  EXPECT_FLOAT_EQ(problem->model.scale(), 0.25f);
  EXPECT_EQ(problem->index_topk, 16);
  EXPECT_TRUE(problem->topk.empty());
  EXPECT_EQ(problem->input_dtype, "mixed");
}

TEST(ProblemTest, WithoutTopkTheConfiguredKApplies) {
  SafetensorsFile file = ValidFile();
  file.tensors.erase("topk_indices");
  EXPECT_TRUE(ProblemFromFile(file, "p", 5).ok());
  EXPECT_NE(ErrorOf(file, 4).find("seq_lens[0] = 5 exceeds index_topk = 4"), std::string::npos);
}

TEST(ProblemTest, NamesEveryDefect) {
  SafetensorsFile file = ValidFile();
  file.tensors.erase("k_pe");
  EXPECT_NE(ErrorOf(file).find("missing tensor 'k_pe'"), std::string::npos);

  file = ValidFile();
  file.tensors["extra"] = MakeTensor<float>({1}, {0});
  EXPECT_NE(ErrorOf(file).find("unexpected tensor 'extra'"), std::string::npos);

  file = ValidFile();
  file.tensors["seq_lens"] = MakeTensor<float>({2}, {5, 3});
  EXPECT_NE(ErrorOf(file).find("'seq_lens' must be I32, got F32"), std::string::npos);

  file = ValidFile();
  file.tensors["q_rope"] =
      MakeTensor<int32_t>({kTokens, kH, kDr}, std::vector<int32_t>(kTokens * kH * kDr));
  EXPECT_NE(ErrorOf(file).find("'q_rope' must be F32 or BF16"), std::string::npos);

  file = ValidFile();
  file.tensors["w_uk"] = MakeTensor<float>({kH, kDn}, Iota(kH * kDn, 0));
  EXPECT_NE(ErrorOf(file).find("'w_uk' must have 3 dimensions"), std::string::npos);

  file = ValidFile();
  file.tensors["w_uv"] = MakeTensor<float>({kH, kR + 1, kDv}, Iota(kH * (kR + 1) * kDv, 0));
  EXPECT_NE(ErrorOf(file).find("'w_uv' has shape [4, 9, 3], expected [4, 8, 3]"),
            std::string::npos);

  file = ValidFile();
  file.tensors["query_lens"] = MakeTensor<int32_t>({2}, {2, 4});
  EXPECT_NE(ErrorOf(file).find("query_lens[1] = 4, must be in [1, seq_lens[1] = 3]"),
            std::string::npos);

  file = ValidFile();
  file.tensors["seq_lens"] = MakeTensor<int32_t>({2}, {0, 3});
  EXPECT_NE(ErrorOf(file).find("seq_lens[0] = 0"), std::string::npos);

  file = ValidFile();
  file.tensors["query_lens"] = MakeTensor<int32_t>({3}, {2, 1, 1});
  EXPECT_NE(ErrorOf(file).find("'query_lens' has shape [3]"), std::string::npos);

  file = ValidFile();
  file.tensors["kv_c"] = MakeTensor<float>({kRows - 1, kR}, Iota((kRows - 1) * kR, 0));
  EXPECT_NE(ErrorOf(file).find("N = sum of seq_lens = 8"), std::string::npos);

  file = ValidFile();
  file.tensors["query_lens"] = MakeTensor<int32_t>({2}, {1, 1});
  EXPECT_NE(ErrorOf(file).find("T = sum of query_lens = 2"), std::string::npos);

  file = ValidFile();
  std::vector<float> q = Iota(kTokens * kH * kDn, 0);
  q[7] = std::nanf("");
  file.tensors["q_nope"] = MakeTensor<float>({kTokens, kH, kDn}, q);
  EXPECT_NE(ErrorOf(file).find("non-finite value"), std::string::npos);

  file = ValidFile();
  file.metadata["softmax_scale"] = "-1";
  EXPECT_NE(ErrorOf(file).find("softmax_scale '-1'"), std::string::npos);
  file = ValidFile();
  file.metadata["index_topk"] = "lots";
  EXPECT_NE(ErrorOf(file).find("index_topk 'lots'"), std::string::npos);
  // An empty value is a malformed one, not an absent one (no silent default).
  file = ValidFile();
  file.metadata["softmax_scale"] = "";
  EXPECT_NE(ErrorOf(file).find("softmax_scale '' is not a positive number"), std::string::npos);
  file = ValidFile();
  file.metadata["index_topk"] = "";
  EXPECT_NE(ErrorOf(file).find("index_topk '' is not a positive integer"), std::string::npos);
}

TEST(ProblemTest, TopkIndicesMustBeCausalAndUnique) {
  const auto with_topk = [](std::vector<int32_t> values) {
    SafetensorsFile file = ValidFile();
    file.tensors["topk_indices"] = MakeTensor<int32_t>({kTokens, 3}, values);
    return file;
  };
  EXPECT_TRUE(ProblemFromFile(with_topk({3, 2, 1, 4, 3, 0, 2, 1, 0}), "p", 3).ok());
  // Token 0 sits at position 3: 4 is in its future.
  EXPECT_NE(ErrorOf(with_topk({4, 0, -1, 4, 2, 1, -1, -1, -1}))
                .find("topk_indices[0][0] = 4 is not a causal position of request 0"),
            std::string::npos);
  // Token 2 (request 1, position 2) may not select 3.
  EXPECT_NE(ErrorOf(with_topk({3, 0, -1, 4, 2, 1, 3, -1, -1})).find("topk_indices[2][0] = 3"),
            std::string::npos);
  EXPECT_NE(ErrorOf(with_topk({3, 0, -1, 4, 2, -7, -1, -1, -1})).find("= -7"), std::string::npos);
  EXPECT_NE(ErrorOf(with_topk({3, 0, 3, 4, 2, 1, -1, -1, -1}))
                .find("topk_indices[0] selects position 3 more than once"),
            std::string::npos);
  SafetensorsFile file = ValidFile();
  file.tensors["topk_indices"] = MakeTensor<int32_t>({kTokens + 1, 2}, std::vector<int32_t>(8, -1));
  EXPECT_NE(ErrorOf(file).find("'topk_indices' has shape [4, 2]"), std::string::npos);
}

// The worker's top-k width limit (2^20) is refused when the file is read, naming the file and
// the tensor or key, not when its batch first runs. The limit's own width still reads.
TEST(ProblemTest, TopkWiderThanTheWorkersLimitIsRefusedAtRead) {
  const int64_t limit = kMaxIndexTopk;
  const auto with_width = [](int64_t width) {
    SafetensorsFile file = ValidFile();
    std::vector<int32_t> values(size_t(kTokens * width), -1);
    values[0] = 3, values[size_t(width)] = 4, values[size_t(2 * width)] = 2;
    file.tensors["topk_indices"] = MakeTensor<int32_t>({kTokens, width}, values);
    return file;
  };
  absl::StatusOr<Problem> at_limit = ProblemFromFile(with_width(limit), "p", 2048);
  ASSERT_TRUE(at_limit.ok()) << at_limit.status();
  EXPECT_EQ(at_limit->topk_width, limit);
  EXPECT_EQ(at_limit->index_topk, limit);
  EXPECT_NE(ErrorOf(with_width(limit + 1))
                .find(absl::StrCat("p.safetensors: tensor 'topk_indices' is ", limit + 1,
                                   " wide, above the top-k width limit ", limit)),
            std::string::npos);
  SafetensorsFile file = ValidFile();
  file.metadata["index_topk"] = absl::StrCat(limit + 1);
  EXPECT_NE(ErrorOf(file).find(
                absl::StrCat("__metadata__ index_topk ", limit + 1, " is above the limit ", limit)),
            std::string::npos);
}

// Whether each request's rows select every causal position: what decides whether the dense
// route, which attends to all of them, computes what the rows say.
TEST(ProblemTest, TellsWhichRequestsSelectEveryCausalPosition) {
  const auto every = [](std::vector<int32_t> values, int width) {
    SafetensorsFile file = ValidFile();
    file.tensors["topk_indices"] = MakeTensor<int32_t>({kTokens, width}, values);
    absl::StatusOr<Problem> problem = ProblemFromFile(file, "p", 2048);
    EXPECT_TRUE(problem.ok()) << problem.status();
    return problem.ok() ? problem->topk_selects_every_causal_key : std::vector<bool>{};
  };
  // Positions 3, 4 (request 0) and 2 (request 1), in any order, padded with -1.
  EXPECT_EQ(every({3, -1, 1, 0, 2, -1, 4, 0, 2, 1, 3, -1, -1, 2, 0, 1, -1, -1}, 6),
            (std::vector<bool>{true, true}));
  // Token 1 leaves position 4 out; request 1 is untouched.
  EXPECT_EQ(every({3, -1, 1, 0, 2, -1, 0, 2, 1, 3, -1, -1, -1, 2, 0, 1, -1, -1}, 6),
            (std::vector<bool>{false, true}));
  EXPECT_EQ(every({3, 0, -1, 4, 2, 1, -1, -1, -1}, 3), (std::vector<bool>{false, false}));
  SafetensorsFile file = ValidFile();
  file.tensors.erase("topk_indices");
  absl::StatusOr<Problem> problem = ProblemFromFile(file, "p", 2048);
  ASSERT_TRUE(problem.ok()) << problem.status();
  EXPECT_EQ(problem->topk_selects_every_causal_key, (std::vector<bool>{true, true}));
}

TEST(ProblemTest, SlicesCoverTheProblemExactlyOnce) {
  absl::StatusOr<Problem> problem = ProblemFromFile(ValidFile(), "p", 2048);
  ASSERT_TRUE(problem.ok());
  const int world = 2, width = kR + kDr;
  std::vector<int> seen(kRows, 0);
  for (int rank = 0; rank < world; ++rank) {
    const RankView view = RankView::Of(problem->model, world, /*interleave=*/1, rank);
    const RankWeights weights = SliceWeights(*problem, view);
    EXPECT_EQ(weights.w_uk[0], problem->w_uk[size_t(rank) * 2 * kDn * kR]);
    const RankBatch batch = SliceBatch(*problem, view, 10);
    EXPECT_EQ(batch.requests[1].request_id, 11);
    // q_nope of token 1, local head 1 = global head 2 * rank + 1.
    EXPECT_EQ(batch.q_nope[(1 * 2 + 1) * kDn], problem->q_nope[(1 * kH + 2 * rank + 1) * kDn]);
    // Cached rows: request 0 has 3, request 1 has 2; dealt round-robin.
    int64_t row_offset = 0;
    for (size_t i = 0; i < batch.cached_rows.size(); ++i) {
      const int64_t context = kSeqLens[i] - kQueryLens[i];
      const auto& rows = batch.cached_rows[i];
      ASSERT_EQ(int64_t(rows.size()), view.layout.local_length(context, rank) * width);
      for (size_t j = 0; j * width < rows.size(); ++j) {
        const int64_t g = view.layout.global_index(int64_t(j), rank);
        EXPECT_EQ(rows[j * width], problem->kv[(row_offset + g) * width]);
        ++seen[row_offset + g];
      }
      row_offset += kSeqLens[i];
    }
    // The new tokens: rows 3, 4 of request 0 and row 2 of request 1.
    EXPECT_EQ(batch.kv_new[2 * width], problem->kv[(5 + 2) * width]);
  }
  EXPECT_EQ(seen, (std::vector<int>{1, 1, 1, 0, 0, 1, 1, 0}));
}

}  // namespace
}  // namespace dcp::launch
