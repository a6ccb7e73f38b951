// Fused RMSNorm and RoPE, forward and backward (see norm_rope.hpp for the
// math, the rounding and the design).

#include "gpu/kernels/norm_rope.hpp"

#include <algorithm>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gpu/kernels/elem.cuh"

namespace tandem::gpu::kernels {
namespace {

constexpr int block_threads = 256;
constexpr unsigned full_mask = 0xffffffffu;
/// Most CTAs of the backward: fixes the number of dweight partial rows (and
/// so the reduction order) as a function of the sizes alone.
constexpr int64_t max_bwd_ctas = 512;

/// Rounds through T and back (the composite's cast to the input dtype).
template <typename T>
__device__ __forceinline__ float round_to(float x) {
  return elem<T>::widen(elem<T>::narrow(x));
}

/// One 16-byte chunk of T, widened to float.
template <typename T>
struct chunk {
  static constexpr int n = 16 / sizeof(T);
  float v[n];

  __device__ __forceinline__ void load(const T* p) {
    union {
      uint4 u;
      T t[n];
    } w;
    w.u = *reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int e = 0; e < n; ++e)
      v[e] = elem<T>::widen(w.t[e]);
  }

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int e = 0; e < n; ++e)
      v[e] = 0.f;
  }

  __device__ __forceinline__ void store(T* p) const {
    union {
      uint4 u;
      T t[n];
    } w;
#pragma unroll
    for (int e = 0; e < n; ++e)
      w.t[e] = elem<T>::narrow(v[e]);
    *reinterpret_cast<uint4*>(p) = w.u;
  }
};

/// `n` consecutive floats (n a multiple of 4, 16-byte aligned).
template <int n>
__device__ __forceinline__ void load_floats(float (&dst)[n], const float* p) {
#pragma unroll
  for (int e = 0; e < n; e += 4) {
    const float4 f = *reinterpret_cast<const float4*>(p + e);
    dst[e] = f.x;
    dst[e + 1] = f.y;
    dst[e + 2] = f.z;
    dst[e + 3] = f.w;
  }
}

/// Sum over the TPR threads of a row (all 256 threads of the CTA must call
/// it together).  Every thread of the row gets the same bits: the xor
/// butterfly adds the same pairs in every lane, and the cross-warp step reads
/// the warps' partials in a fixed order.
template <int TPR>
__device__ __forceinline__ float row_sum(float x, float* red) {
#pragma unroll
  for (int o = (TPR < 32 ? TPR : 32) / 2; o > 0; o /= 2)
    x += __shfl_xor_sync(full_mask, x, o);
  if constexpr (TPR > 32) {
    constexpr int warps = TPR / 32;
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0)
      red[warp] = x;
    __syncthreads();
    const int first = warp / warps * warps;
    x = red[first];
#pragma unroll
    for (int w = 1; w < warps; ++w)
      x += red[first + w];
    __syncthreads();  // red is reused by the next call
  }
  return x;
}

// ---- RMSNorm ---------------------------------------------------------------

/// The cos/sin of a lane's chunk (one of `vec` elements) of token `token`'s
/// row in [tokens, dim] tables: the norms' fused RoPE.
template <int vec>
__device__ __forceinline__ void rope_chunk(float (&c)[vec], float (&s)[vec], const float* cos, const float* sin,
                                           int64_t token, int dim, int lane) {
  const int64_t at = token * dim + lane * vec;
  load_floats(c, cos + at);
  load_floats(s, sin + at);
}

