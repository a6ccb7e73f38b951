#pragma once
/// y = x·Wᵀ for the drafter's projections, with an opt-in backward that adds
/// the weight gradient straight into W.grad() (one GEMM with β = 1) instead
/// of producing a fresh tensor that autograd then adds into W.grad().
///
/// Why: the drafter engine keeps every gradient in one flat buffer
/// (drafter_engine.cpp, flat mode).  With plain at::linear, backward writes
/// each weight gradient to a temporary and AccumulateGrad adds it into the
/// buffer: an extra read-read-write pass over all ~1e9 gradients per step.
/// Accumulating in the GEMM's epilogue removes it (the same trick as
/// Megatron's gradient-accumulation fusion).
///
/// Opt-in per thread, for a scope: inside a `weight_grad_accumulation`
/// guard, `fused_linear(x, w)` takes the accumulating path for every `w` that
/// requires grad and already has a defined `.grad()` of its own shape and
/// dtype; autograd then sees an undefined gradient for `w` (nothing else
/// changes W.grad(), so hooks and torch::autograd::grad() do not see it —
/// which is why it is not the default).  Outside a guard, or for any other
/// operand, it is at::linear.  Numerics: W.grad += gᵀx in one GEMM (fp32
/// accumulation, one rounding), where the default rounds gᵀx and then the
/// sum: the same value to within one rounding of the gradient's dtype.

#include "gpu/pch.hpp"

namespace tandem::gpu {

at::Tensor fused_linear(const at::Tensor& x, const at::Tensor& w);

/// While alive, fused_linear() on this thread accumulates weight gradients in place.
class weight_grad_accumulation {
public:
  weight_grad_accumulation();
  ~weight_grad_accumulation();
  weight_grad_accumulation(const weight_grad_accumulation&) = delete;
  weight_grad_accumulation& operator=(const weight_grad_accumulation&) = delete;

  static bool active();

private:
  bool previous_;
};

} // namespace tandem::gpu
