#pragma once
/// The device probe's computation (see messages/probe.hpp).  Torch-free
/// facade: call it on the thread that owns the device.

#include <cstdint>

#include "messages/probe.hpp"

namespace tandem::gpu {

/// Runs a float32 matrix product with LibTorch on `device` (a CUDA ordinal,
/// or tandem::cpu_device) on a side stream, then Tandem's own CUDA kernel
/// (when built with CUDA) on the product, and compares with a float64 host
/// reference.  Throws gpu::error: device_unavailable when the device does not
/// exist, wrong_result when the error exceeds the tolerance.
probe_report run_probe(int32_t device);

/// Tolerance of run_probe's comparison: a float32 matrix product of length
/// 256 over values in [-1, 1], against float64; TF32 is disabled for the
/// probe, so plain float32 rounding (~256 * 2^-24 per dot) bounds it.
constexpr double probe_tolerance = 1e-3;

} // namespace tandem::gpu
