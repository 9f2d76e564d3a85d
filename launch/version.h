// What a tool's output says about where it came from: the project version, the git commit the
// binary was built from (baked in at build time by cmake/DcpVersion.cmake; "unknown" for a
// tree without .git), a timestamp, and the version of the formats of the JSON summary and the
// CSVs, raised whenever a field is renamed or changes meaning (docs/hardening.md).
#pragma once

#include <string>

namespace dcp::launch {

inline constexpr int kOutputFormatVersion = 2;  // 2: commit, timestamp and this field added

const char* GitCommit();
const char* ProjectVersion();  // "0.1.0"
// Now, UTC, ISO 8601 to the second: "2026-12-01T03:04:05Z".
std::string TimestampUtc();
// "dcp_run 0.1.0 (commit 1234abcd5678, output format 2)"
std::string VersionLine(const char* program);

}  // namespace dcp::launch
