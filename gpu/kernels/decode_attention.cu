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

template <typename T>
void launch(const decode_attention_args& a, cudaStream_t stream) {
  const auto g = geometry_of(a);
  const auto bytes = shared_bytes(g.queries, a.head_dim);
  cudaFuncSetAttribute(partial_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  partial_kernel<T><<<dim3(a.batch * a.kv_heads, a.splits), threads, bytes, stream>>>(a);
  combine_kernel<T><<<a.batch * a.queries * a.heads, a.head_dim < 32 ? 32 : a.head_dim, 0, stream>>>(a);
}

} // namespace

int decode_attention_splits(int batch, int kv_heads, int capacity, int sms) {
  const int tiles = (capacity + tile - 1) / tile;
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
