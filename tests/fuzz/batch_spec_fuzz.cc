// Fuzz target: the batch-spec grammar of dcp_run and dcp_bench (launch/batch_spec.h). Every
// spec that splits must parse, and what it parses to must respect the grammar's bounds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "launch/batch_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<std::string>> specs = dcp::launch::SplitBatchList(text);
  if (!specs.ok()) {
    if (specs.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  for (const std::string& spec : *specs) {
    absl::StatusOr<std::vector<dcp::launch::RequestShape>> requests =
        dcp::launch::ParseBatchSpec(spec);
    if (!requests.ok() || requests->empty()) std::abort();  // SplitBatchList checked it
    for (const dcp::launch::RequestShape& r : *requests) {
      if (r.query_len < 1 || r.seq_len < r.query_len) std::abort();
    }
    (void)dcp::launch::DescribeBatch(*requests, 1);
  }
  (void)dcp::launch::ParseBatchSpec(text);
  return 0;
}
