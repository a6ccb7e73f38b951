#pragma once
/// RMSNorm, rotary embeddings and SwiGLU as single differentiable ops.  On
/// CUDA (bf16, fp16, and fp32 for the first two) they run Tandem's fused
/// kernels (gpu/kernels/norm_rope.cu, gpu/kernels/swiglu.cu): one pass over
/// memory forward, one backward, graph-capturable (no host sync; temporaries
/// from the caching allocator on the current stream).  On the CPU, or for
/// operands the kernels do not take, they run the composites below, which
/// are the reference implementation (the parity tests compare them with
/// Hugging Face).
///
/// Numerics on the kernel path (tests/gpu/fused_ops_test.cpp,
/// tests/gpu/fused_ops_harness.py):
/// - rms_norm forward: the composite's rounding (normalise in fp32, round to
///   x's dtype, scale by weight in x's dtype); only the order of the fp32 sum
///   of squares differs, so bf16 outputs match the composite bit for bit on
///   ~100% of elements and within one ulp elsewhere.
/// - apply_rope forward: bit-identical to the composite in every dtype.
/// - backwards: fp32 math rounded once (closer to the float64 gradient than
///   the composite's autograd, which rounds each intermediate); dweight is
///   a fixed-order two-stage reduction, bit-reproducible run to run.
/// - swiglu (tests/gpu/swiglu_test.cpp): fp32 math (ATen's silu and
///   silu_backward formulae) rounded once per output, forward and backward,
///   within two ulps of an fp32 reference from the same inputs; the
///   composite rounds silu(gate) before the product and each gradient's
///   intermediates too.

#include <string>

#include "gpu/pch.hpp"

namespace tandem::gpu {

/// weight · T(x · rsqrt(mean(x², -1) + eps)) over the last dimension, T =
/// x's dtype.  Differentiable in x and in weight (the weight's gradient is
/// computed only when it requires grad).
at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

/// {fused_rms_norm(x, weight, eps), x'} with x' = x, for a caller that also
/// adds x to something later (a residual): on the kernel path with autograd
/// on, x' is a view of x whose gradient the norm's backward kernel adds to
/// its own dx before rounding (one pass, no separate add; one rounding where
/// autograd's sum has two).  Elsewhere x' is x itself.
std::pair<at::Tensor, at::Tensor> fused_rms_norm_passing(const at::Tensor& x, const at::Tensor& weight, double eps);

/// x: [B, heads, T, d] (any strides); cos/sin: [B or 1, T, d] float32 from
/// rope_tables.  Returns x rotated in x's dtype ("rotate_half" layout), with
/// x's memory layout where x is dense.  Differentiable in x.
at::Tensor fused_apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// fused_apply_rope(fused_rms_norm(x, weight, eps).transpose(1, 2), cos, sin)
/// for x [B, T, heads, h] (q or k heads, per-head norm weight [h]), cos/sin
/// [B or 1, T, h]: returns [B, heads, T, h].  Training (autograd on, x or
/// weight requiring grad) on the kernel path runs the norm and RoPE as one
/// kernel each way (the same roundings: RoPE's backward result is rounded to
/// x's dtype before the norm's backward reads it, as between the two
/// kernels); otherwise the two calls.  `_path` says which and why.
at::Tensor fused_rms_norm_rope(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& cos,
                               const at::Tensor& sin);
std::string fused_rms_norm_rope_path(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
                                     const at::Tensor& sin);

/// silu(gate) · up, SwiGLU's elementwise half (the kernel path takes bf16
/// and fp16 gate and up of one shape and device, any strides: it makes them
/// contiguous, and returns a contiguous tensor).  Differentiable in both;
/// the kernel path saves only gate and up, and its backward recomputes the
/// sigmoid (the composite's autograd also keeps silu(gate)).
at::Tensor fused_swiglu(const at::Tensor& gate, const at::Tensor& up);

/// The target's fused-layout kernels (gpu/kernels/target_fused.cu), inference
/// only, CUDA bf16/fp16 (callers check the layout first: qwen3_target::
/// packed_path, the decoder's fused test); both launch on `qkv`'s / `gu`'s
/// device.  qk_norm_rope_inplace: on qkv [T, (H+2K)·h] (q heads, k heads,
/// v heads a row), each q and k head RMS-normalised by q_norm / k_norm and
/// rotated by cos/sin [T, h] (fp32, contiguous), in place; v untouched.
/// With k_cache defined (the decoder's caches [B, K, C, h], lengths [B]
/// int64 on the device, T = B · tokens_per_row): token t's keys (after the
/// norm and RoPE) and values also go to position lengths[t / tokens_per_row]
/// + t % tokens_per_row of its row's caches, in the same kernel.
void qk_norm_rope_inplace(const at::Tensor& qkv, const at::Tensor& q_norm, const at::Tensor& k_norm,
                          int64_t heads, int64_t kv_heads, int64_t head_dim, double eps,
                          const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_cache = {},
                          const at::Tensor& v_cache = {}, const at::Tensor& lengths = {},
                          int64_t tokens_per_row = 1);
/// y = x̂ · wᵀ (+ residual) through the decode GEMV kernel (gpu/kernels/
/// decode_gemv.hpp) for one to four rows: x̂ = x, or rms_norm(x,
/// norm_weight, eps) when norm_weight is defined, or swiglu_rows(x) when
/// swiglu_input (x then [m, 2k]: gate, then up) — fused in, the same
/// rounding.  x [m, k] (unit column stride), w [n, k] contiguous, residual
/// [m, n] or undefined; CUDA bf16/fp16, no autograd.  An undefined tensor
/// when the kernel does not take the operands: the caller runs cuBLAS.
at::Tensor decode_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& residual,
                         const at::Tensor& norm_weight, double eps, bool swiglu_input = false);
/// silu(gate) · up over gu [T, 2I] (gate columns, then up) → [T, I].
at::Tensor swiglu_rows(const at::Tensor& gu);
/// The composites (the code the kernels replace; CPU path and reference).
at::Tensor rms_norm_composite(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor apply_rope_composite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor swiglu_composite(const at::Tensor& gate, const at::Tensor& up);

/// Which path each op takes for these operands: "cuda kernel", or
/// "composite (<why not>)".
std::string fused_rms_norm_path(const at::Tensor& x, const at::Tensor& weight);
std::string fused_apply_rope_path(const at::Tensor& x, const at::Tensor& cos,
                                  const at::Tensor& sin);
std::string fused_swiglu_path(const at::Tensor& gate, const at::Tensor& up);

} // namespace tandem::gpu
