// Fused cross-entropy with the logits' gradient in place (see ce_grad.hpp
// for the math, the rounding and the design).

#include "gpu/kernels/ce_grad.hpp"

#include <algorithm>
#include <climits>
#include <cmath>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gpu/kernels/elem.cuh"

namespace tandem::gpu::kernels {
namespace {

constexpr int block_threads = 512;
constexpr int warps = block_threads / 32;
constexpr int unroll = 4;  ///< 16-byte loads a thread has in flight
constexpr unsigned full_mask = 0xffffffffu;

/// N consecutive elements of T, kept raw (widened on use, which keeps the
/// unrolled loads in registers): one 16-byte access when N · sizeof(T) = 16,
/// else N scalar accesses (the unaligned path, N = 1).
template <typename T, int N>
struct pack {
  static constexpr bool vector = N * sizeof(T) == 16;
  union {
    uint4 u;
    T t[N];
  } raw;

  __device__ __forceinline__ void load(const T* p) {
    if constexpr (vector) {
      raw.u = *reinterpret_cast<const uint4*>(p);
    } else {
#pragma unroll
      for (int e = 0; e < N; ++e)
        raw.t[e] = p[e];
    }
  }

  __device__ __forceinline__ float get(int e) const { return elem<T>::widen(raw.t[e]); }
  __device__ __forceinline__ void set(int e, float x) { raw.t[e] = elem<T>::narrow(x); }

  __device__ __forceinline__ void store(T* p) const {
    if constexpr (vector) {
      *reinterpret_cast<uint4*>(p) = raw.u;
    } else {
#pragma unroll
      for (int e = 0; e < N; ++e)
        p[e] = raw.t[e];
    }
  }
};

/// Online softmax statistics of a set of elements: max, Σ exp(x − max) and
/// the first index of the max (INT_MAX while empty).
struct online {
  float m = -INFINITY;
  float s = 0.f;
  int idx = INT_MAX;

  /// Adds `n` elements with indices j0, j0 + 1, ... (higher than any seen).
  template <typename P>
  __device__ __forceinline__ void add(const P& v, int j0) {
    constexpr int N = sizeof(v.raw.t) / sizeof(v.raw.t[0]);
    float lm = -INFINITY;
    int li = -1;
#pragma unroll
    for (int e = 0; e < N; ++e)
      if (v.get(e) > lm) {  // strict: the first index of a tie
        lm = v.get(e);
        li = e;
      }
    if (li >= 0 && lm > m) {
      s *= expf(m - lm);  // m = −inf: s is 0 and stays 0
      m = lm;
      idx = j0 + li;
    }
    if (m != -INFINITY) {
      // The fast exponential (ex2.approx, ~2 ulp): pass 1 is otherwise bound
      // by expf's instruction count; the sum of V terms averages the error
      // out (lse within ~1e-7 relative of the composite's).  Pass 2 uses expf,
      // the composite's exp, so g keeps its bits.
#pragma unroll
      for (int e = 0; e < N; ++e)
        s += __expf(v.get(e) - m);
    }
  }

  /// Merges another set; symmetric in its bits (both lanes of a butterfly
  /// get the same result).
  __device__ __forceinline__ void merge(float om, float os, int oi) {
    const float nm = fmaxf(m, om);
    const float a = m == -INFINITY ? 0.f : s * expf(m - nm);
    const float b = om == -INFINITY ? 0.f : os * expf(om - nm);
    int ni;
    if (m == om)
      ni = min(idx, oi);
    else
      ni = m > om ? idx : oi;
    m = nm;
    s = a + b;
    idx = ni;
  }
};

/// The whole CTA's statistics, the same bits in every thread: a butterfly
/// in each warp, then the warps' partials merged in a fixed order.
__device__ __forceinline__ online block_reduce(online st, float* sm, float* ss, int* si) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const float om = __shfl_xor_sync(full_mask, st.m, o);
    const float os = __shfl_xor_sync(full_mask, st.s, o);
    const int oi = __shfl_xor_sync(full_mask, st.idx, o);
    st.merge(om, os, oi);
  }
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) {
    sm[warp] = st.m;
    ss[warp] = st.s;
    si[warp] = st.idx;
  }
  __syncthreads();
  online all;
  all.m = sm[0];
  all.s = ss[0];
  all.idx = si[0];
