#pragma once
/// The learning-rate schedule (linear warm-up, cosine decay to 0), free of
/// LibTorch so the launcher can say what a resume does to it.  The
/// optimizer (gpu/engine/adamw.hpp) computes the same on the device.

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace tandem::gpu {

/// W = ceil(warmup_ratio · total_steps) (0 when total_steps ≤ 0).
inline int64_t warmup_steps(double warmup_ratio, int64_t total_steps) {
  if (total_steps <= 0 || warmup_ratio <= 0)
    return 0;
  return static_cast<int64_t>(std::ceil(warmup_ratio * static_cast<double>(total_steps)));
}

/// The learning rate of the `step`-th update (1-based), in float64: lr·step/W
/// during the warm-up, then a cosine from lr to 0 over the remaining steps;
/// lr throughout when total_steps ≤ 0.
inline double scheduled_lr(double lr, double warmup_ratio, int64_t total_steps, int64_t step) {
  if (total_steps <= 0)
    return lr;
  const auto w = warmup_steps(warmup_ratio, total_steps);
  const auto t = static_cast<double>(step);
  if (step <= w)
    return lr * t / static_cast<double>(w);
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - w));
  const double progress = std::min(1.0, std::max(0.0, (t - static_cast<double>(w)) / span));
  return 0.5 * lr * (1.0 + std::cos(3.14159265358979323846 * progress));
}

} // namespace tandem::gpu
