// Rank-prefixed logging to stderr: `DCP_LOG(INFO) << "text";`. The level comes from the
// environment variable DCP_LOG_LEVEL (error, warning, info, debug; default warning), read once.
#pragma once

#include <sstream>

namespace dcp {

enum class LogLevel { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);

// Collects one line and writes it, prefixed "[dcp rank r LEVEL] ", when destroyed.
class LogLine {
 public:
  explicit LogLine(LogLevel level) : level_(level) {}
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  template <typename T>
  LogLine& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace dcp

#define DCP_LOG_LEVEL_ERROR ::dcp::LogLevel::kError
#define DCP_LOG_LEVEL_WARNING ::dcp::LogLevel::kWarning
#define DCP_LOG_LEVEL_INFO ::dcp::LogLevel::kInfo
#define DCP_LOG_LEVEL_DEBUG ::dcp::LogLevel::kDebug
#define DCP_LOG(level)                                        \
  if (DCP_LOG_LEVEL_##level > ::dcp::log_level()) {           \
  } else                                                      \
    ::dcp::LogLine(DCP_LOG_LEVEL_##level)
