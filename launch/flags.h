// The command line of dcp_run, as Abseil flags. Names take `-` or `_` (`--num-heads` is
// `--num_heads`); values come as `--flag=value` or `--flag value` (booleans: `--flag`,
// `--flag=false`, `--noflag`). Parsing never exits the process: an unknown flag, a bad value
// or a stray argument is an InvalidArgument Status, so that every rank can agree on it.
#pragma once

#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "launch/run_config.h"

namespace dcp::launch {

struct CommandLine {
  std::set<std::string> given;  // flag names (underscore form) present on the command line
  bool help = false;
  bool version = false;  // --version
  std::string config_path() const;
};

// Parses argv[1..argc) into the Abseil flags.
absl::StatusOr<CommandLine> ParseCommandLine(int argc, const char* const* argv);

// Writes every flag given on the command line into *config (flags override the file).
absl::Status ApplyFlags(const CommandLine& command_line, RunConfig* config);

// The --help text: every flag with its type, default and meaning.
std::string UsageText(const char* program);

}  // namespace dcp::launch
