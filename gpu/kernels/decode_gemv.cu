// The decode step's projections at a few tokens (see decode_gemv.hpp for the
// math, the rounding and the design).

#include "gpu/kernels/decode_gemv.hpp"

#include <algorithm>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gpu/kernels/elem.cuh"
#include "gpu/kernels/pdl.cuh"

namespace tandem::gpu::kernels {
namespace {

constexpr int warps_per_cta = 8;
constexpr int threads = warps_per_cta * 32;
constexpr int unroll = 4;  // 16-byte loads a lane per row in flight (two rows: eight)
constexpr int max_rows = 4;
constexpr size_t max_smem = 96 * 1024;

/// A 16-byte load of weights that are read once a step: through the
/// non-coherent path, not allocated in L1.
__device__ __forceinline__ uint4 stream_load(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

/// Eight packed elements of T to float.
template <typename T>
__device__ __forceinline__ void widen8(const uint4& v, float (&f)[8]);

template <>
__device__ __forceinline__ void widen8<__nv_bfloat16>(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

template <>
__device__ __forceinline__ void widen8<__half>(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 h;
    static_assert(sizeof(h) == sizeof(uint32_t));
    memcpy(&h, &w[i], sizeof h);
    const float2 t = __half22float2(h);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

template <typename T>
__device__ __forceinline__ uint4 narrow8(const float (&f)[8]) {
  T t[8];
#pragma unroll
  for (int e = 0; e < 8; ++e)
    t[e] = elem<T>::narrow(f[e]);
  uint4 v;
  memcpy(&v, t, sizeof v);
  return v;
}

enum prologue { plain = 0, norm = 1, swiglu = 2 };

/// One CTA: x̂ into shared memory, then row pairs of W, grid-strided.
template <typename T, int M, int PRO, bool RESID>
__global__ void __launch_bounds__(threads) gemv_kernel(decode_gemv_args a) {
  extern __shared__ uint4 xs[];  // [M][k / 8]
  __shared__ float red[M][warps_per_cta];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t kv = a.k / 8;
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.w);
  const int64_t pairs = (a.n + 1) / 2;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * warps_per_cta + warp;
  // Pair p holds rows 2p and 2p + 1 (an odd n: the last row twice, written once).
  auto second_row = [&](int64_t p) { return min(2 * p + 1, a.n - 1); };
  // The first pair's first loads go out before x̂ is staged: the weights do
  // not depend on it, and staging would otherwise delay every load.
  uint4 pre0[unroll], pre1[unroll];
  const bool prefetched = first < pairs && 32 * unroll <= kv;
  if (prefetched) {
    const int64_t r0 = 2 * first, r1 = second_row(first);
#pragma unroll
    for (int u = 0; u < unroll; ++u) {
      pre0[u] = stream_load(reinterpret_cast<const uint4*>(w + r0 * a.k) + lane + 32 * u);
      pre1[u] = stream_load(reinterpret_cast<const uint4*>(w + r1 * a.k) + lane + 32 * u);
    }
  }
  // x (and the residual) may come from the kernel before: wait for it here.
  pdl_wait();
  pdl_trigger();

  if constexpr (PRO == swiglu) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const auto* gr = reinterpret_cast<const uint4*>(x + m * a.ldx);
      const auto* ur = reinterpret_cast<const uint4*>(x + m * a.ldx + a.k);
      for (int64_t v = threadIdx.x; v < kv; v += threads) {
        float g[8], u[8];
        widen8<T>(gr[v], g);
        widen8<T>(ur[v], u);
#pragma unroll
        for (int e = 0; e < 8; ++e)  // one rounding, as swiglu_rows
          g[e] = swiglu_value(g[e], u[e]);
        xs[m * kv + v] = narrow8<T>(g);
      }
    }
  } else if constexpr (PRO == norm) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const auto* xr = reinterpret_cast<const uint4*>(x + m * a.ldx);
      float ss = 0.f;
      for (int64_t v = threadIdx.x; v < kv; v += threads) {
        float f[8];
        widen8<T>(xr[v], f);
#pragma unroll
        for (int e = 0; e < 8; ++e)
          ss = fmaf(f[e], f[e], ss);
      }
      ss = warp_sum(ss);
      if (lane == 0)
        red[m][warp] = ss;
    }
    __syncthreads();
    const auto* nw = reinterpret_cast<const uint4*>(a.norm_weight);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < warps_per_cta; ++w)
        s += red[m][w];
      const float rstd = rsqrtf(s / static_cast<float>(a.k) + a.eps);
      const auto* xr = reinterpret_cast<const uint4*>(x + m * a.ldx);
      for (int64_t v = threadIdx.x; v < kv; v += threads) {
        float f[8], g[8];
        widen8<T>(xr[v], f);
        widen8<T>(nw[v], g);
#pragma unroll
        for (int e = 0; e < 8; ++e)  // T(w · T(x · rstd)), as rms_norm rounds
          f[e] = g[e] * elem<T>::widen(elem<T>::narrow(f[e] * rstd));
        xs[m * kv + v] = narrow8<T>(f);
      }
    }
  } else {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const auto* xr = reinterpret_cast<const uint4*>(x + m * a.ldx);
      for (int64_t v = threadIdx.x; v < kv; v += threads)
        xs[m * kv + v] = xr[v];
    }
  }
  __syncthreads();

  const T* res = static_cast<const T*>(a.residual);
  T* y = static_cast<T*>(a.y);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * warps_per_cta;
  for (int64_t p = first; p < pairs; p += stride) {
    const int64_t r0 = 2 * p, r1 = second_row(p);
    const auto* w0 = reinterpret_cast<const uint4*>(w + r0 * a.k);
    const auto* w1 = reinterpret_cast<const uint4*>(w + r1 * a.k);
    float acc0[M], acc1[M];
#pragma unroll
    for (int m = 0; m < M; ++m)
      acc0[m] = acc1[m] = 0.f;
    auto consume = [&](const uint4& b0, const uint4& b1, int64_t v) {
      float f0[8], f1[8];
      widen8<T>(b0, f0);
      widen8<T>(b1, f1);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xf[8];
        widen8<T>(xs[m * kv + v], xf);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          acc0[m] = fmaf(xf[e], f0[e], acc0[m]);
          acc1[m] = fmaf(xf[e], f1[e], acc1[m]);
        }
      }
    };
    int64_t v = lane;
    if (p == first && prefetched) {
#pragma unroll
      for (int u = 0; u < unroll; ++u)
        consume(pre0[u], pre1[u], v + 32 * u);
      v += 32 * unroll;
    }
    for (; v + 32 * (unroll - 1) < kv; v += 32 * unroll) {
      uint4 b0[unroll], b1[unroll];
#pragma unroll
      for (int u = 0; u < unroll; ++u) {
        b0[u] = stream_load(w0 + v + 32 * u);
        b1[u] = stream_load(w1 + v + 32 * u);
      }
#pragma unroll
      for (int u = 0; u < unroll; ++u)
        consume(b0[u], b1[u], v + 32 * u);
    }
    for (; v < kv; v += 32)
      consume(stream_load(w0 + v), stream_load(w1 + v), v);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      acc0[m] = warp_sum(acc0[m]);
      acc1[m] = warp_sum(acc1[m]);
    }
    // Lane m writes row m's two outputs.
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (lane != m)
        continue;
      float o0 = acc0[m], o1 = acc1[m];
      if constexpr (RESID) {
        o0 += elem<T>::widen(res[m * a.ldr + r0]);
        o1 += elem<T>::widen(res[m * a.ldr + r1]);
      }
      y[m * a.ldy + r0] = elem<T>::narrow(o0);
      if (r1 != r0)
        y[m * a.ldy + r1] = elem<T>::narrow(o1);
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

