#pragma once
/// Time conversions shared by the actors.

#include <chrono>

namespace tandem {

/// The actors' wall clock for measured intervals (step and forward times).
using clock_type = std::chrono::steady_clock;

/// Milliseconds from `t` until now.
inline double ms_since(clock_type::time_point t) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t).count();
}

} // namespace tandem
