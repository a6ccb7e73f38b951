#include <cstdlib>

#include <gtest/gtest.h>

#include "gpu/device/env.hpp"
#include "gpu/device/error.hpp"

using tandem::gpu::env_choice;
using tandem::gpu::mode_choice;

namespace {
constexpr const char* kName = "TANDEM_TEST_ENV_CHOICE";

/// The message env_choice throws, or "" when it returns.
std::string refusal(std::initializer_list<const char*> choices) {
  try {
    (void)env_choice(kName, choices);
    return "";
  } catch (const tandem::gpu::error& e) {
    EXPECT_EQ(e.code(), tandem::errc::bad_input);
    return e.what();
  }
}
} // namespace

TEST(env_choice, unset_and_empty_give_the_first_choice) {
  ::unsetenv(kName);
  EXPECT_EQ(env_choice(kName, {"graphs", "eager", "sdpa"}), "graphs");
  ::setenv(kName, "", 1);
  EXPECT_EQ(env_choice(kName, {"1", "0"}), "1");
  ::unsetenv(kName);
}

TEST(env_choice, each_choice_is_taken_as_written) {
  for (const char* v : {"graphs", "eager", "sdpa"}) {
    ::setenv(kName, v, 1);
    EXPECT_EQ(env_choice(kName, {"graphs", "eager", "sdpa"}), v);
  }
  ::unsetenv(kName);
}

TEST(env_choice, anything_else_is_bad_input_naming_the_variable_value_and_choices) {
  for (const char* v : {"Eager", "eager ", "2", "graphs,eager"}) {
    ::setenv(kName, v, 1);
    EXPECT_EQ(refusal({"graphs", "eager", "sdpa"}),
              std::string(kName) + "='" + v + "' is not one of graphs, eager, sdpa");
  }
  ::unsetenv(kName);
}

TEST(env_choice, a_mode_given_by_code_wins_over_the_variable_and_is_checked_the_same) {
  ::setenv(kName, "bogus", 1);
  EXPECT_EQ(mode_choice("eager", kName, {"graphs", "eager"}), "eager");
  EXPECT_THROW((void)mode_choice("fast", kName, {"graphs", "eager"}), tandem::gpu::error);
  EXPECT_THROW((void)mode_choice("", kName, {"graphs", "eager"}), tandem::gpu::error);
  ::unsetenv(kName);
  EXPECT_EQ(mode_choice("", kName, {"graphs", "eager"}), "graphs");
}
