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

/// `s` seconds (a config value or a message field) as a `Duration` for CAF
/// timeouts and timers and for the engines' deadlines; truncated toward
/// zero, like std::chrono::duration_cast.
template <class Duration = std::chrono::nanoseconds>
Duration seconds_to(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

} // namespace tandem
