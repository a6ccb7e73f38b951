#pragma once
/// Split-K decode attention ("flash decoding") over a KV cache whose rows'
/// lengths live in device memory, so that one captured CUDA graph serves
/// every step of a decode loop (gpu/decode/decoder.cpp): the grid is fixed
/// by the cache's capacity, and splits past a row's length exit at once.
///
/// Shapes (all contiguous): q [B, H, T, d] (T ≤ 16 new positions per row:
/// one decode token or one verified block), the caches k, v [B, K, C, d]
/// with the T new positions already written at len[b] … len[b]+T−1, and
/// len [B] int64 (the positions committed before this forward).  Query t of
/// row b attends to keys 0 … len[b]+t (causal over the new positions);
/// query head h reads kv head h / (H/K) (grouped-query attention, as
/// repeat_interleave).  out [B, T, H, d] (the o-projection's input layout).
///
/// Two kernels: (1) per (row, kv head, split of the cache) the softmax
/// partials — running max m, sum l and the unnormalised output — of the
/// H/K·T queries of that kv head over the split's keys, in fp32; (2) per
/// (row, query, head) the splits are combined: M = max m_s, out = Σ o_s
/// e^{m_s−M} / Σ l_s e^{m_s−M}.  Kernel (1) for d = 32, 64 or 128 (the
/// bandwidth path): a CTA of four warps per (row, kv head, split, group of
/// up to 8 queries), each warp its own 32-key tiles, lane j scoring key j
/// against the group's queries with its key row read in 16-byte loads, an
/// online softmax across the warp, then the values a row at a time, each
/// lane d/32 of them; the warps merged in shared memory.  Other d: a CTA per
/// (row, kv head, split) that stages tiles of 32 keys in shared memory.
/// The workspace (fp32 partials) is the caller's: graph-capturable, no
/// allocation, no synchronisation.  No LibTorch here.
///
/// Limits: d ≤ 128 and a multiple of 4; (H/K)·T ≤ 64; C ≥ 1.  Checked by
/// decode_attention(), which returns false (and launches nothing) otherwise.

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace tandem::gpu::kernels {

enum class attn_dtype { bf16, fp16, fp32 };

struct decode_attention_args {
  int batch = 0;       ///< B
  int heads = 0;       ///< H (query heads)
  int kv_heads = 0;    ///< K (divides H)
  int queries = 0;     ///< T: new positions per row, 1..16
  int head_dim = 0;    ///< d
  int capacity = 0;    ///< C: positions per cache row
  int splits = 1;      ///< S: splits of the cache per (row, kv head); decode_attention_splits
  float scale = 1.0f;  ///< 1/√d usually
  attn_dtype dtype = attn_dtype::bf16;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const int64_t* lengths = nullptr;  ///< [B] on the device
  void* out = nullptr;
  float* workspace = nullptr;  ///< decode_attention_workspace(...) bytes
};

/// A split count that fills the device: about two CTAs per SM over B·K·S,
/// each split at least four tiles (128 keys: a tile for each warp).
int decode_attention_splits(int batch, int kv_heads, int capacity, int sms);

/// Bytes of fp32 workspace the arguments need (partials of every split).
size_t decode_attention_workspace(const decode_attention_args& a);

/// Launches both kernels on `stream`.  False, launching nothing, when the
/// shapes are outside the limits above.
bool decode_attention(const decode_attention_args& a, cudaStream_t stream);

} // namespace tandem::gpu::kernels
