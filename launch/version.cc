#include "launch/version.h"

#include <ctime>

#include "absl/strings/str_format.h"

#ifndef DCP_PROJECT_VERSION
#define DCP_PROJECT_VERSION "unknown"
#endif

namespace dcp::launch {

const char* ProjectVersion() { return DCP_PROJECT_VERSION; }

std::string TimestampUtc() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string VersionLine(const char* program) {
  return absl::StrFormat("%s %s (commit %s, output format %d)", program, ProjectVersion(),
                         GitCommit(), kOutputFormatVersion);
}

}  // namespace dcp::launch
