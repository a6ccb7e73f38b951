#pragma once
/// Fused RMSNorm and rotary-embedding kernels, forward and backward, for the
/// Qwen3 target and the DFlash drafter (the composites they replace are in
/// gpu/models/fused_ops.cpp; the autograd wrappers there too).
/// No LibTorch here: raw pointers, element strides and a stream; every
/// temporary is the caller's (graph-capturable: no allocation, no sync).
///
/// RMSNorm over rows of width D (x [rows, D] contiguous):
///   forward   n = T(x · rstd), rstd = rsqrt(mean(x²) + eps) in fp32;
///             y = T(w · n)                  (Hugging Face Qwen3's rounding:
///             normalise in fp32, cast to T, then scale by w in T)
///   backward  g = dy · w (fp32), dx = rstd · (g − x̂ · mean(g · x̂)) [+ dx_add], x̂ = x · rstd;
///             dw = Σ_rows dy · n, in two deterministic stages: each CTA sums
///             its rows in a fixed order into one fp32 partial row, then a
///             second kernel sums the partials in a fixed order.  No atomics:
///             every result is bit-reproducible.
/// Design: a row is held by TPR threads (4..256, a power of two), each taking
/// 16-byte chunks (8 bf16/fp16 or 4 fp32 elements), up to 8 chunks a thread,
/// in registers; a row's sum is reduced by warp shuffles, then across warps
/// through shared memory in a fixed order.  One read of x (two of x and dy
/// in the backward) and one write: memory-bound by design.
///
/// RoPE (HF "rotate_half"): x [B, heads, T, d] with any element strides (d
/// contiguous), cos/sin [B or 1, T, d] fp32 (d contiguous).  With c = T(cos),
/// s = T(sin), h = d/2 and rot = (−x[h:], x[:h]):
///   forward   y = T(T(x · c) + T(rot · s))  — bit-identical to the composite
///             (each of its bf16/fp16 ops rounds once; fp32 without FMA)
///   backward  dx_i = T(dy_i c_i + dy_{i+h} s_{i+h})      (i < h)
///             dx_i = T(dy_i c_i − dy_{i−h} s_{i−h})      (i ≥ h)
///             in fp32 with one rounding (rotation by −θ).

#include <cstdint>

#include <cuda_runtime_api.h>

namespace tandem::gpu::kernels {

enum class norm_dtype { bf16, fp16, fp32 };

struct rms_norm_fwd_args {
  int64_t rows = 0;            ///< number of rows
  int dim = 0;                 ///< D: 1..8192, a multiple of 8 (16-bit) or 4 (fp32)
  float eps = 1e-6f;
  norm_dtype dtype = norm_dtype::bf16;
  const void* x = nullptr;     ///< [rows, D] contiguous, 16-byte aligned
  const void* weight = nullptr;///< [D] contiguous, 16-byte aligned, x's dtype
  void* y = nullptr;           ///< [rows, D] contiguous, 16-byte aligned
  float* rstd = nullptr;       ///< [rows] or nullptr (inference: not saved)
  /// With both set, RoPE follows the norm in the same kernel: y = rope(T(w · n))
  /// with the RoPE forward's roundings below; row r takes row r / rope_heads of
  /// the [rows / rope_heads, D] fp32 tables (16-byte aligned).  Needs a row
  /// held by 4..32 lanes, one 16-byte chunk each (D = 32..256 in bf16/fp16,
  /// 16..128 in fp32), else cudaErrorInvalidValue.
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  int64_t rope_heads = 1;
};

struct rms_norm_bwd_args {
  int64_t rows = 0;
  int dim = 0;
  norm_dtype dtype = norm_dtype::bf16;
  const void* x = nullptr;     ///< [rows, D] as in the forward
  const void* weight = nullptr;///< [D]
  const float* rstd = nullptr; ///< [rows] from the forward
  const void* dy = nullptr;    ///< [rows, D] contiguous, 16-byte aligned
  void* dx = nullptr;          ///< [rows, D] contiguous, or nullptr (not needed)
  const void* dx_add = nullptr;///< [rows, D] contiguous, 16-byte aligned, or nullptr: added
                               ///< to dx before its one rounding (the gradient x gets
                               ///< from another use, e.g. a residual); may alias dx
  void* dweight = nullptr;     ///< [D] in x's dtype, or nullptr (frozen weight)
  float* partials = nullptr;   ///< [rms_norm_bwd_partial_rows(rows, D), D] fp32
                               ///< workspace; needed only with dweight
  /// As in the forward: dy is then the gradient of RoPE's output, taken back
  /// through RoPE's backward (rounded to T, as its kernel stores it) first.
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  int64_t rope_heads = 1;
};

/// nullptr when the kernels take rows of width `dim` in `dtype`; otherwise why not.
const char* rms_norm_unsupported(int dim, norm_dtype dtype);

/// nullptr when the norm kernels can fuse RoPE (rope_cos/rope_sin) at width `dim`.
const char* rms_norm_rope_unsupported(int dim, norm_dtype dtype);

/// Rows of the fp32 workspace the backward needs for dweight (a fixed
/// function of the sizes, so the reduction order is too).
int64_t rms_norm_bwd_partial_rows(int64_t rows, int dim, norm_dtype dtype);

/// Writes y and (when given) rstd.  cudaErrorInvalidValue for an unsupported
/// size or a misaligned operand; otherwise the launch's error.
cudaError_t rms_norm_forward(const rms_norm_fwd_args& args, cudaStream_t stream);

/// Writes dx and dweight (either may be skipped: nullptr).
cudaError_t rms_norm_backward(const rms_norm_bwd_args& args, cudaStream_t stream);

/// A [B, heads, T, d] operand: element strides (d contiguous).
struct rope_tensor {
  void* data = nullptr;
  int64_t batch = 0, head = 0, token = 0;
};

struct rope_args {
  int batch = 0, heads = 0, tokens = 0, head_dim = 0;  ///< d: even, d/2 a multiple of 8
                                                       ///< (16-bit) or 4 (fp32)
  norm_dtype dtype = norm_dtype::bf16;
  rope_tensor in;             ///< x (forward) or dy (backward); strides multiples of 8 / 4
  rope_tensor out;            ///< y (forward) or dx (backward); may alias `in` exactly
  const float* cos = nullptr; ///< [B or 1, T, d]: element (b, t, i) at b·table_batch + t·table_token + i
  const float* sin = nullptr; ///< same layout as cos
  int64_t table_batch = 0;    ///< 0 broadcasts one table over the batch
  int64_t table_token = 0;
  bool backward = false;      ///< false: rotate by θ (forward); true: by −θ (backward)
};

/// nullptr when the kernel takes head_dim `d` in `dtype`; otherwise why not.
const char* rope_unsupported(int head_dim, norm_dtype dtype);

/// Writes out (every element).  cudaErrorInvalidValue for an unsupported size
/// or misaligned operands.
cudaError_t rope_apply(const rope_args& args, cudaStream_t stream);

} // namespace tandem::gpu::kernels
