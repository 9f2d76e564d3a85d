// Environment variables (DCP_*): the measurement switches and knobs of the kernels and devices,
// the test hooks. One reader for all of them, so that every variable takes its values by the
// same rules and a value it cannot take is said instead of being read as something else.
//
// EnvSwitch:  1, true, on, yes or 0, false, off, no (any case).
// EnvInteger: a decimal integer in [low, high].
// EnvNumber:  a decimal number in [low, high].
// EnvChoice:  one of `choices`, as written.
// Unset or empty: `fallback`. Anything else: `fallback`, and one warning naming the variable,
// the value and what it takes (an environment variable has no caller to return an error to;
// none of these changes a result, only how it is computed or reported). Each call reads the
// environment: callers that sit on a hot path keep the value in a function-local static.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

namespace dcp {

bool EnvSwitch(const char* name, bool fallback);
int64_t EnvInteger(const char* name, int64_t fallback, int64_t low, int64_t high);
double EnvNumber(const char* name, double fallback, double low, double high);
std::string_view EnvChoice(const char* name, std::string_view fallback,
                           std::initializer_list<std::string_view> choices);

}  // namespace dcp
