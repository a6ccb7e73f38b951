#include "gpu/models/linear.hpp"

namespace tandem::gpu {

namespace {

thread_local bool accumulate_in_place = false;

/// y = x·Wᵀ whose backward adds gᵀx into W.grad() and returns no gradient
/// for W.
struct accumulating_linear : torch::autograd::Function<accumulating_linear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w) {
    ctx->save_for_backward({x, w});
    return at::linear(x, w);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& w = saved[1];
    const auto& g = grads[0];
    at::Tensor dx;
    if (ctx->needs_input_grad(0))
      dx = at::matmul(g, w);
    auto dw = w.grad();
    const auto out = w.size(0), in = w.size(1);
    dw.addmm_(g.reshape({-1, out}).t(), x.reshape({-1, in}));
    return {dx, at::Tensor()};
  }
};

} // namespace

weight_grad_accumulation::weight_grad_accumulation() : previous_(accumulate_in_place) {
  accumulate_in_place = true;
}

weight_grad_accumulation::~weight_grad_accumulation() {
  accumulate_in_place = previous_;
}

bool weight_grad_accumulation::active() {
  return accumulate_in_place;
}

at::Tensor fused_linear(const at::Tensor& x, const at::Tensor& w) {
  if (!accumulate_in_place || !at::GradMode::is_enabled() || !w.requires_grad() || w.dim() != 2)
    return at::linear(x, w);
  const auto& grad = w.grad();
  if (!grad.defined() || grad.sizes() != w.sizes() || grad.scalar_type() != w.scalar_type()
      || !grad.is_contiguous())
    return at::linear(x, w);
  return accumulating_linear::apply(x, w);
}

} // namespace tandem::gpu