size_t element_bytes(gemv_dtype t) { return t == gemv_dtype::bf16 ? sizeof(__nv_bfloat16) : sizeof(__half); }

template <typename T, int M, int PRO, bool RESID>
cudaError_t launch(const decode_gemv_args& a, cudaStream_t stream) {
  auto* kernel = gemv_kernel<T, M, PRO, RESID>;
  const size_t smem = static_cast<size_t>(M) * static_cast<size_t>(a.k) * sizeof(T);
  if (smem > 48 * 1024) {
    if (auto e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(max_smem));
        e != cudaSuccess)
      return e;
  }
  int device = 0, sms = 0, per_sm = 0;
  if (auto e = cudaGetDevice(&device); e != cudaSuccess)
    return e;
  if (auto e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess)
    return e;
  if (auto e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem); e != cudaSuccess)
    return e;
  // As many CTAs as fit at once, then as few as give every warp the same
  // number of row pairs (the last wave would otherwise run half empty).
  const int64_t pairs = (a.n + 1) / 2;
  const int64_t most = std::max<int64_t>(1, static_cast<int64_t>(sms) * std::max(per_sm, 1));
  const int64_t rounds = (pairs + most * warps_per_cta - 1) / (most * warps_per_cta);
  const int64_t ctas = (pairs + rounds * warps_per_cta - 1) / (rounds * warps_per_cta);
  return launch_pdl(kernel, dim3(static_cast<unsigned>(ctas)), dim3(threads), smem, stream, a);
}