#pragma unroll
  for (int w = 1; w < warps; ++w)
    all.merge(sm[w], ss[w], si[w]);
  return all;
}

/// One CTA a row (grid-stride).  N elements an access: 16 / sizeof(T) on
/// the aligned path, 1 otherwise.
template <typename T, int N>
__global__ void __launch_bounds__(block_threads, 2) ce_grad_kernel(ce_grad_args a) {
  __shared__ float red_m[warps], red_s[warps];
  __shared__ int red_i[warps];
  const int tid = threadIdx.x;
  const int vocab = static_cast<int>(a.vocab);
  const int chunks = vocab / N;
  const int tail = vocab - chunks * N;  // < N elements after the chunks

  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    T* x = static_cast<T*>(a.logits) + row * a.row_stride;
    const int64_t label = a.labels[row];
    const bool label_ok = label >= 0 && label < a.vocab;
    float picked = NAN;
    if (tid == 0 && label_ok)  // read before any thread overwrites the row
      picked = elem<T>::widen(x[label]);

    // Pass 1: max, Σ exp, argmax — forwards.
    online st;
    for (int c = tid; c < chunks; c += block_threads * unroll) {
      pack<T, N> p[unroll];
#pragma unroll
      for (int u = 0; u < unroll; ++u) {
        const int cu = c + u * block_threads;
        if (cu < chunks)
          p[u].load(x + static_cast<int64_t>(cu) * N);
      }
#pragma unroll
      for (int u = 0; u < unroll; ++u) {
        const int cu = c + u * block_threads;
        if (cu < chunks)
          st.add(p[u], cu * N);
      }
    }
    if (tid < tail) {
      const int j = chunks * N + tid;
      pack<T, 1> v;
      v.load(x + j);
      st.add(v, j);
    }
    const online all = block_reduce(st, red_m, red_s, red_i);
    // torch.logsumexp: log(Σ exp(x − m)) + m, with m = 0 when m is infinite.
    const float shift = all.m == INFINITY || all.m == -INFINITY ? 0.f : all.m;
    const float lse = logf(all.s) + shift;
    const float w = a.weight[row];
    if (tid == 0) {
      a.row_loss[row] = (lse - picked) * w;
      a.row_hit[row] = (label_ok && all.idx == label ? 1.f : 0.f) * a.mask[row];
      if (a.row_lse != nullptr)
        a.row_lse[row] = lse;
    }

    // Pass 2: g = (exp(x − lse) − [j = label]) · w — backwards, so the bytes
    // pass 1 read last (the likeliest still in L2) come first.
    if (a.write_grad) {
      const int lab = label_ok ? static_cast<int>(label) : -1;
      if (tid < tail) {
        const int j = chunks * N + tid;
        float e = expf(elem<T>::widen(x[j]) - lse);
        if (j == lab)
          e = e + -1.f;
        x[j] = elem<T>::narrow(e * w);
      }
      if (tid < chunks) {
        const int last = tid + (chunks - 1 - tid) / block_threads * block_threads;
        for (int c = last; c >= 0; c -= block_threads * unroll) {
          pack<T, N> p[unroll];
#pragma unroll
          for (int u = 0; u < unroll; ++u) {
            const int cu = c - u * block_threads;
            if (cu >= 0)
              p[u].load(x + static_cast<int64_t>(cu) * N);
          }
#pragma unroll
          for (int u = 0; u < unroll; ++u) {
            const int cu = c - u * block_threads;
            if (cu >= 0) {
#pragma unroll
              for (int e = 0; e < N; ++e) {
                // The composite: exp(x − lse), scatter_add −1 at the label, × w.
                float g = expf(p[u].get(e) - lse);
                if (cu * N + e == lab)
                  g = g + -1.f;
                p[u].set(e, g * w);
              }
              p[u].store(x + static_cast<int64_t>(cu) * N);
            }
          }
        }
      }
    }
    __syncthreads();  // the reduction's shared memory is reused by the next row
  }
}

