#include "launch/batch_spec.h"

#include <algorithm>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/status.h"

namespace dcp::launch {
namespace {

constexpr int64_t kMaxValue = std::numeric_limits<int32_t>::max();
// Keeps a typo like "100000q1" from allocating a batch the size of the machine.
constexpr int64_t kMaxRequests = 1 << 20;

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Reads digits[k] at text[*pos]; false (and *pos unchanged) when no digit is there.
absl::StatusOr<bool> ReadNumber(std::string_view term, size_t* pos, int64_t* value,
                                bool kilo = true) {
  size_t begin = *pos;
  int64_t number = 0;
  while (*pos < term.size() && IsDigit(term[*pos])) {
    number = number * 10 + (term[*pos] - '0');
    if (number > kMaxValue) {
      return DCP_ERROR(InvalidArgument, "number in batch term '%s' is too large", term);
    }
    ++*pos;
  }
  if (*pos == begin) return false;
  // `k` multiplies, unless it starts the `kv` marker (`q1kv1k`: one token over 1024).
  if (kilo && *pos < term.size() && term[*pos] == 'k' && term.substr(*pos, 2) != "kv") {
    number *= 1024;
    ++*pos;
    if (number > kMaxValue) {
      return DCP_ERROR(InvalidArgument, "number in batch term '%s' is too large", term);
    }
  }
  *value = number;
  return true;
}

absl::Status ParseTerm(std::string_view term, std::vector<RequestShape>* requests) {
  const auto bad = [&](std::string_view why) {
    return DCP_ERROR(InvalidArgument,
                     "bad batch term '%s': %s (grammar: [count]q<qlen>[kv<kvlen>], k = x1024, "
                     "'_' joins terms, ',' separates batches, e.g. q2k, 8q1kv1k, "
                     "2q2k_32q1kv1k)",
                     term, why);
  };
  size_t pos = 0;
  int64_t count = 1;
  // A leading count takes no `k` suffix (vLLM's grammar: `k` follows a length only).
  DCP_ASSIGN_OR_RETURN(bool has_count, ReadNumber(term, &pos, &count, /*kilo=*/false));
  if (has_count && pos < term.size() && term[pos] == 'k') {
    return bad("a count takes no 'k' (only the lengths do)");
  }
  if (pos >= term.size() || term[pos] != 'q') return bad("expected 'q'");
  ++pos;
  int64_t query_len = 0;
  DCP_ASSIGN_OR_RETURN(bool has_query, ReadNumber(term, &pos, &query_len));
  if (!has_query) return bad("expected a query length after 'q'");
  int64_t seq_len = query_len;
  if (term.substr(pos, 2) == "kv" || term.substr(pos, 1) == "s") {
    const std::string_view marker = term[pos] == 's' ? "s" : "kv";
    pos += marker.size();
    DCP_ASSIGN_OR_RETURN(bool has_seq, ReadNumber(term, &pos, &seq_len));
    if (!has_seq) return bad(absl::StrFormat("expected a KV length after '%s'", marker));
  }
  if (pos != term.size()) {
    return bad(absl::StrFormat("unexpected '%s'", term.substr(pos)));
  }
  if (has_count && count < 1) return bad("count must be >= 1");
  if (query_len < 1) return bad("query length must be >= 1");
  if (seq_len < query_len) return bad("sequence length must be >= query length");
  if (count + static_cast<int64_t>(requests->size()) > kMaxRequests) {
    return bad(absl::StrFormat("more than %d requests", kMaxRequests));
  }
  requests->insert(requests->end(), static_cast<size_t>(count),
                   RequestShape{static_cast<int32_t>(seq_len), static_cast<int32_t>(query_len)});
  return absl::OkStatus();
}

}  // namespace

std::string WithoutWhitespace(std::string text) {
  text.erase(
      std::remove_if(text.begin(), text.end(), [](char c) { return absl::ascii_isspace(c); }),
      text.end());
  return text;
}

// The old form (';' between batches, ',' between terms) in the new spelling.
std::string NewSpelling(std::string_view old_form) {
  std::string text(old_form);
  for (char& c : text) {
    if (c == ',') c = '_';
    else if (c == ';') c = ',';
  }
  return WithoutWhitespace(std::move(text));
}

// The grammar has no whitespace: a spec or list holding any is refused with its spelling
// without it (vLLM's parser refuses it too).
absl::Status RefuseWhitespace(std::string_view text) {
  return DCP_ERROR(InvalidArgument,
                   "batch spec '%s' holds whitespace; the grammar has none: write '%s'", text,
                   WithoutWhitespace(std::string(text)));
}

bool HasWhitespace(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) { return absl::ascii_isspace(c); });
}

absl::Status RefuseOldForm(std::string_view text) {
  return DCP_ERROR(InvalidArgument,
                   "batch spec '%s' uses the old form (';' between batches, ',' between terms); "
                   "the grammar is vLLM's: '_' joins the terms of one batch, ',' separates "
                   "batches: write '%s'",
                   text, NewSpelling(text));
}

absl::StatusOr<std::vector<RequestShape>> ParseBatchSpec(std::string_view spec) {
  std::vector<RequestShape> requests;
  const absl::string_view text(spec.data(), spec.size());
  if (absl::StripAsciiWhitespace(text).empty()) {
    return DCP_ERROR(InvalidArgument,
                     "empty batch spec (expected e.g. q2k, 8q1kv1k, 2q2k_32q1kv1k)");
  }
  if (text.find(';') != absl::string_view::npos) return RefuseOldForm(spec);
  if (HasWhitespace(spec)) return RefuseWhitespace(spec);
  if (text.find(',') != absl::string_view::npos) {
    return DCP_ERROR(InvalidArgument,
                     "batch spec '%s' holds several batches (',' separates batches; '_' joins "
                     "the terms of one)",
                     spec);
  }
  for (absl::string_view piece : absl::StrSplit(text, '_')) {
    const std::string_view term(piece.data(), piece.size());
    if (term.empty()) {
      return DCP_ERROR(InvalidArgument, "batch spec '%s' has an empty term", spec);
    }
    DCP_RETURN_IF_ERROR(ParseTerm(term, &requests));
  }
  return requests;
}

absl::StatusOr<std::vector<std::string>> SplitBatchList(std::string_view list) {
  const absl::string_view text(list.data(), list.size());
  if (text.find(';') != absl::string_view::npos) return RefuseOldForm(list);
  if (HasWhitespace(list)) return RefuseWhitespace(list);
  std::vector<std::string> specs;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    if (piece.empty()) {
      return DCP_ERROR(InvalidArgument,
                       "batch list '%s' has an empty batch (',' separates batches, e.g. "
                       "q2k,8q1kv1k)",
                       list);
    }
    DCP_RETURN_IF_ERROR(ParseBatchSpec(std::string_view(piece.data(), piece.size())).status());
    specs.emplace_back(piece);
  }
  return specs;
}

std::string DescribeBatch(const std::vector<RequestShape>& requests, int decode_threshold) {
  int64_t tokens = 0;
  int decodes = 0;
  int32_t max_seq_len = 0;
  for (const RequestShape& r : requests) {
    tokens += r.query_len;
    decodes += r.query_len <= decode_threshold ? 1 : 0;
    max_seq_len = std::max(max_seq_len, r.seq_len);
  }
  return absl::StrFormat("%d requests (%d decode, %d prefill), %d tokens, max seq_len %d",
                         requests.size(), decodes, requests.size() - decodes, tokens, max_seq_len);
}

}  // namespace dcp::launch
