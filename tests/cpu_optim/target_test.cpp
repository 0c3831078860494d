// Choosing the SIMD target: "auto" takes the best this CPU runs; each runnable target can be forced by
// name (config or environment variable); a name not compiled in, or not runnable here, is refused with a
// ConfigError that lists the usable names.
#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "tests/cpu_optim/common.h"

namespace strata::cpu_optim::test {
namespace {

// Sets an environment variable for the life of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

TEST(Target, AutoPicksTheBestTargetThisCpuRuns) {
  ASSERT_FALSE(supported_targets().empty());
  EXPECT_EQ(Optimizer().target(), supported_targets().front());
  EXPECT_EQ(chosen_target("auto"), supported_targets().front());
}

TEST(Target, NamesAreLowerCaseAndSupportedOnesAreCompiled) {
  const auto compiled = compiled_targets();
  for (const std::string& t : compiled) {
    EXPECT_TRUE(std::none_of(t.begin(), t.end(), [](char ch) { return std::isupper(ch); })) << t;
  }
  for (const std::string& t : supported_targets()) {
    EXPECT_NE(std::find(compiled.begin(), compiled.end(), t), compiled.end()) << t;
  }
}

TEST(Target, EveryRunnableTargetCanBeForcedByName) {
  for (const std::string& t : supported_targets()) {
    EXPECT_EQ(Optimizer(options_for(t)).target(), t);
    EXPECT_EQ(chosen_target(t), t);
  }
}

TEST(Target, ScalarAndEmu128BothNameTheFallback) {
  const std::string fallback = supported_targets().back();
  ASSERT_TRUE(fallback == "scalar" || fallback == "emu128") << fallback;
  EXPECT_EQ(chosen_target("scalar"), fallback);
  EXPECT_EQ(chosen_target("EMU128"), fallback);
}

TEST(Target, CompiledTargetThisCpuCannotRunIsRefused) {
  const auto supported = supported_targets();
  int refused = 0;
  for (const std::string& t : compiled_targets()) {
    if (std::find(supported.begin(), supported.end(), t) != supported.end()) continue;
    try {
      Optimizer opt(options_for(t));
      ADD_FAILURE() << t << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("cannot run"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(supported.front()), std::string::npos) << e.what();
    }
    ++refused;
  }
  if (refused == 0) GTEST_SKIP() << "this CPU runs every compiled target";
}

TEST(Target, UnknownNameRaisesConfigErrorListingTheTargets) {
  try {
    Optimizer opt(options_for("avx9000"));
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("strata.cpu_optim.simd"), std::string::npos) << msg;
    EXPECT_NE(msg.find("avx9000"), std::string::npos) << msg;
    for (const std::string& t : supported_targets()) EXPECT_NE(msg.find(t), std::string::npos) << msg;
  }
}

TEST(Target, EnvironmentVariableOverridesTheOption) {
  const std::string fallback = supported_targets().back();
  ScopedEnv env("STRATA_CPU_OPTIM_SIMD", fallback.c_str());
  EXPECT_EQ(Optimizer(options_for("auto")).target(), fallback);
  EXPECT_EQ(chosen_target("auto"), fallback);
}

TEST(Target, BadEnvironmentVariableIsNamedInTheError) {
  ScopedEnv env("STRATA_CPU_OPTIM_SIMD", "bogus");
  try {
    Optimizer opt;
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("STRATA_CPU_OPTIM_SIMD"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata::cpu_optim::test
