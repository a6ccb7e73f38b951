// Split-K decode attention over a KV cache with per-row lengths in device
// memory (decode_attention.hpp says what and why).
#include "gpu/kernels/decode_attention.hpp"

#include <cfloat>
#include <cmath>

#include "gpu/kernels/elem.cuh"

namespace tandem::gpu::kernels {

namespace {

constexpr int tile = 32;        // keys staged in shared memory at a time
constexpr int threads = 128;    // per CTA of the partial kernel
constexpr int max_queries = 64; // (H/K)·T
constexpr int max_dim = 128;

struct geometry {
  int groups, queries, span;
};

__host__ __device__ inline geometry geometry_of(const decode_attention_args& a) {
  geometry g;
  g.groups = a.heads / a.kv_heads;
  g.queries = g.groups * a.queries;
  const int per = (a.capacity + a.splits - 1) / a.splits;
  g.span = (per + tile - 1) / tile * tile;
  return g;
}

inline size_t shared_bytes(int q, int d) {
  return sizeof(float) * (static_cast<size_t>(q) * d * 2 + tile * (d + 1) + tile * d + q * tile + 3 * q);
}

/// Per (row, kv head, split): the softmax partials of the group's queries.
template <typename T>
__global__ void __launch_bounds__(threads) partial_kernel(decode_attention_args a) {
  extern __shared__ float sm[];
  const auto g = geometry_of(a);
  const int d = a.head_dim, dp = d + 1, q_n = g.queries, tq = a.queries;
  const int b = blockIdx.x / a.kv_heads, kh = blockIdx.x % a.kv_heads, s = blockIdx.y;
  const int64_t len = a.lengths[b];
  const int64_t last = len + tq - 1;  // the last key any query of the row sees
  const int64_t p_begin = static_cast<int64_t>(s) * g.span;
  int64_t p_end = p_begin + g.span;
  if (p_end > last + 1)
    p_end = last + 1;
  if (p_end > a.capacity)
    p_end = a.capacity;

  float* qs = sm;                 // [Q][d], pre-scaled
  float* ks = qs + q_n * d;       // [tile][d+1]
  float* vs = ks + tile * dp;     // [tile][d]
  float* sc = vs + tile * d;      // [Q][tile]: scores, then weights
  float* acc = sc + q_n * tile;   // [Q][d]
  float* mrow = acc + q_n * d;    // [Q]
  float* lrow = mrow + q_n;       // [Q]
  float* fac = lrow + q_n;        // [Q]

  const size_t base = (static_cast<size_t>(blockIdx.x) * a.splits + s) * q_n;
  float* po = a.workspace + base * d;
  float* pml = a.workspace + static_cast<size_t>(a.batch) * a.kv_heads * a.splits * q_n * d + base * 2;
  const int tid = threadIdx.x;

  if (p_begin >= p_end) {  // past the row's length: an empty split
    for (int i = tid; i < q_n * d; i += threads)
      po[i] = 0.0f;
    for (int i = tid; i < q_n; i += threads) {
      pml[2 * i] = -INFINITY;
      pml[2 * i + 1] = 0.0f;
    }
    return;
  }

  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  for (int i = tid; i < q_n * d; i += threads) {
    const int qi = i / d, dd = i % d;
    const int grp = qi / tq, t = qi % tq, h = kh * g.groups + grp;
    qs[i] = elem<T>::widen(q[((static_cast<size_t>(b) * a.heads + h) * tq + t) * d + dd]) * a.scale;
    acc[i] = 0.0f;
  }
  for (int i = tid; i < q_n; i += threads) {
    mrow[i] = -INFINITY;
    lrow[i] = 0.0f;
  }
  const size_t row = (static_cast<size_t>(b) * a.kv_heads + kh) * a.capacity;
  for (int64_t p0 = p_begin; p0 < p_end; p0 += tile) {
    const int n = static_cast<int>(p_end - p0 < tile ? p_end - p0 : tile);
    __syncthreads();  // the previous tile's weights and values are used up
    for (int i = tid; i < tile * d; i += threads) {
      const int j = i / d, dd = i % d;
      float kx = 0.0f, vx = 0.0f;
      if (j < n) {
        const size_t at = (row + p0 + j) * d + dd;
        kx = elem<T>::widen(k[at]);
        vx = elem<T>::widen(v[at]);
      }
      ks[j * dp + dd] = kx;
      vs[j * d + dd] = vx;
    }
    __syncthreads();
    for (int i = tid; i < q_n * tile; i += threads) {
      const int qi = i / tile, j = i % tile, t = qi % tq;
      float x = -INFINITY;
      if (j < n && p0 + j <= len + t) {
        const float* qr = qs + qi * d;
        const float* kr = ks + j * dp;
        float dot = 0.0f;
        for (int dd = 0; dd < d; ++dd)
          dot = fmaf(qr[dd], kr[dd], dot);
        x = dot;
      }
      sc[i] = x;
    }
    __syncthreads();
    for (int qi = tid; qi < q_n; qi += threads) {
      float* r = sc + qi * tile;
      float mx = -INFINITY;
      for (int j = 0; j < tile; ++j)
        mx = fmaxf(mx, r[j]);
      const float m_old = mrow[qi];
      const float m_new = fmaxf(m_old, mx);
      if (m_new == -INFINITY) {  // nothing visible yet
        for (int j = 0; j < tile; ++j)
          r[j] = 0.0f;
        fac[qi] = 1.0f;
        continue;
      }
      const float f = m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
      float sum = 0.0f;
      for (int j = 0; j < tile; ++j) {
        const float e = r[j] == -INFINITY ? 0.0f : __expf(r[j] - m_new);
        r[j] = e;
        sum += e;
      }
      lrow[qi] = lrow[qi] * f + sum;
      mrow[qi] = m_new;
      fac[qi] = f;
    }
    __syncthreads();
    for (int i = tid; i < q_n * d; i += threads) {
      const int qi = i / d, dd = i % d;
      const float* w = sc + qi * tile;
      float x = acc[i] * fac[qi];
      for (int j = 0; j < n; ++j)
        x = fmaf(w[j], vs[j * d + dd], x);
      acc[i] = x;
    }
  }
  __syncthreads();
  for (int i = tid; i < q_n * d; i += threads)
    po[i] = acc[i];
  for (int i = tid; i < q_n; i += threads) {
    pml[2 * i] = mrow[i];
    pml[2 * i + 1] = lrow[i];
  }
}

/// Per (row, query, head): the splits combined, normalised, narrowed.
template <typename T>
__global__ void combine_kernel(decode_attention_args a) {
  const auto g = geometry_of(a);
  const int d = a.head_dim, tq = a.queries, q_n = g.queries;
  const int h = blockIdx.x % a.heads;
  const int t = (blockIdx.x / a.heads) % tq;
  const int b = blockIdx.x / (a.heads * tq);
  const int kh = h / g.groups, qi = (h % g.groups) * tq + t;
  const size_t per_split = static_cast<size_t>(q_n);
  const size_t first = (static_cast<size_t>(b) * a.kv_heads + kh) * a.splits * per_split + qi;
  const float* po = a.workspace;
  const float* pml = a.workspace + static_cast<size_t>(a.batch) * a.kv_heads * a.splits * q_n * d;
  float mx = -INFINITY;
  for (int s = 0; s < a.splits; ++s)
    mx = fmaxf(mx, pml[2 * (first + s * per_split)]);
  for (int dd = threadIdx.x; dd < d; dd += blockDim.x) {
    float l = 0.0f, o = 0.0f;
    if (mx != -INFINITY)
      for (int s = 0; s < a.splits; ++s) {
        const size_t at = first + s * per_split;
        const float m = pml[2 * at];
        if (m == -INFINITY)
          continue;
        const float w = __expf(m - mx);
        l += pml[2 * at + 1] * w;
        o += po[at * d + dd] * w;
      }
    static_cast<T*>(a.out)[((static_cast<size_t>(b) * tq + t) * a.heads + h) * d + dd] =
      elem<T>::narrow(l > 0.0f ? o / l : 0.0f);
  }
}

constexpr int warp_kernel_warps = 4;

/// The bandwidth path (d = 32, 64 or 128; up to QN = 8 queries a CTA, more
/// queries over gridDim.z): per (row, kv head, split, query group) a CTA of
/// four warps; each warp takes its own 32-key tiles of the split, lane j
/// scoring key j against every query (its key row read with 16-byte loads
/// straight from global memory, the queries broadcast from shared memory),
/// an online softmax per query across the warp, then the tile's values read
/// a row at a time (each lane its d/32 elements) into per-lane fp32
/// accumulators.  Loads run a tile ahead: the first tile's keys and values
/// go out before the queries are staged, the next tile's keys as soon as the
/// scores are done, its values once this tile's are used.  The warps'
/// partials are merged in shared memory and written as partial_kernel's
/// are, so combine_kernel serves both.
template <typename T, int D, int QN>
__global__ void __launch_bounds__(warp_kernel_warps * 32) warp_partial_kernel(decode_attention_args a) {
  constexpr int W = warp_kernel_warps;
  constexpr int EPL = D / 32;                 // value elements a lane
  constexpr int VE = 16 / static_cast<int>(sizeof(T));  // key elements a 16-byte load
  constexpr int KV = D / VE;                  // 16-byte loads a key row
  constexpr int VB = sizeof(T) == 2 ? 16 : 8;  // value rows of a tile loaded ahead; the rest as they are used
  __shared__ float qs[QN][D];
  __shared__ float pw[W][QN][32];
  __shared__ float cm[W][QN], cl[W][QN];
  __shared__ float cacc[W][QN][D];
  const auto g = geometry_of(a);
  const int tq = a.queries, q_n = g.queries;
  const int b = blockIdx.x / a.kv_heads, kh = blockIdx.x % a.kv_heads, s = blockIdx.y;
  const int q0 = blockIdx.z * QN;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t len = a.lengths[b];
  const int64_t p_begin = static_cast<int64_t>(s) * g.span;
  int64_t p_end = p_begin + g.span;
  if (p_end > len + tq)
    p_end = len + tq;
  if (p_end > a.capacity)
    p_end = a.capacity;

  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  const size_t row = (static_cast<size_t>(b) * a.kv_heads + kh) * a.capacity;
  // A tile's loads: lane j's key row (KV 16-byte loads) and the first VB
  // value rows (lane's EPL elements of each; rows past the split's end
  // re-read its last row, weighted 0).  Issued a tile ahead: the next
  // tile's keys once the scores are done, its values once they are used.
  uint4 kreg[KV];
  lanes<T, EPL> vreg[VB];
  auto load_keys = [&](int64_t p0) {
    const int64_t key = p0 + lane;
    if (key < p_end) {
      const auto* kr = reinterpret_cast<const uint4*>(k + (row + key) * D);
#pragma unroll
      for (int c = 0; c < KV; ++c)
        kreg[c] = __ldg(kr + c);
    }
  };
  auto value_row = [&](int64_t p0, int j) {
    const int n = static_cast<int>(p_end - p0 < 32 ? p_end - p0 : 32);
    const int jj = j < n ? j : n - 1;
    return *reinterpret_cast<const lanes<T, EPL>*>(v + (row + p0 + jj) * D + lane * EPL);
  };
  auto load_values = [&](int64_t p0) {
#pragma unroll
    for (int j = 0; j < VB; ++j)
      vreg[j] = value_row(p0, j);
  };
  int64_t p0 = p_begin + warp * 32;
  if (p0 < p_end) {
    load_keys(p0);
    load_values(p0);
  }

  const T* q = static_cast<const T*>(a.q);
  for (int i = threadIdx.x; i < QN * D; i += W * 32) {
    const int qq = i / D, dd = i % D, qi = q0 + qq;
    float x = 0.0f;
    if (qi < q_n) {
      const int grp = qi / tq, t = qi % tq, h = kh * g.groups + grp;
      x = elem<T>::widen(q[((static_cast<size_t>(b) * a.heads + h) * tq + t) * D + dd]) * a.scale;
    }
    qs[qq][dd] = x;
  }
  __syncthreads();

  float m[QN], l[QN], acc[QN][EPL];
  int last[QN];  // the last key each query sees, from p_begin; −1: a padding query
#pragma unroll
  for (int qq = 0; qq < QN; ++qq) {
    m[qq] = -INFINITY;
    l[qq] = 0.0f;
#pragma unroll
    for (int e = 0; e < EPL; ++e)
      acc[qq][e] = 0.0f;
    last[qq] = q0 + qq < q_n ? static_cast<int>(len + (q0 + qq) % tq - p_begin) : -1;
  }
  for (; p0 < p_end; p0 += W * 32) {
    const int64_t key = p0 + lane, next = p0 + W * 32;
    const bool valid = key < p_end;
    float sc[QN];
#pragma unroll
    for (int qq = 0; qq < QN; ++qq)
      sc[qq] = 0.0f;
    if (valid) {
#pragma unroll
      for (int c = 0; c < KV; ++c) {
        lanes<T, VE> kt;
        memcpy(&kt, &kreg[c], sizeof kt);
#pragma unroll
        for (int e = 0; e < VE; ++e) {
          const float kf = elem<T>::widen(kt.t[e]);
#pragma unroll
          for (int qq = 0; qq < QN; ++qq)
            sc[qq] = fmaf(qs[qq][c * VE + e], kf, sc[qq]);
        }
      }
    }
    if (next < p_end)
      load_keys(next);
#pragma unroll
    for (int qq = 0; qq < QN; ++qq) {
      const bool vis = valid && static_cast<int>(key - p_begin) <= last[qq];
      const float x = vis ? sc[qq] : -INFINITY;
      const float mn = fmaxf(m[qq], warp_max(x));
      float p = 0.0f, f = 1.0f;
      if (mn != -INFINITY) {
        f = m[qq] == -INFINITY ? 0.0f : __expf(m[qq] - mn);
        p = vis ? __expf(x - mn) : 0.0f;
      }
      l[qq] = l[qq] * f + warp_sum(p);
      m[qq] = mn;
#pragma unroll
      for (int e = 0; e < EPL; ++e)
        acc[qq][e] *= f;
      pw[warp][qq][lane] = p;
    }
    __syncwarp();
    auto accumulate = [&](const lanes<T, EPL>& vv, int j) {
#pragma unroll
      for (int qq = 0; qq < QN; ++qq) {
        const float pj = pw[warp][qq][j];
#pragma unroll
        for (int e = 0; e < EPL; ++e)
          acc[qq][e] = fmaf(pj, elem<T>::widen(vv.t[e]), acc[qq][e]);
      }
    };
#pragma unroll
    for (int j = 0; j < VB; ++j)
      accumulate(vreg[j], j);
#pragma unroll 8
    for (int j = VB; j < 32; ++j)  // 4-byte types: the rest of the rows here
      accumulate(value_row(p0, j), j);
    if (next < p_end)
      load_values(next);
    __syncwarp();
  }
  // Merge the warps' partials.
#pragma unroll
  for (int qq = 0; qq < QN; ++qq) {
    if (lane == 0) {
      cm[warp][qq] = m[qq];
      cl[warp][qq] = l[qq];
    }
#pragma unroll
    for (int e = 0; e < EPL; ++e)
      cacc[warp][qq][lane * EPL + e] = acc[qq][e];
  }
  __syncthreads();
  const size_t base = (static_cast<size_t>(blockIdx.x) * a.splits + s) * q_n;
  float* po = a.workspace + base * D;
  float* pml = a.workspace + static_cast<size_t>(a.batch) * a.kv_heads * a.splits * q_n * D + base * 2;
  for (int i = threadIdx.x; i < QN * D; i += W * 32) {
    const int qq = i / D, dd = i % D, qi = q0 + qq;
    if (qi >= q_n)
      continue;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; ++w)
      mx = fmaxf(mx, cm[w][qq]);
    float o = 0.0f, sum = 0.0f;
    if (mx != -INFINITY)
#pragma unroll
      for (int w = 0; w < W; ++w) {
        if (cm[w][qq] == -INFINITY)
          continue;
        const float f = __expf(cm[w][qq] - mx);
        o += cacc[w][qq][dd] * f;
        sum += cl[w][qq] * f;
      }
    po[static_cast<size_t>(qi) * D + dd] = o;
    if (dd == 0) {
      pml[2 * qi] = mx;
      pml[2 * qi + 1] = sum;
    }
  }
}

template <typename T, int D>
void launch_warp(const decode_attention_args& a, int q_n, cudaStream_t stream) {
  const dim3 threads_w(warp_kernel_warps * 32);
  auto grid = [&](int qn) { return dim3(a.batch * a.kv_heads, a.splits, (q_n + qn - 1) / qn); };
  if (q_n <= 1)
    warp_partial_kernel<T, D, 1><<<grid(1), threads_w, 0, stream>>>(a);
  else if (q_n <= 2)
    warp_partial_kernel<T, D, 2><<<grid(2), threads_w, 0, stream>>>(a);
  else if (q_n <= 4)
    warp_partial_kernel<T, D, 4><<<grid(4), threads_w, 0, stream>>>(a);
  else
    warp_partial_kernel<T, D, 8><<<grid(8), threads_w, 0, stream>>>(a);
}

template <typename T>
void launch(const decode_attention_args& a, cudaStream_t stream) {
  const auto g = geometry_of(a);
  if (a.head_dim == 128)
    launch_warp<T, 128>(a, g.queries, stream);
  else if (a.head_dim == 64)
    launch_warp<T, 64>(a, g.queries, stream);
  else if (a.head_dim == 32)
    launch_warp<T, 32>(a, g.queries, stream);
  else {
    const auto bytes = shared_bytes(g.queries, a.head_dim);
    cudaFuncSetAttribute(partial_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    partial_kernel<T><<<dim3(a.batch * a.kv_heads, a.splits), threads, bytes, stream>>>(a);
  }
  combine_kernel<T><<<a.batch * a.queries * a.heads, a.head_dim < 32 ? 32 : a.head_dim, 0, stream>>>(a);
}

} // namespace

int decode_attention_splits(int batch, int kv_heads, int capacity, int sms) {
  // A split of at least four tiles: one for each warp of the bandwidth path.
  const int tiles = (capacity + 4 * tile - 1) / (4 * tile);
  const int rows = batch * kv_heads > 0 ? batch * kv_heads : 1;
  int want = (2 * sms + rows - 1) / rows;
  if (want < 1)
    want = 1;
  return want < tiles ? want : (tiles > 0 ? tiles : 1);
}

size_t decode_attention_workspace(const decode_attention_args& a) {
  const auto g = geometry_of(a);
  return sizeof(float) * static_cast<size_t>(a.batch) * a.kv_heads * a.splits * g.queries * (a.head_dim + 2);
}

bool decode_attention(const decode_attention_args& a, cudaStream_t stream) {
  if (a.batch < 1 || a.kv_heads < 1 || a.heads % a.kv_heads != 0 || a.queries < 1 || a.queries > 16
      || a.head_dim < 4 || a.head_dim > max_dim || a.head_dim % 4 != 0 || a.capacity < 1 || a.splits < 1
      || (a.heads / a.kv_heads) * a.queries > max_queries || !a.q || !a.k || !a.v || !a.lengths || !a.out
      || !a.workspace)
    return false;
  switch (a.dtype) {
    case attn_dtype::bf16: launch<__nv_bfloat16>(a, stream); break;
    case attn_dtype::fp16: launch<__half>(a, stream); break;
    case attn_dtype::fp32: launch<float>(a, stream); break;
  }
  return true;
}

} // namespace tandem::gpu::kernels
