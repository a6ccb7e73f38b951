#pragma once
/// The tests' checks of a refused input (unit, protocol and GPU tests): `f`
/// must throw gpu::error with the expected code, and its message must name
/// what a user needs to fix (the file, the field, the value).  Torch-free.

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/device/error.hpp"

namespace tandem::test {

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// Runs `f`, expects gpu::error with `code`, returns its message ("" when
/// nothing or something else was thrown: a failure is recorded).
template <class F>
std::string expect_error(errc code, F&& f) {
  try {
    f();
  } catch (const gpu::error& e) {
    EXPECT_EQ(e.code(), code) << "got " << tandem::to_string(e.code()) << ": " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected gpu::error(" << tandem::to_string(code) << "), nothing was thrown";
  return "";
}

/// Runs `f`, which must throw gpu::error(bad_input) whose message contains
/// every one of `needles`.
template <class F>
void expect_bad_input(F&& f, const std::vector<std::string>& needles) {
  const auto what = expect_error(errc::bad_input, std::forward<F>(f));
  for (const auto& n : needles)
    EXPECT_TRUE(contains(what, n)) << "message lacks \"" << n << "\": " << what;
}

} // namespace tandem::test
