// The target's packed-forward elementwise kernels (see target_fused.hpp for
// the math, the rounding and the design).

#include "gpu/kernels/target_fused.hpp"

#include <algorithm>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gpu/kernels/elem.cuh"

namespace tandem::gpu::kernels {
namespace {

constexpr int warps_per_cta = 8;
constexpr unsigned full_mask = 0xffffffffu;

template <typename T>
__device__ __forceinline__ float round_to(float x) {
  return elem<T>::widen(elem<T>::narrow(x));
}

/// A (token, head) row of h = EPL·LPR elements is held by LPR lanes (16 or
/// 32), EPL elements a lane.  A warp takes one token: its cos/sin once into
/// registers, then its H + K query and key heads, 32 / LPR at a time.
template <typename T, int EPL, int LPR>
__global__ void __launch_bounds__(warps_per_cta * 32) qk_norm_rope_kernel(qk_norm_rope_args a, int split) {
  constexpr int rows_per_pass = 32 / LPR;
  const int lane = threadIdx.x & 31;
  const int sub = lane % LPR;  // lane within the row
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * warps_per_cta + (threadIdx.x >> 5);
  const int64_t t = gw / split;
  const int slice = static_cast<int>(gw % split);  // this warp's share of the token's heads
  if (t >= a.tokens)  // a whole warp: no shuffle is left waiting
    return;
  const int h = a.head_dim;
  const int per_token = a.heads + a.kv_heads;
  const bool cached = a.k_cache != nullptr;
  const int rows = cached ? per_token + a.kv_heads : per_token;  // + the value heads, copied
  float c[EPL], s[EPL];
#pragma unroll
  for (int e = 0; e < EPL; ++e) {  // the composite casts cos/sin to T first
    c[e] = round_to<T>(a.cos[t * h + sub * EPL + e]);
    s[e] = round_to<T>(a.sin[t * h + sub * EPL + e]);
  }
  const bool low = sub < LPR / 2;
  T* base = static_cast<T*>(a.qkv) + t * a.row_stride + sub * EPL;
  const T* qw = static_cast<const T*>(a.q_norm) + sub * EPL;
  const T* kw = static_cast<const T*>(a.k_norm) + sub * EPL;
  // Where this token's keys and values go in the cache (cached only).
  int64_t pos = 0, cache_row = 0;
  if (cached) {
    const int64_t r = t / a.tokens_per_row;
    pos = a.lengths[r] + t % a.tokens_per_row;
    cache_row = r * a.kv_heads;
  }
  auto to_cache = [&](void* cache, int kh, const lanes<T, EPL>& v) {
    if (pos < a.capacity)
      *reinterpret_cast<lanes<T, EPL>*>(static_cast<T*>(cache) + ((cache_row + kh) * a.capacity + pos) * h
                                        + sub * EPL) = v;
  };
  // The next pass's row is loaded before this pass's shuffles (one row in
  // flight behind the arithmetic: the loads are the latency).
  auto load = [&](int head, lanes<T, EPL>& xv) {
    if (head < rows)
      xv = *reinterpret_cast<const lanes<T, EPL>*>(base + static_cast<int64_t>(head) * h);
  };
  const int step = rows_per_pass * split;
  lanes<T, EPL> next{};
  load(slice * rows_per_pass + lane / LPR, next);
  for (int head0 = slice * rows_per_pass; head0 < rows; head0 += step) {
    const int head = head0 + lane / LPR;
    const bool live = head < rows;
    const lanes<T, EPL> xv = next;
    load(head + step, next);
    if (head0 >= per_token) {  // a pass of value heads only: copied to the cache (warp-uniform)
      if (live)
        to_cache(a.v_cache, head - per_token, xv);
      continue;
    }
    const auto wv = *reinterpret_cast<const lanes<T, EPL>*>(head < a.heads ? qw : kw);
    float v[EPL];
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < EPL; ++e) {
      v[e] = elem<T>::widen(xv.t[e]);
      ss += v[e] * v[e];
    }
#pragma unroll
    for (int o = LPR / 2; o > 0; o >>= 1)
      ss += __shfl_xor_sync(full_mask, ss, o);
    // The composite: mean = sum · (1/h), + eps, rsqrt — in fp32; normalise,
    // round to T, scale by the weight in T (rounded again: rms_norm's output).
    const float rstd = rsqrtf(ss * (1.f / static_cast<float>(h)) + a.eps);
#pragma unroll
    for (int e = 0; e < EPL; ++e)
      v[e] = round_to<T>(__fmul_rn(elem<T>::widen(wv.t[e]), round_to<T>(__fmul_rn(v[e], rstd))));
    // RoPE, rotate_half: the partner of element i (distance h/2) is LPR/2 lanes away.
    lanes<T, EPL> out;
#pragma unroll
    for (int e = 0; e < EPL; ++e) {
      const float partner = __shfl_xor_sync(full_mask, v[e], LPR / 2);
      const float rot = low ? -partner : partner;
      out.t[e] = elem<T>::narrow(__fadd_rn(round_to<T>(__fmul_rn(v[e], c[e])), round_to<T>(__fmul_rn(rot, s[e]))));
    }
    if (live && head < per_token) {
      *reinterpret_cast<lanes<T, EPL>*>(base + static_cast<int64_t>(head) * h) = out;
      if (cached && head >= a.heads)
        to_cache(a.k_cache, head - a.heads, out);
    } else if (live) {  // a value head in a pass that began with key heads (h = 16: two rows a pass)
      to_cache(a.v_cache, head - per_token, xv);
    }
  }
}

template <typename T>
cudaError_t launch_qk(const qk_norm_rope_args& a, cudaStream_t stream) {
  // Few tokens (a decode step): several warps a token, so that ~1024 warps
  // share the heads instead of one warp walking them all.
  const int rows = a.heads + a.kv_heads + (a.k_cache ? a.kv_heads : 0);
  int64_t split = a.tokens > 0 ? std::min<int64_t>(rows, std::max<int64_t>(1, 1024 / a.tokens)) : 1;
  const int64_t ctas = (a.tokens * split + warps_per_cta - 1) / warps_per_cta;
  if (ctas == 0)
    return cudaSuccess;
  if (ctas > 0x7fffffff)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(ctas)), block(warps_per_cta * 32);
  const int sp = static_cast<int>(split);
  switch (a.head_dim) {
  case 16: qk_norm_rope_kernel<T, 1, 16><<<grid, block, 0, stream>>>(a, sp); break;
  case 32: qk_norm_rope_kernel<T, 1, 32><<<grid, block, 0, stream>>>(a, sp); break;
  // 16 lanes a row from d = 64 on (two rows a pass, 8 or 16 bytes a lane):
  // half the passes of 32 lanes a row, wider accesses.
  case 64: qk_norm_rope_kernel<T, 4, 16><<<grid, block, 0, stream>>>(a, sp); break;
  case 128: qk_norm_rope_kernel<T, 8, 16><<<grid, block, 0, stream>>>(a, sp); break;
  case 256: qk_norm_rope_kernel<T, 8, 32><<<grid, block, 0, stream>>>(a, sp); break;
  default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

/// The grid-stride form, for more tokens than a grid's y dimension takes
/// (65535); swiglu_rows_2d_kernel below otherwise.
template <typename T>
__global__ void swiglu_rows_kernel(swiglu_rows_args a) {
  constexpr int n = 8;  // one 16-byte chunk a thread
  const int64_t chunks_per_row = a.inter / n;
  const int64_t total = a.tokens * chunks_per_row;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < total;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = c / chunks_per_row, k = c % chunks_per_row;
    const T* g = static_cast<const T*>(a.gu) + t * 2 * a.inter + k * n;
    const auto gv = *reinterpret_cast<const lanes<T, n>*>(g);
    const auto uv = *reinterpret_cast<const lanes<T, n>*>(g + a.inter);
    lanes<T, n> o;
#pragma unroll
    for (int e = 0; e < n; ++e) {
      // silu(gate) · up in fp32, one rounding.
      o.t[e] = elem<T>::narrow(swiglu_value(elem<T>::widen(gv.t[e]), elem<T>::widen(uv.t[e])));
    }
    *reinterpret_cast<lanes<T, n>*>(static_cast<T*>(a.out) + t * a.inter + k * n) = o;
  }
}

/// One 16-byte chunk a thread, the token blockIdx.y and the chunk
/// blockIdx.x·256 + threadIdx.x: no 64-bit division and remainder a chunk,
/// which cost the grid-stride form 7% of its time (H100, 4 × 3072 tokens,
/// I 12288: 10.7 → 9.95 ms a forward; docs/bench.md, seventh pass).
template <typename T>
__global__ void swiglu_rows_2d_kernel(swiglu_rows_args a) {
  constexpr int n = 8;
  const int k = static_cast<int>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= static_cast<int>(a.inter / n))
    return;
  const int64_t t = blockIdx.y;
  const T* g = static_cast<const T*>(a.gu) + t * 2 * a.inter + static_cast<int64_t>(k) * n;
  const auto gv = *reinterpret_cast<const lanes<T, n>*>(g);
  const auto uv = *reinterpret_cast<const lanes<T, n>*>(g + a.inter);
  lanes<T, n> o;
#pragma unroll
  for (int e = 0; e < n; ++e)
    o.t[e] = elem<T>::narrow(swiglu_value(elem<T>::widen(gv.t[e]), elem<T>::widen(uv.t[e])));
  *reinterpret_cast<lanes<T, n>*>(static_cast<T*>(a.out) + t * a.inter + static_cast<int64_t>(k) * n) = o;
}