template <typename T, int M>
cudaError_t launch_m(const decode_gemv_args& a, cudaStream_t stream) {
  const bool resid = a.residual != nullptr;
  if (a.norm_weight)
    return resid ? launch<T, M, norm, true>(a, stream) : launch<T, M, norm, false>(a, stream);
  if (a.swiglu_input)
    return resid ? launch<T, M, swiglu, true>(a, stream) : launch<T, M, swiglu, false>(a, stream);
  return resid ? launch<T, M, plain, true>(a, stream) : launch<T, M, plain, false>(a, stream);
}

template <typename T>
cudaError_t launch_t(const decode_gemv_args& a, cudaStream_t stream) {
  switch (a.m) {
  case 1: return launch_m<T, 1>(a, stream);
  case 2: return launch_m<T, 2>(a, stream);
  case 3: return launch_m<T, 3>(a, stream);
  default: return launch_m<T, 4>(a, stream);
  }
}

} // namespace

const char* decode_gemv_unsupported(const decode_gemv_args& a) {
  if (a.m < 1 || a.m > max_rows)
    return "more than 4 rows (or none)";
  if (a.n < 1 || a.k < 8 || a.k % 8 != 0)
    return "k not a positive multiple of 8 (or n < 1)";
  if (static_cast<size_t>(a.m) * static_cast<size_t>(a.k) * element_bytes(a.dtype) > max_smem)
    return "m · k elements over 96 KiB";
  if (!a.x || !a.w || !aligned16(a.x) || !aligned16(a.w) || (a.m > 1 && a.ldx % 8 != 0))
    return "x or W not 16-byte aligned";
  if (a.ldx < (a.swiglu_input ? 2 * a.k : a.k) || (a.m > 1 && a.ldy < a.n) || (a.residual && a.m > 1 && a.ldr < a.n))
    return "a row stride shorter than its row";
  if (a.swiglu_input && a.norm_weight)
    return "both a norm and a SwiGLU prologue";
  if (a.norm_weight && !aligned16(a.norm_weight))
    return "norm weight not 16-byte aligned";
  return nullptr;
}

cudaError_t decode_gemv(const decode_gemv_args& a, cudaStream_t stream) {
  if (decode_gemv_unsupported(a) || !a.y)
    return cudaErrorInvalidValue;
  return a.dtype == gemv_dtype::bf16 ? launch_t<__nv_bfloat16>(a, stream) : launch_t<__half>(a, stream);
}

} // namespace tandem::gpu::kernels