/// TPR threads a row, MAXV 16-byte chunks a thread; 256 / TPR rows a CTA.
template <typename T, int TPR, int MAXV>
__global__ void __launch_bounds__(block_threads)
rms_norm_fwd_kernel(rms_norm_fwd_args a) {
  constexpr int vec = chunk<T>::n;
  constexpr int rpc = block_threads / TPR;
  __shared__ float red[block_threads / 32];
  const int lane = threadIdx.x % TPR;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * rpc + threadIdx.x / TPR;
  const bool live = row < a.rows;
  const int chunks = a.dim / vec;
  const T* x = static_cast<const T*>(a.x) + row * a.dim;

  chunk<T> v[MAXV];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < MAXV; ++j) {
    const int c = lane + j * TPR;
    if (live && c < chunks)
      v[j].load(x + c * vec);
    else
      v[j].zero();
#pragma unroll
    for (int e = 0; e < vec; ++e)
      ss += v[j].v[e] * v[j].v[e];
  }
  ss = row_sum<TPR>(ss, red);
  // The composite: mean = sum · (1/D) (PyTorch's mean), + eps, rsqrt — in fp32.
  const float rstd = rsqrtf(ss * (1.f / static_cast<float>(a.dim)) + a.eps);
  const T* w = static_cast<const T*>(a.weight);
  T* y = static_cast<T*>(a.y) + row * a.dim;
  if constexpr (MAXV == 1) {
    if (a.rope_cos != nullptr) {  // RoPE on the normalised row (launch checked chunks == TPR)
      chunk<T> wv;
      wv.load(w + lane * vec);
      float c[vec], sn[vec];
      rope_chunk(c, sn, a.rope_cos, a.rope_sin, live ? row / a.rope_heads : 0, a.dim, lane);
      const bool low = lane < TPR / 2;
#pragma unroll
      for (int e = 0; e < vec; ++e) {
        // y = T(w · T(x · rstd)), then rope_kernel's forward on T(y): its partner
        // (distance D/2) is TPR/2 lanes away.
        const float yv = round_to<T>(__fmul_rn(wv.v[e], round_to<T>(__fmul_rn(v[0].v[e], rstd))));
        const float partner = __shfl_xor_sync(full_mask, yv, TPR / 2);
        const float rot = low ? -partner : partner;
        v[0].v[e] = __fadd_rn(round_to<T>(__fmul_rn(yv, round_to<T>(c[e]))),
                              round_to<T>(__fmul_rn(rot, round_to<T>(sn[e]))));
      }
      if (!live)
        return;
      if (a.rstd != nullptr && lane == 0)
        a.rstd[row] = rstd;
      v[0].store(y + lane * vec);
      return;
    }
  }
  if (!live)
    return;
  if (a.rstd != nullptr && lane == 0)
    a.rstd[row] = rstd;
#pragma unroll
  for (int j = 0; j < MAXV; ++j) {
    const int c = lane + j * TPR;
    if (c < chunks) {
      chunk<T> wv;
      wv.load(w + c * vec);
#pragma unroll
      for (int e = 0; e < vec; ++e)  // normalise in fp32, round to T, scale in T
        v[j].v[e] = __fmul_rn(wv.v[e], round_to<T>(__fmul_rn(v[j].v[e], rstd)));
      v[j].store(y + c * vec);
    }
  }
}

