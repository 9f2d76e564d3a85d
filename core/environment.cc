#include "core/environment.h"

#include <charconv>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/logging.h"

namespace dcp {
namespace {

// The variable's value, or nullptr when it is unset or empty.
const char* Value(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

// One warning per variable and value: a knob read at every call must not flood the log.
void Refuse(const char* name, const char* value, std::string_view takes, std::string_view used) {
  static std::mutex mutex;
  static std::set<std::string> said;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!said.insert(std::string(name) + "=" + value).second) return;
  }
  DCP_LOG(WARNING) << name << "='" << value << "' is not " << takes << "; using " << used;
}

}  // namespace

bool EnvSwitch(const char* name, bool fallback) {
  const char* value = Value(name);
  if (value == nullptr) return fallback;
  const std::string text = absl::AsciiStrToLower(value);
  if (text == "1" || text == "true" || text == "on" || text == "yes") return true;
  if (text == "0" || text == "false" || text == "off" || text == "no") return false;
  Refuse(name, value, "a switch (1, true, on, yes or 0, false, off, no)", fallback ? "1" : "0");
  return fallback;
}

int64_t EnvInteger(const char* name, int64_t fallback, int64_t low, int64_t high) {
  const char* value = Value(name);
  if (value == nullptr) return fallback;
  const std::string_view text(value);
  int64_t parsed = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), parsed);
  if (error != std::errc() || end != text.data() + text.size() || parsed < low || parsed > high) {
    Refuse(name, value, "an integer in [" + std::to_string(low) + ", " + std::to_string(high) + "]",
           std::to_string(fallback));
    return fallback;
  }
  return parsed;
}

double EnvNumber(const char* name, double fallback, double low, double high) {
  const char* value = Value(name);
  if (value == nullptr) return fallback;
  char* end = nullptr;
  const double parsed = std::strtod(value, &end);
  if (end == value || *end != '\0' || !(parsed >= low && parsed <= high)) {
    Refuse(name, value, "a number in [" + absl::StrCat(low) + ", " + absl::StrCat(high) + "]",
           absl::StrCat(fallback));
    return fallback;
  }
  return parsed;
}

std::string_view EnvChoice(const char* name, std::string_view fallback,
                           std::initializer_list<std::string_view> choices) {
  const char* value = Value(name);
  if (value == nullptr) return fallback;
  for (std::string_view choice : choices) {
    if (choice == value) return choice;
  }
  std::string takes = "one of";
  for (std::string_view choice : choices) {
    takes += (takes.size() > 6 ? ", " : " ") + std::string(choice);
  }
  Refuse(name, value, takes, fallback);
  return fallback;
}

}  // namespace dcp
