#pragma once
/// Element types of Tandem's kernels: widen to float for the arithmetic,
/// narrow back with round-to-nearest-even (as LibTorch's casts do).
/// Device code only; included by the .cu files.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace tandem::gpu::kernels {

template <typename T>
struct elem;

template <>
struct elem<__nv_bfloat16> {
  static __device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 narrow(float x) { return __float2bfloat16_rn(x); }
};

template <>
struct elem<__half> {
  static __device__ __forceinline__ float widen(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half narrow(float x) { return __float2half_rn(x); }
};

template <>
struct elem<float> {
  static __device__ __forceinline__ float widen(float x) { return x; }
  static __device__ __forceinline__ float narrow(float x) { return x; }
};

} // namespace tandem::gpu::kernels
