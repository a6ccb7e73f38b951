#pragma once
/// The unit tests' check of a refused input: `f` must throw gpu::error with
/// errc::bad_input whose message contains every one of `needles` (the file,
/// the field, the value a user needs to fix it).

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/error.hpp"

namespace tandem::test {

template <class F>
void expect_bad_input(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
  } catch (const gpu::error& e) {
    EXPECT_EQ(e.code(), errc::bad_input) << e.what();
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
        << "message lacks \"" << n << "\": " << e.what();
    return;
  }
  ADD_FAILURE() << "no gpu::error thrown";
}

} // namespace tandem::test
