#pragma once
/// Fused SwiGLU, forward and backward, for the MLP of the Qwen3 target and
/// the DFlash drafter (the composite it replaces, at::silu(gate) * up, and the
/// autograd wrapper are in gpu/models/fused_ops.cpp).
/// No LibTorch here: raw pointers, element counts and a stream; no
/// allocation, no sync (graph-capturable).
///
/// Elementwise over n elements, in fp32, each output rounded once to T:
///   forward   e = exp(−g), out = T(g / (1 + e) · u)
///             (ATen's silu is x / (1 + exp(−x)) in fp32; the composite then
///             rounds silu to T and multiplies in T, rounding twice)
///   backward  s = 1 / (1 + e)                         (ATen's silu_backward)
///             d_up   = T(dy · g · s)
///             d_gate = T(dy · u · s · (1 + g · (1 − s)))
///             recomputed from gate and up: nothing else is saved.
/// Traffic: forward reads gate, up and writes out (6 bytes an element in
/// bf16); backward reads dy, gate, up and writes d_gate, d_up (10 bytes).
/// The composite moves 10 and 18 (silu, mul; mul, mul, silu_backward): 12
/// bytes an element less in all.
///
/// Design: grid-stride over 16-byte chunks (8 bf16/fp16 elements), one
/// chunk of each operand a thread and a CTA per 256 chunks (so the loop
/// runs once below 2^31 CTAs), the last n mod 8 elements one a thread.
/// When any pointer is not 16-byte aligned the same kernel runs one element
/// at a time (correct for any offset, slower): callers that care pass
/// allocator-fresh tensors (always aligned).  Operands must not overlap (the
/// kernel's pointers are __restrict__).

#include <cstdint>

#include <cuda_runtime_api.h>

namespace tandem::gpu::kernels {

enum class swiglu_dtype { bf16, fp16 };

struct swiglu_fwd_args {
  int64_t n = 0;                     ///< elements
  swiglu_dtype dtype = swiglu_dtype::bf16;
  const void* gate = nullptr;        ///< [n] contiguous
  const void* up = nullptr;          ///< [n] contiguous
  void* out = nullptr;               ///< [n] contiguous
};

struct swiglu_bwd_args {
  int64_t n = 0;
  swiglu_dtype dtype = swiglu_dtype::bf16;
  const void* grad_out = nullptr;    ///< [n] dy
  const void* gate = nullptr;        ///< [n] as in the forward
  const void* up = nullptr;          ///< [n] as in the forward
  void* grad_gate = nullptr;         ///< [n], or nullptr (not needed)
  void* grad_up = nullptr;           ///< [n], or nullptr (not needed)
};

/// Writes out.  cudaErrorInvalidValue for n < 0 or a missing pointer;
/// otherwise the launch's error.  n == 0 launches nothing.
cudaError_t swiglu_forward(const swiglu_fwd_args& args, cudaStream_t stream);

/// Writes grad_gate and grad_up (either may be skipped: nullptr; both
/// nullptr launches nothing).
cudaError_t swiglu_backward(const swiglu_bwd_args& args, cudaStream_t stream);

} // namespace tandem::gpu::kernels
