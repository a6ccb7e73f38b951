#pragma once
/// y = x·Wᵀ for the drafter's projections, with an opt-in backward that
/// writes the weight gradient straight into W.grad() from the GEMM (the
/// first contribution of a step overwrites, later ones accumulate with
/// β = 1) instead of producing a fresh tensor that autograd then adds into a
/// zeroed W.grad().
///
/// Why: the drafter engine keeps every gradient in one flat buffer
/// (drafter_engine.cpp, flat mode).  With plain at::linear, each step zeroes
/// the ~1e9 gradients, backward writes each weight gradient to a temporary
/// and AccumulateGrad adds it in: two extra passes over all of them.  Here
/// the GEMM's own output is the gradient (the same trick as Megatron's
/// gradient-accumulation fusion).
///
/// Opt-in per thread, for the forward of one step: inside a
/// `weight_grad_accumulation` scope, `fused_linear(x, w)` takes this path for
/// every 2-D `w` that requires grad and has a defined, contiguous `.grad()`
/// of its own shape and dtype; autograd then sees no gradient for `w` (hooks
/// and torch::autograd::grad() do not see it either — why it is not the
/// default).  Which contribution comes first is decided in backward, per
/// weight, by the scope's `grad_writes` (reset when a scope opens), so the
/// order autograd picks does not matter; a captured graph records the
/// decisions of its capture.  Weights that never pass through fused_linear
/// must be zeroed by the caller as usual.  Numerics: W.grad = gᵀx (+ gᵀx′)
/// in fp32-accumulating GEMMs, rounded once per contribution — the same
/// values as at::linear's backward to within one rounding of the dtype.

#include <cstddef>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "gpu/pch.hpp"

namespace tandem::gpu {

at::Tensor fused_linear(const at::Tensor& x, const at::Tensor& w);

/// residual + x·Wᵀ in one GEMM (addmm's β = 1 epilogue: one rounding of the
/// fp32 sum, no separate add kernel), `residual` shaped as the output; its
/// gradient is the output's.  The weight gradient as fused_linear's.
at::Tensor fused_linear_residual(const at::Tensor& x, const at::Tensor& w, const at::Tensor& residual);

/// {x·W₁ᵀ, x·W₂ᵀ, …}: several projections of one input.  When every Wᵢ
/// takes fused_linear's in-place path, one autograd node whose backward
/// sums the input's gradient in the GEMMs' β = 1 epilogue (dx = g₁W₁, then
/// dx += g₂W₂, …: no add kernels, where autograd would sum n separate dx
/// with n − 1 adds) and writes each weight gradient in place; otherwise n
/// fused_linear calls (bit for bit today's path: the CPU, inference).
std::vector<at::Tensor> fused_linears(const at::Tensor& x, at::TensorList ws);

/// The weights whose gradient was written since the scope opened (backward
/// runs on autograd's threads, hence the lock).  Owned by the caller; must
/// outlive the backward of the step it tracks.
class grad_writes {
public:
  /// True for the first write to `grad` (its data pointer) since clear().
  bool first(const void* grad);
  void clear();
  size_t count() const;

private:
  mutable std::mutex mutex_;
  std::unordered_set<const void*> written_;
};

/// While alive, fused_linear() on this thread writes weight gradients in
/// place, tracked by `writes` (cleared here).
class weight_grad_accumulation {
public:
  explicit weight_grad_accumulation(grad_writes& writes);
  ~weight_grad_accumulation();
  weight_grad_accumulation(const weight_grad_accumulation&) = delete;
  weight_grad_accumulation& operator=(const weight_grad_accumulation&) = delete;

  static bool active();

private:
  grad_writes* previous_;
};

} // namespace tandem::gpu
