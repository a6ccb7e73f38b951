#pragma once
/// Fused elementwise kernels of the target's packed forward (gpu/models/
/// qwen3_packed.cpp): the work between its fused GEMMs, one pass each.
/// No LibTorch here: raw pointers, element strides and a stream; no
/// allocation, no sync (graph-capturable).
///
/// qk_norm_rope: the fused q/k/v projection's output qkv [T, (H+2K)·h] (row
/// stride `row_stride` elements, h contiguous) holds, per token, H query
/// heads, K key heads, then K value heads.  In place, for each query and key
/// head of each token, the composite path's exact roundings
/// (gpu/models/common.cpp project_q/project_k):
///   n = T(x · rstd), rstd = rsqrt(mean(x²) + eps) in fp32   (RMSNorm)
///   y = T(w · n)                                            (w: q_norm or k_norm)
///   out = T(T(y · c) + T(rot(y) · s)), c = T(cos), s = T(sin)   (RoPE, rotate_half)
/// Only the order of the fp32 sum of squares differs from the composite
/// (as in norm_rope.cu).  Value heads are left alone.
/// Design: a warp a token (its cos/sin read once) or, with few tokens (a
/// decode step), several warps a token, each a share of its heads; 32 lanes
/// a head row for h = 32 and 256, 16 for the others (two rows a pass), h/32
/// or h/16 elements a lane; the RoPE partner of a lane's elements (distance
/// h/2) is half the row's lanes away.
///
/// swiglu_rows: gu [T, 2·I] (gate in columns [0, I), up in [I, 2·I), as the
/// fused gate/up projection writes them) → out [T, I] contiguous,
/// out = T(g / (1 + exp(−g)) · u) in fp32, one rounding (swiglu.cu's
/// forward, so the same numbers as fused_swiglu).
#include <cstdint>
#include <cuda_runtime_api.h>

namespace tandem::gpu::kernels {

enum class fused_dtype { bf16, fp16 };

struct qk_norm_rope_args {
  int64_t tokens = 0;
  int heads = 0, kv_heads = 0, head_dim = 0;  ///< head_dim: 16, 32, 64, 128 or 256
  int64_t row_stride = 0;                     ///< elements between tokens in qkv (≥ (H+2K)·h)
  float eps = 1e-6f;
  fused_dtype dtype = fused_dtype::bf16;
  void* qkv = nullptr;                        ///< [T, row_stride], rows 16-byte aligned
  const void* q_norm = nullptr;               ///< [h], qkv's dtype, 16-byte aligned
  const void* k_norm = nullptr;               ///< [h], 16-byte aligned
  const float* cos = nullptr;                 ///< [T, h] contiguous fp32 (rope_tables)
  const float* sin = nullptr;                 ///< [T, h]
  /// Optional, the decoder's KV cache: when k_cache is set, token t (row
  /// t / tokens_per_row, position lengths[row] + t % tokens_per_row) also
  /// writes its normalised, rotated key heads to k_cache and its value heads
  /// (as they are) to v_cache, both [rows, K, capacity, h] contiguous and
  /// 16-byte aligned; a position ≥ capacity is not written.
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const int64_t* lengths = nullptr;           ///< [rows] on the device
  int64_t capacity = 0;
  int64_t tokens_per_row = 1;
};

/// nullptr when the kernel takes this head_dim; otherwise why not.
const char* qk_norm_rope_unsupported(int head_dim);
cudaError_t qk_norm_rope(const qk_norm_rope_args& args, cudaStream_t stream);

struct swiglu_rows_args {
  int64_t tokens = 0;
  int64_t inter = 0;                          ///< I: a multiple of 8
  fused_dtype dtype = fused_dtype::bf16;
  const void* gu = nullptr;                   ///< [T, 2I] contiguous, 16-byte aligned
  void* out = nullptr;                        ///< [T, I] contiguous, 16-byte aligned
};

cudaError_t swiglu_rows(const swiglu_rows_args& args, cudaStream_t stream);

} // namespace tandem::gpu::kernels
