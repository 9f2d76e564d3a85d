// core/environment.h: every value form a switch, an integer, a number and a choice take, the
// fallbacks for unset and empty variables, and one warning (naming variable and value) for
// anything else.
#include "core/environment.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace dcp {
namespace {

constexpr const char* kName = "DCP_ENVIRONMENT_TEST_VARIABLE";

class EnvironmentTest : public ::testing::Test {
 protected:
  void TearDown() override { unsetenv(kName); }
  static void Set(const char* value) { setenv(kName, value, 1); }
  // What the call wrote to stderr (the log).
  template <typename F>
  static std::string Stderr(F&& call) {
    ::testing::internal::CaptureStderr();
    call();
    return ::testing::internal::GetCapturedStderr();
  }
};

TEST_F(EnvironmentTest, SwitchTakesItsWordsInAnyCase) {
  for (const char* on : {"1", "true", "TRUE", "On", "yes"}) {
    Set(on);
    EXPECT_TRUE(EnvSwitch(kName, false)) << on;
  }
  for (const char* off : {"0", "false", "Off", "NO"}) {
    Set(off);
    EXPECT_FALSE(EnvSwitch(kName, true)) << off;
  }
}

TEST_F(EnvironmentTest, UnsetAndEmptyTakeTheFallbackSilently) {
  const std::string said = Stderr([] {
    EXPECT_TRUE(EnvSwitch(kName, true));
    EXPECT_EQ(EnvInteger(kName, 7, 0, 9), 7);
    Set("");
    EXPECT_FALSE(EnvSwitch(kName, false));
    EXPECT_EQ(EnvInteger(kName, -1, -1, 1), -1);
    EXPECT_EQ(EnvNumber(kName, 2.5, 0, 16), 2.5);
    EXPECT_EQ(EnvChoice(kName, "simt", {"simt", "tc", "off"}), "simt");
  });
  EXPECT_EQ(said, "");
}

TEST_F(EnvironmentTest, AnUnreadableSwitchWarnsOnceAndTakesTheFallback) {
  Set("2");
  std::string said = Stderr([] { EXPECT_TRUE(EnvSwitch(kName, true)); });
  EXPECT_NE(said.find(kName), std::string::npos) << said;
  EXPECT_NE(said.find("'2'"), std::string::npos) << said;
  said = Stderr([] { EXPECT_FALSE(EnvSwitch(kName, false)); });
  EXPECT_EQ(said, "");  // said once per variable and value
  Set("enabled");
  said = Stderr([] { EXPECT_FALSE(EnvSwitch(kName, false)); });
  EXPECT_NE(said.find("'enabled'"), std::string::npos) << said;
}

TEST_F(EnvironmentTest, IntegersInRangeOnly) {
  Set("4");
  EXPECT_EQ(EnvInteger(kName, 1, 0, 4), 4);
  Set("-1");
  EXPECT_EQ(EnvInteger(kName, 0, -1, 1), -1);
  for (const char* bad : {"5", "-2", "1.5", "4x", " 3", "0x3", "99999999999999999999"}) {
    Set(bad);
    const std::string said = Stderr([] { EXPECT_EQ(EnvInteger(kName, 1, -1, 4), 1); });
    EXPECT_NE(said.find(std::string("'") + bad + "'"), std::string::npos) << said;
  }
}

TEST_F(EnvironmentTest, NumbersInRangeOnly) {
  Set("8");
  EXPECT_EQ(EnvNumber(kName, 1, 0, 16), 8);
  Set("0.25");
  EXPECT_EQ(EnvNumber(kName, 1, 0, 16), 0.25);
  for (const char* bad : {"16.5", "-0.1", "nan", "eight", "3 "}) {
    Set(bad);
    const std::string said = Stderr([] { EXPECT_EQ(EnvNumber(kName, 8, 0, 16), 8); });
    EXPECT_NE(said.find(std::string("'") + bad + "'"), std::string::npos) << said;
  }
}

TEST_F(EnvironmentTest, ChoicesAsWritten) {
  Set("tc");
  EXPECT_EQ(EnvChoice(kName, "simt", {"simt", "tc", "off"}), "tc");
  Set("TC");
  const std::string said = Stderr([] {
    EXPECT_EQ(EnvChoice(kName, "simt", {"simt", "tc", "off"}), "simt");
  });
  EXPECT_NE(said.find("simt, tc, off"), std::string::npos) << said;
}

}  // namespace
}  // namespace dcp
