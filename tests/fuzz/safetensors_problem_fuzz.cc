// Fuzz target: the problem reader (launch/safetensors.h + launch/problem.h) on arbitrary bytes.
// Every input must come back as a Problem or an InvalidArgument/ResourceExhausted Status:
// never a crash, a hang, an exception or an allocation the bytes do not justify.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "launch/problem.h"
#include "launch/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<dcp::launch::SafetensorsFile> file =
      dcp::launch::ParseSafetensors(bytes, "fuzz.safetensors");
  if (!file.ok()) {
    if (file.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  absl::StatusOr<dcp::launch::Problem> problem =
      dcp::launch::ProblemFromFile(*file, "fuzz.safetensors", /*configured_topk=*/64);
  if (!problem.ok() && problem.status().code() != absl::StatusCode::kInvalidArgument) {
    std::abort();
  }
  return 0;
}
