#include "gpu/kernels/adamw_flat.hpp"

#include <cmath>

#include "gpu/kernels/elem.cuh"

namespace tandem::gpu::kernels {
namespace {

constexpr int vec = 8;  // elements per thread per iteration (16 bytes of bf16, 32 of fp32)
constexpr int threads = 256;

/// 8 elements of T as floats, from a 16-byte aligned address.
template <typename T>
struct pack8;

template <>
struct pack8<float> {
  static __device__ __forceinline__ void load(const float* p, float (&x)[vec]) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w;
    x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
  }
  static __device__ __forceinline__ void store(float* p, const float (&x)[vec]) {
    reinterpret_cast<float4*>(p)[0] = make_float4(x[0], x[1], x[2], x[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(x[4], x[5], x[6], x[7]);
  }
};

template <typename H>  // a 16-bit type: 8 of them in one uint4
struct pack8_half {
  static __device__ __forceinline__ void load(const H* p, float (&x)[vec]) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const H* h = reinterpret_cast<const H*>(&raw);
#pragma unroll
    for (int i = 0; i < vec; ++i)
      x[i] = elem<H>::widen(h[i]);
  }
  static __device__ __forceinline__ void store(H* p, const float (&x)[vec]) {
    uint4 raw;
    H* h = reinterpret_cast<H*>(&raw);
#pragma unroll
    for (int i = 0; i < vec; ++i)
      h[i] = elem<H>::narrow(x[i]);
    *reinterpret_cast<uint4*>(p) = raw;
  }
};
template <>
struct pack8<__nv_bfloat16> : pack8_half<__nv_bfloat16> {};
template <>
struct pack8<__half> : pack8_half<__half> {};

template <typename G>
__global__ void sumsq_kernel(const G* __restrict__ g, int64_t chunks, float* __restrict__ partial) {
  float acc = 0.f;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; c < chunks; c += stride) {
    float x[vec];
    pack8<G>::load(g + c * vec, x);
#pragma unroll
    for (int i = 0; i < vec; ++i)
      acc = fmaf(x[i], x[i], acc);
  }
  // Block reduction in a fixed order: warp shuffles, then the warps' sums.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    acc += __shfl_xor_sync(0xffffffffu, acc, o);
  __shared__ float warp_sum[threads / 32];
  if ((threadIdx.x & 31) == 0)
    warp_sum[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int w = 0; w < threads / 32; ++w)
      s += warp_sum[w];
    partial[blockIdx.x] = s;
  }
}

template <typename G, typename M>
__global__ void adamw_flat_kernel(adamw_flat_args a) {
  if (*a.skipped != 0.f)
    return;
  // Scalars as PyTorch's fused AdamW forms them: hyper-parameters in double,
  // bias corrections rounded to float, the clip factor in float (as the
  // foreach multiply that clip_grad_norm_ launches).
  const double lr = *a.lr, beta1 = a.beta1, beta2 = a.beta2, wd = a.weight_decay, eps = a.eps;
  const float t = *a.step;
  const float bias_correction1 = static_cast<float>(1.0 - pow(beta1, static_cast<double>(t)));
  const float bias_correction2 = static_cast<float>(1.0 - pow(beta2, static_cast<double>(t)));
  const float bias_correction2_sqrt = sqrtf(bias_correction2);
  const float coef = a.clip > 0.f ? fminf(1.f, a.clip / (*a.norm + 1e-6f)) : 1.f;
  const float step_size = static_cast<float>(lr / bias_correction1);

  const int64_t chunks = a.n / vec;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const G* grad = static_cast<const G*>(a.grad);
  M* model = static_cast<M*>(a.model);
  for (int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; c < chunks; c += stride) {
    const int64_t at = c * vec;
    float g[vec], p[vec], m[vec], v[vec];
    pack8<G>::load(grad + at, g);
    pack8<float>::load(a.master + at, p);
    pack8<float>::load(a.exp_avg + at, m);
    pack8<float>::load(a.exp_avg_sq + at, v);
#pragma unroll
    for (int i = 0; i < vec; ++i) {
      const float gi = g[i] * coef;
      float pi = p[i];
      if (wd != 0.0)
        pi = static_cast<float>(pi - lr * wd * pi);
      const float mi = static_cast<float>(beta1 * m[i] + (1.0 - beta1) * gi);
      const float vi = static_cast<float>(beta2 * v[i] + (1.0 - beta2) * gi * gi);
      const float denom = static_cast<float>(sqrtf(vi) / bias_correction2_sqrt + eps);
      p[i] = pi - step_size * mi / denom;
      m[i] = mi;
      v[i] = vi;
    }
    pack8<float>::store(a.master + at, p);
    pack8<float>::store(a.exp_avg + at, m);
    pack8<float>::store(a.exp_avg_sq + at, v);
    if (model)
      pack8<M>::store(model + at, p);
  }
}

int grid_for(int64_t chunks) {
  // Enough blocks to fill an H200 several times over; the loop strides.
  return static_cast<int>(grid_stride_ctas(chunks, threads, 132 * 16));
}

template <typename G>
cudaError_t launch_update(const adamw_flat_args& a, cudaStream_t stream) {
  const int blocks = grid_for(a.n / vec);
  switch (a.model_type) {
    case flat_type::bf16: adamw_flat_kernel<G, __nv_bfloat16><<<blocks, threads, 0, stream>>>(a); break;
    case flat_type::f16: adamw_flat_kernel<G, __half><<<blocks, threads, 0, stream>>>(a); break;
    case flat_type::f32: adamw_flat_kernel<G, float><<<blocks, threads, 0, stream>>>(a); break;
  }
  return cudaGetLastError();
}

bool aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

} // namespace

cudaError_t sumsq_partials(const void* g, flat_type type, int64_t n, float* partial, int blocks,
                           cudaStream_t stream) {
  if (n % vec != 0 || !aligned(g) || blocks < 1 || blocks > sumsq_max_blocks)
    return cudaErrorInvalidValue;
  const int64_t chunks = n / vec;
  switch (type) {
    case flat_type::f32:
      sumsq_kernel<float><<<blocks, threads, 0, stream>>>(static_cast<const float*>(g), chunks, partial);
      break;
    case flat_type::bf16:
      sumsq_kernel<__nv_bfloat16><<<blocks, threads, 0, stream>>>(static_cast<const __nv_bfloat16*>(g),
                                                                  chunks, partial);
      break;
    case flat_type::f16:
      sumsq_kernel<__half><<<blocks, threads, 0, stream>>>(static_cast<const __half*>(g), chunks, partial);
      break;
  }
  return cudaGetLastError();
}

cudaError_t adamw_flat(const adamw_flat_args& a, cudaStream_t stream) {
  if (a.n <= 0)
    return cudaSuccess;
  if (a.n % vec != 0 || !aligned(a.master) || !aligned(a.exp_avg) || !aligned(a.exp_avg_sq)
      || !aligned(a.grad) || (a.model && !aligned(a.model)) || !a.lr || !a.step || !a.norm || !a.skipped)
    return cudaErrorInvalidValue;
  switch (a.grad_type) {
    case flat_type::f32: return launch_update<float>(a, stream);
    case flat_type::bf16: return launch_update<__nv_bfloat16>(a, stream);
    case flat_type::f16: return launch_update<__half>(a, stream);
  }
  return cudaErrorInvalidValue;
}

} // namespace tandem::gpu::kernels
