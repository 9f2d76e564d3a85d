// Fuzz target: the YAML config (launch/run_config.h) and the checks that follow it before a
// run (ValidateRunSection, the ceilings of launch/limits.h). Bad input must be an
// InvalidArgument Status, never an exception (which dcp_run would report as exit 3), a crash
// or a hang.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "launch/limits.h"
#include "launch/run_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  dcp::launch::RunConfig config;
  absl::Status status = dcp::launch::ApplyYamlConfig(text, "fuzz.yaml", &config);
  if (status.ok()) status = dcp::launch::ValidateRunSection(config);
  if (status.ok()) status = dcp::launch::CheckCeilings(config, {});
  if (!status.ok() && status.code() != absl::StatusCode::kInvalidArgument) std::abort();
  return 0;
}
