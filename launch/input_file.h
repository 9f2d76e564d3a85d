// Reading the launcher's input files (the problem file, the YAML config) whole, with a clear
// error for a path that is not a readable regular file.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace dcp::launch {

// Reads the file at `path` into *bytes. `what` names it in errors ("problem file", "config").
// NotFound when nothing is at `path`; InvalidArgument for a directory, a FIFO, a device or a
// socket (reading a FIFO without a writer, or /dev/zero, would never end), for a file that
// cannot be opened or read. Symbolic links are followed.
absl::Status ReadInputFile(const std::string& path, std::string_view what, std::string* bytes);

}  // namespace dcp::launch
