#include "core/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/status.h"

namespace dcp {
namespace {

LogLevel LevelFromEnvironment() {
  const char* text = std::getenv("DCP_LOG_LEVEL");
  if (text == nullptr) return LogLevel::kWarning;
  std::string_view value(text);
  if (value == "error") return LogLevel::kError;
  if (value == "warning" || value == "warn") return LogLevel::kWarning;
  if (value == "info") return LogLevel::kInfo;
  if (value == "debug") return LogLevel::kDebug;
  std::fprintf(stderr, "[dcp] DCP_LOG_LEVEL=%s is not one of error|warning|info|debug; using warning\n",
               text);
  return LogLevel::kWarning;
}

std::atomic<int>& LevelStorage() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnvironment())};
  return level;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kError: return "ERROR";
    case LogLevel::kWarning: return "WARNING";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kDebug: return "DEBUG";
  }
  return "?";
}

}  // namespace

LogLevel log_level() { return static_cast<LogLevel>(LevelStorage().load()); }
void set_log_level(LogLevel level) { LevelStorage().store(static_cast<int>(level)); }

LogLine::~LogLine() {
  std::string line = "[dcp rank " + std::to_string(current_rank()) + " " + LevelName(level_) +
                     "] " + stream_.str() + "\n";
  std::fputs(line.c_str(), stderr);
}

}  // namespace dcp