template <typename T>
cudaError_t launch_swiglu(const swiglu_rows_args& a, cudaStream_t stream) {
  const int64_t total = a.tokens * (a.inter / 8);
  if (total == 0)
    return cudaSuccess;
  const int threads = 256;
  if (a.tokens <= 65535 && a.inter / 8 <= 0x7fffffff) {
    const dim3 grid(static_cast<unsigned>((a.inter / 8 + threads - 1) / threads), static_cast<unsigned>(a.tokens));
    swiglu_rows_2d_kernel<T><<<grid, threads, 0, stream>>>(a);
    return cudaGetLastError();
  }
  swiglu_rows_kernel<T><<<grid_stride_ctas(total, threads, 132 * 16), threads, 0, stream>>>(a);
  return cudaGetLastError();
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

} // namespace

const char* qk_norm_rope_unsupported(int head_dim) {
  switch (head_dim) {
  case 16: case 32: case 64: case 128: case 256: return nullptr;
  default: return "head_dim is not 16, 32, 64, 128 or 256";
  }
}

cudaError_t qk_norm_rope(const qk_norm_rope_args& a, cudaStream_t stream) {
  if (a.tokens < 0 || a.heads <= 0 || a.kv_heads <= 0 || qk_norm_rope_unsupported(a.head_dim) != nullptr
      || a.row_stride < static_cast<int64_t>(a.heads + 2 * a.kv_heads) * a.head_dim || a.qkv == nullptr
      || a.q_norm == nullptr || a.k_norm == nullptr || a.cos == nullptr || a.sin == nullptr
      || !aligned16(a.qkv) || (a.row_stride * 2) % 16 != 0 || (a.head_dim * 2) % 16 != 0
      || !aligned16(a.q_norm) || !aligned16(a.k_norm)
      || (a.k_cache && (!a.v_cache || !a.lengths || a.capacity < 1 || a.tokens_per_row < 1
                        || !aligned16(a.k_cache) || !aligned16(a.v_cache))))
    return cudaErrorInvalidValue;
  return a.dtype == fused_dtype::bf16 ? launch_qk<__nv_bfloat16>(a, stream) : launch_qk<__half>(a, stream);
}

cudaError_t swiglu_rows(const swiglu_rows_args& a, cudaStream_t stream) {
  if (a.tokens < 0 || a.inter <= 0 || a.inter % 8 != 0 || a.gu == nullptr || a.out == nullptr
      || !aligned16(a.gu) || !aligned16(a.out))
    return cudaErrorInvalidValue;
  return a.dtype == fused_dtype::bf16 ? launch_swiglu<__nv_bfloat16>(a, stream)
                                      : launch_swiglu<__half>(a, stream);
}

} // namespace tandem::gpu::kernels