template <typename T>
cudaError_t launch(const ce_grad_args& a, unsigned grid, cudaStream_t stream) {
  constexpr int vec = 16 / static_cast<int>(sizeof(T));
  const bool aligned = reinterpret_cast<uintptr_t>(a.logits) % 16 == 0
                       && (a.row_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0;
  if (aligned)
    ce_grad_kernel<T, vec><<<grid, block_threads, 0, stream>>>(a);
  else
    ce_grad_kernel<T, 1><<<grid, block_threads, 0, stream>>>(a);
  return cudaGetLastError();
}

/// dst = T(float(src) · *scale), V elements a thread (V = 1: any alignment).
template <typename T, int V>
__global__ void __launch_bounds__(256) ce_scale_kernel(const T* src, T* dst, int64_t chunks, const float* scale) {
  const float s = *scale;
  for (int64_t c = int64_t{blockIdx.x} * 256 + threadIdx.x; c < chunks; c += int64_t{gridDim.x} * 256) {
    lanes<T, V> x = reinterpret_cast<const lanes<T, V>*>(src)[c];
#pragma unroll
    for (int i = 0; i < V; ++i)
      x.t[i] = elem<T>::narrow(__fmul_rn(elem<T>::widen(x.t[i]), s));
    reinterpret_cast<lanes<T, V>*>(dst)[c] = x;
  }
}

template <typename T>
cudaError_t launch_scale(const ce_scale_args& a, cudaStream_t stream) {
  constexpr int v = 16 / sizeof(T);
  const bool wide = a.n % v == 0 && reinterpret_cast<uintptr_t>(a.src) % 16 == 0
                    && reinterpret_cast<uintptr_t>(a.dst) % 16 == 0;
  const int64_t chunks = wide ? a.n / v : a.n;
  const unsigned grid = grid_stride_ctas(chunks, 256, 132 * 32);
  const auto* s = static_cast<const T*>(a.src);
  auto* d = static_cast<T*>(a.dst);
  if (wide)
    ce_scale_kernel<T, v><<<grid, 256, 0, stream>>>(s, d, chunks, a.scale);
  else
    ce_scale_kernel<T, 1><<<grid, 256, 0, stream>>>(s, d, chunks, a.scale);
  return cudaGetLastError();
}

} // namespace

cudaError_t ce_scale(const ce_scale_args& a, cudaStream_t stream) {
  if (a.n < 0 || (a.n > 0 && (!a.src || !a.dst || !a.scale)))
    return cudaErrorInvalidValue;
  if (a.n == 0)
    return cudaSuccess;
  switch (a.dtype) {
    case ce_dtype::bf16: return launch_scale<__nv_bfloat16>(a, stream);
    case ce_dtype::fp16: return launch_scale<__half>(a, stream);
    case ce_dtype::fp32: return launch_scale<float>(a, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t ce_grad(const ce_grad_args& a, cudaStream_t stream) {
  if (a.rows < 0 || a.vocab <= 0 || a.vocab > INT_MAX - 16 || a.row_stride < a.vocab
      || a.ctas < 0)
    return cudaErrorInvalidValue;
  if (a.rows == 0)
    return cudaSuccess;
  if (a.logits == nullptr || a.labels == nullptr || a.weight == nullptr || a.mask == nullptr
      || a.row_loss == nullptr || a.row_hit == nullptr)
    return cudaErrorInvalidValue;
  int ctas = a.ctas;
  if (ctas == 0) {
    int dev = 0, sms = 0;
    if (auto e = cudaGetDevice(&dev); e != cudaSuccess)
      return e;
    if (auto e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        e != cudaSuccess)
      return e;
    ctas = 2 * sms;
  }
  const auto grid = static_cast<unsigned>(std::min<int64_t>(a.rows, ctas));
  switch (a.dtype) {
    case ce_dtype::bf16: return launch<__nv_bfloat16>(a, grid, stream);
    case ce_dtype::fp16: return launch<__half>(a, grid, stream);
    case ce_dtype::fp32: return launch<float>(a, grid, stream);
  }
  return cudaErrorInvalidValue;
}

} // namespace tandem::gpu::kernels
