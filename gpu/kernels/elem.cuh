#pragma once
/// Element types of Tandem's kernels: widen to float for the arithmetic,
/// narrow back with round-to-nearest-even (as LibTorch's casts do); the
/// vector of N elements moved in one access, the full-warp reductions and
/// the SwiGLU value that several kernels share, and the CTA count of their
/// grid-stride loops.  Included by the .cu files.

#include <cstdint>

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

/// N consecutive elements of T, loaded and stored in one access.
template <typename T, int N>
struct alignas(sizeof(T) * N) lanes {
  T t[N];
};

/// The sum / max of v over the 32 lanes of a warp, in every lane.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// CTAs for a grid-stride loop over `items`, `threads` a CTA: one item a
/// thread, at most `cap` CTAs (the loop strides past them), at least one.
inline unsigned grid_stride_ctas(int64_t items, int threads, int64_t cap) {
  const int64_t wanted = (items + threads - 1) / threads;
  return static_cast<unsigned>(wanted < 1 ? 1 : wanted < cap ? wanted : cap);
}

/// silu(g) · u, silu as ATen computes it in fp32: x / (1 + exp(−x)).
__device__ __forceinline__ float swiglu_value(float g, float u) {
  return g / (1.f + expf(-g)) * u;
}

} // namespace tandem::gpu::kernels