/// Grid-stride over rows; each thread keeps its columns' dweight sums in
/// registers, then the CTA writes one partial row (its row groups summed in
/// a fixed order).
template <typename T, int TPR, int MAXV>
__global__ void __launch_bounds__(block_threads)
rms_norm_bwd_kernel(rms_norm_bwd_args a) {
  constexpr int vec = chunk<T>::n;
  constexpr int rpc = block_threads / TPR;
  __shared__ float red[block_threads / 32];
  // MAXV > 1 only with TPR = 256 (one row a CTA); otherwise rpc · D <= 256 · vec.
  __shared__ float part[rpc > 1 ? block_threads * vec : 1];
  const int lane = threadIdx.x % TPR;
  const int group = threadIdx.x / TPR;
  const int chunks = a.dim / vec;
  const float inv_dim = 1.f / static_cast<float>(a.dim);
  const bool want_dw = a.dweight != nullptr;

  chunk<T> wv[MAXV];
  float acc[MAXV][vec];
#pragma unroll
  for (int j = 0; j < MAXV; ++j) {
    const int c = lane + j * TPR;
    if (c < chunks)
      wv[j].load(static_cast<const T*>(a.weight) + c * vec);
    else
      wv[j].zero();
#pragma unroll
    for (int e = 0; e < vec; ++e)
      acc[j][e] = 0.f;
  }

  for (int64_t base = static_cast<int64_t>(blockIdx.x) * rpc; base < a.rows;
       base += static_cast<int64_t>(gridDim.x) * rpc) {
    const int64_t row = base + group;
    const bool live = row < a.rows;
    const T* x = static_cast<const T*>(a.x) + row * a.dim;
    const T* dy = static_cast<const T*>(a.dy) + row * a.dim;
    const float rstd = live ? a.rstd[row] : 0.f;
    chunk<T> xh[MAXV], g[MAXV];  // x̂ and dy (then g = dy · w)
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < MAXV; ++j) {
      const int c = lane + j * TPR;
      if (live && c < chunks) {
        xh[j].load(x + c * vec);
        g[j].load(dy + c * vec);
      } else {
        xh[j].zero();
        g[j].zero();
      }
      if constexpr (MAXV == 1) {
        if (a.rope_cos != nullptr) {  // dy is RoPE's output gradient: rope_kernel's backward, rounded to T
          float cs[vec], sn[vec];
          rope_chunk(cs, sn, a.rope_cos, a.rope_sin, live ? row / a.rope_heads : 0, a.dim, lane);
          const bool low = lane < TPR / 2;
#pragma unroll
          for (int e = 0; e < vec; ++e) {
            const float p = g[j].v[e] * round_to<T>(sn[e]);
            const float partner = __shfl_xor_sync(full_mask, p, TPR / 2);
            const float own = g[j].v[e];
            const float cl = round_to<T>(cs[e]);
            g[j].v[e] = round_to<T>(low ? own * cl + partner : own * cl - partner);
          }
        }
      }
#pragma unroll
      for (int e = 0; e < vec; ++e) {
        xh[j].v[e] = __fmul_rn(xh[j].v[e], rstd);
        if (want_dw)  // dw sees the rounded normalised value, as the composite does
          acc[j][e] += g[j].v[e] * round_to<T>(xh[j].v[e]);
        g[j].v[e] *= wv[j].v[e];
        dot += g[j].v[e] * xh[j].v[e];
      }
    }
    dot = row_sum<TPR>(dot, red) * inv_dim;
    if (live && a.dx != nullptr) {
      T* dx = static_cast<T*>(a.dx) + row * a.dim;
      const T* add = a.dx_add == nullptr ? nullptr : static_cast<const T*>(a.dx_add) + row * a.dim;
#pragma unroll
      for (int j = 0; j < MAXV; ++j) {
        const int c = lane + j * TPR;
        if (c < chunks) {
#pragma unroll
          for (int e = 0; e < vec; ++e)
            g[j].v[e] = rstd * (g[j].v[e] - xh[j].v[e] * dot);
          if (add != nullptr) {  // the other use's gradient, before the one rounding
            chunk<T> r;
            r.load(add + c * vec);
#pragma unroll
            for (int e = 0; e < vec; ++e)
              g[j].v[e] += r.v[e];
          }
          g[j].store(dx + c * vec);
        }
      }
    }
  }
  if (!want_dw)
    return;
  float* out = a.partials + static_cast<int64_t>(blockIdx.x) * a.dim;
  if constexpr (rpc == 1) {
#pragma unroll
    for (int j = 0; j < MAXV; ++j) {
      const int c = lane + j * TPR;
      if (c < chunks) {
#pragma unroll
        for (int e = 0; e < vec; ++e)
          out[c * vec + e] = acc[j][e];
      }
    }
  } else {
    const int c = lane;  // MAXV == 1
    if (c < chunks) {
#pragma unroll
      for (int e = 0; e < vec; ++e)
        part[group * a.dim + c * vec + e] = acc[0][e];
    }
    __syncthreads();
    for (int col = threadIdx.x; col < a.dim; col += block_threads) {
      float s = part[col];
#pragma unroll
      for (int r = 1; r < rpc; ++r)
        s += part[r * a.dim + col];
      out[col] = s;
    }
  }
}

/// dweight[col] = Σ_p partials[p, col]: 32 columns × 8 slices a CTA, each
/// slice summing every 8th partial row in order, then the slices in order.
template <typename T>
__global__ void __launch_bounds__(block_threads)
dweight_reduce_kernel(const float* partials, int64_t parts, int dim, T* dweight) {
  constexpr int slices = block_threads / 32;
  __shared__ float sum[slices][32];
  const int col = blockIdx.x * 32 + threadIdx.x % 32;
  const int slice = threadIdx.x / 32;
  float s = 0.f;
  if (col < dim)
    for (int64_t p = slice; p < parts; p += slices)
      s += partials[p * dim + col];
  sum[slice][threadIdx.x % 32] = s;
  __syncthreads();
  if (slice == 0 && col < dim) {
    float t = sum[0][threadIdx.x];
#pragma unroll
    for (int i = 1; i < slices; ++i)
      t += sum[i][threadIdx.x];
    dweight[col] = elem<T>::narrow(t);
  }
}

