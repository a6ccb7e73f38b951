#pragma once
/// y[i] = a * x[i] + b, float32 — the smallest Tandem-built CUDA kernel,
/// used by the device probe to prove nvcc output runs beside LibTorch.
/// No LibTorch here: plain pointers and a stream.

#include <cstdint>

#include <cuda_runtime_api.h>

namespace tandem::gpu::kernels {

/// Launches on `stream`; returns the launch's error code.
cudaError_t scale_add(float* y, const float* x, float a, float b, int64_t n,
                      cudaStream_t stream);

} // namespace tandem::gpu::kernels
