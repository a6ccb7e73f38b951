#pragma once
/// RMSNorm and rotary embeddings as single differentiable ops.  On CUDA
/// (bf16, fp16, fp32) they run Tandem's fused kernels
/// (gpu/kernels/norm_rope.cu): one pass over memory forward, one backward,
/// graph-capturable (no host sync; temporaries from the caching allocator on
/// the current stream).  On the CPU, or for operands the kernels do not take,
/// they run the composites below, which are the reference implementation
/// (the parity tests compare them with Hugging Face).
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

#include <string>

#include "gpu/pch.hpp"

namespace tandem::gpu {

/// weight · T(x · rsqrt(mean(x², -1) + eps)) over the last dimension, T =
/// x's dtype.  Differentiable in x and in weight (the weight's gradient is
/// computed only when it requires grad).
at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

/// x: [B, heads, T, d] (any strides); cos/sin: [B or 1, T, d] float32 from
/// rope_tables.  Returns x rotated in x's dtype ("rotate_half" layout), with
/// x's memory layout where x is dense.  Differentiable in x.
at::Tensor fused_apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// The composites (the code the kernels replace; CPU path and reference).
at::Tensor rms_norm_composite(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor apply_rope_composite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// Which path each op takes for these operands: "cuda kernel", or
/// "composite (<why not>)".
std::string fused_rms_norm_path(const at::Tensor& x, const at::Tensor& weight);
std::string fused_apply_rope_path(const at::Tensor& x, const at::Tensor& cos,
                                  const at::Tensor& sin);

} // namespace tandem::gpu