/// The launch shape for rows of `dim` in `dtype`: TPR threads a row, MAXV
/// chunks a thread.  tpr = 0 when unsupported.
struct norm_config {
  int tpr = 0, maxv = 0, rows_per_cta = 0;
};

int chunk_elems(norm_dtype t) {
  return t == norm_dtype::fp32 ? 4 : 8;
}

norm_config config_for(int dim, norm_dtype dtype) {
  norm_config c;
  const int vec = chunk_elems(dtype);
  if (dim <= 0 || dim > 8192 || dim % vec != 0)
    return c;
  const int chunks = dim / vec;
  if (chunks <= block_threads) {
    c.tpr = 4;
    while (c.tpr < chunks)
      c.tpr *= 2;
    c.maxv = 1;
  } else {
    c.tpr = block_threads;
    c.maxv = 2;
    while (c.maxv * block_threads < chunks)
      c.maxv *= 2;
  }
  c.rows_per_cta = block_threads / c.tpr;
  return c;
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <typename T, int TPR, int MAXV>
cudaError_t launch_norm(bool backward, const rms_norm_fwd_args& f, const rms_norm_bwd_args& b,
                        int64_t grid, cudaStream_t stream) {
  if (backward)
    rms_norm_bwd_kernel<T, TPR, MAXV><<<static_cast<unsigned>(grid), block_threads, 0, stream>>>(b);
  else
    rms_norm_fwd_kernel<T, TPR, MAXV><<<static_cast<unsigned>(grid), block_threads, 0, stream>>>(f);
  return cudaGetLastError();
}

template <typename T>
cudaError_t dispatch_norm(const norm_config& c, bool backward, const rms_norm_fwd_args& f,
                          const rms_norm_bwd_args& b, int64_t grid, cudaStream_t stream) {
  if (c.maxv == 1) {
    switch (c.tpr) {
      case 4: return launch_norm<T, 4, 1>(backward, f, b, grid, stream);
      case 8: return launch_norm<T, 8, 1>(backward, f, b, grid, stream);
      case 16: return launch_norm<T, 16, 1>(backward, f, b, grid, stream);
      case 32: return launch_norm<T, 32, 1>(backward, f, b, grid, stream);
      case 64: return launch_norm<T, 64, 1>(backward, f, b, grid, stream);
      case 128: return launch_norm<T, 128, 1>(backward, f, b, grid, stream);
      case 256: return launch_norm<T, 256, 1>(backward, f, b, grid, stream);
      default: return cudaErrorInvalidValue;
    }
  }
  switch (c.maxv) {
    case 2: return launch_norm<T, 256, 2>(backward, f, b, grid, stream);
    case 4: return launch_norm<T, 256, 4>(backward, f, b, grid, stream);
    case 8: return launch_norm<T, 256, 8>(backward, f, b, grid, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t dispatch_norm(norm_dtype t, const norm_config& c, bool backward,
                          const rms_norm_fwd_args& f, const rms_norm_bwd_args& b, int64_t grid,
                          cudaStream_t stream) {
  switch (t) {
    case norm_dtype::bf16: return dispatch_norm<__nv_bfloat16>(c, backward, f, b, grid, stream);
    case norm_dtype::fp16: return dispatch_norm<__half>(c, backward, f, b, grid, stream);
    case norm_dtype::fp32: return dispatch_norm<float>(c, backward, f, b, grid, stream);
  }
  return cudaErrorInvalidValue;
}

int64_t bwd_grid(int64_t rows, const norm_config& c) {
  return std::min<int64_t>((rows + c.rows_per_cta - 1) / c.rows_per_cta, max_bwd_ctas);
}

// ---- RoPE ------------------------------------------------------------------

/// One thread: one 16-byte chunk of the first half of a row and the matching
/// chunk of the second half.  Rows are ordered (b, t, head), heads fastest,
/// so one (b, t) table row serves neighbouring threads.
template <typename T>
__global__ void __launch_bounds__(block_threads) rope_kernel(rope_args a, int64_t total) {
  constexpr int vec = chunk<T>::n;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * block_threads + threadIdx.x;
  if (idx >= total)
    return;
  const int half = a.head_dim / 2;
  const int per_half = half / vec;
  const int k = static_cast<int>(idx % per_half);
  int64_t r = idx / per_half;
  const int head = static_cast<int>(r % a.heads);
  r /= a.heads;
  const int t = static_cast<int>(r % a.tokens);
  const int b = static_cast<int>(r / a.tokens);

  const int64_t in_off = b * a.in.batch + head * a.in.head + t * a.in.token + k * vec;
  const int64_t out_off = b * a.out.batch + head * a.out.head + t * a.out.token + k * vec;
  const int64_t tab_off = b * a.table_batch + t * a.table_token + k * vec;
  chunk<T> x1, x2;
  x1.load(static_cast<const T*>(a.in.data) + in_off);
  x2.load(static_cast<const T*>(a.in.data) + in_off + half);
  float c1[vec], c2[vec], s1[vec], s2[vec];
  load_floats(c1, a.cos + tab_off);
  load_floats(c2, a.cos + tab_off + half);
  load_floats(s1, a.sin + tab_off);
  load_floats(s2, a.sin + tab_off + half);
  chunk<T> y1, y2;
#pragma unroll
  for (int e = 0; e < vec; ++e) {
    // The composite casts cos/sin to T first.
    const float cl = round_to<T>(c1[e]), ch = round_to<T>(c2[e]);
    const float sl = round_to<T>(s1[e]), sh = round_to<T>(s2[e]);
    if (!a.backward) {
      // y = T(T(x·c) + T(rot·s)), rot = (−x2, x1): each op rounds once, no FMA.
      y1.v[e] = __fadd_rn(round_to<T>(__fmul_rn(x1.v[e], cl)),
                          round_to<T>(__fmul_rn(-x2.v[e], sl)));
      y2.v[e] = __fadd_rn(round_to<T>(__fmul_rn(x2.v[e], ch)),
                          round_to<T>(__fmul_rn(x1.v[e], sh)));
    } else {
      // dx = dy·c + rotᵀ(dy·s): rotation by −θ, fp32 with one rounding.
      y1.v[e] = x1.v[e] * cl + x2.v[e] * sh;
      y2.v[e] = x2.v[e] * ch - x1.v[e] * sl;
    }
  }
  y1.store(static_cast<T*>(a.out.data) + out_off);
  y2.store(static_cast<T*>(a.out.data) + out_off + half);
}

} // namespace

const char* rms_norm_unsupported(int dim, norm_dtype dtype) {
  if (config_for(dim, dtype).tpr == 0)
    return dtype == norm_dtype::fp32 ? "rms_norm kernel: D must be 4..8192, a multiple of 4"
                                     : "rms_norm kernel: D must be 8..8192, a multiple of 8";
  return nullptr;
}

int64_t rms_norm_bwd_partial_rows(int64_t rows, int dim, norm_dtype dtype) {
  const auto c = config_for(dim, dtype);
  return c.tpr == 0 || rows <= 0 ? 0 : bwd_grid(rows, c);
}

const char* rms_norm_rope_unsupported(int dim, norm_dtype dtype) {
  // A row's chunks fill its TPR lanes exactly, within one warp (the partner
  // half is TPR/2 lanes away).
  const auto c = config_for(dim, dtype);
  if (c.tpr == 0 || c.maxv != 1 || c.tpr > 32 || c.tpr != dim / chunk_elems(dtype))
    return dtype == norm_dtype::fp32 ? "rms_norm + RoPE kernel: D must be 16, 32, 64 or 128"
                                     : "rms_norm + RoPE kernel: D must be 32, 64, 128 or 256";
  return nullptr;
}

/// No RoPE asked, or tables and a width the fused RoPE takes.
static bool rope_fits(int dim, norm_dtype dtype, const float* cos, const float* sin, int64_t heads) {
  if (cos == nullptr && sin == nullptr)
    return true;
  return cos != nullptr && sin != nullptr && heads >= 1 && aligned16(cos) && aligned16(sin)
         && rms_norm_rope_unsupported(dim, dtype) == nullptr;
}

cudaError_t rms_norm_forward(const rms_norm_fwd_args& a, cudaStream_t stream) {
  const auto c = config_for(a.dim, a.dtype);
  if (!rope_fits(a.dim, a.dtype, a.rope_cos, a.rope_sin, a.rope_heads))
    return cudaErrorInvalidValue;
  if (c.tpr == 0 || a.rows < 0 || !aligned16(a.x) || !aligned16(a.weight) || !aligned16(a.y))
    return cudaErrorInvalidValue;
  if (a.rows == 0)
    return cudaSuccess;
  const int64_t grid = (a.rows + c.rows_per_cta - 1) / c.rows_per_cta;
  if (grid > 0x7fffffff)
    return cudaErrorInvalidValue;
  return dispatch_norm(a.dtype, c, false, a, rms_norm_bwd_args{}, grid, stream);
}

cudaError_t rms_norm_backward(const rms_norm_bwd_args& a, cudaStream_t stream) {
  const auto c = config_for(a.dim, a.dtype);
  if (!rope_fits(a.dim, a.dtype, a.rope_cos, a.rope_sin, a.rope_heads))
    return cudaErrorInvalidValue;
  if (c.tpr == 0 || a.rows < 0 || !aligned16(a.x) || !aligned16(a.weight) || !aligned16(a.dy)
      || !aligned16(a.dx) || !aligned16(a.dx_add) || a.rstd == nullptr
      || (a.dweight != nullptr && a.partials == nullptr) || (a.dx_add != nullptr && a.dx == nullptr))
    return cudaErrorInvalidValue;
  if (a.dx == nullptr && a.dweight == nullptr)
    return cudaSuccess;
  if (a.rows == 0) {
    if (a.dweight != nullptr)  // no rows: dweight = 0
      return cudaMemsetAsync(a.dweight, 0,
                             static_cast<size_t>(a.dim) * (a.dtype == norm_dtype::fp32 ? 4 : 2),
                             stream);
    return cudaSuccess;
  }
  const int64_t grid = bwd_grid(a.rows, c);
  auto e = dispatch_norm(a.dtype, c, true, rms_norm_fwd_args{}, a, grid, stream);
  if (e != cudaSuccess || a.dweight == nullptr)
    return e;
  const unsigned cols = static_cast<unsigned>((a.dim + 31) / 32);
  switch (a.dtype) {
    case norm_dtype::bf16:
      dweight_reduce_kernel<<<cols, block_threads, 0, stream>>>(
        a.partials, grid, a.dim, static_cast<__nv_bfloat16*>(a.dweight));
      break;
    case norm_dtype::fp16:
      dweight_reduce_kernel<<<cols, block_threads, 0, stream>>>(
        a.partials, grid, a.dim, static_cast<__half*>(a.dweight));
      break;
    case norm_dtype::fp32:
      dweight_reduce_kernel<<<cols, block_threads, 0, stream>>>(
        a.partials, grid, a.dim, static_cast<float*>(a.dweight));
      break;
  }
  return cudaGetLastError();
}

const char* rope_unsupported(int head_dim, norm_dtype dtype) {
  const int vec = chunk_elems(dtype);
  if (head_dim <= 0 || head_dim % (2 * vec) != 0)
    return dtype == norm_dtype::fp32 ? "rope kernel: head_dim must be a multiple of 8"
                                     : "rope kernel: head_dim must be a multiple of 16";
  return nullptr;
}

cudaError_t rope_apply(const rope_args& a, cudaStream_t stream) {
  if (rope_unsupported(a.head_dim, a.dtype) != nullptr || a.batch < 0 || a.heads < 0
      || a.tokens < 0)
    return cudaErrorInvalidValue;
  const int64_t vec = chunk_elems(a.dtype);
  auto strides_ok = [&](const rope_tensor& t) {
    return aligned16(t.data) && t.batch % vec == 0 && t.head % vec == 0 && t.token % vec == 0;
  };
  if (!strides_ok(a.in) || !strides_ok(a.out) || !aligned16(a.cos) || !aligned16(a.sin)
      || a.table_batch % 4 != 0 || a.table_token % 4 != 0)
    return cudaErrorInvalidValue;
  const int64_t total =
    static_cast<int64_t>(a.batch) * a.heads * a.tokens * (a.head_dim / 2 / vec);
  if (total == 0)
    return cudaSuccess;
  const int64_t grid = (total + block_threads - 1) / block_threads;
  if (grid > 0x7fffffff)
    return cudaErrorInvalidValue;
  switch (a.dtype) {
    case norm_dtype::bf16:
      rope_kernel<__nv_bfloat16><<<static_cast<unsigned>(grid), block_threads, 0, stream>>>(a, total);
      break;
    case norm_dtype::fp16:
      rope_kernel<__half><<<static_cast<unsigned>(grid), block_threads, 0, stream>>>(a, total);
      break;
    case norm_dtype::fp32:
      rope_kernel<float><<<static_cast<unsigned>(grid), block_threads, 0, stream>>>(a, total);
      break;
  }
  return cudaGetLastError();
}

} // namespace tandem::gpu::kernels
