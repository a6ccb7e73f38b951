#include "gpu/models/linear.hpp"

namespace tandem::gpu {

namespace {

thread_local grad_writes* current_writes = nullptr;

/// residual + x·Wᵀ in one addmm, shaped as the residual.
at::Tensor addmm_residual(const at::Tensor& x, const at::Tensor& w, const at::Tensor& residual) {
  return at::addmm(residual.reshape({-1, w.size(0)}), x.reshape({-1, w.size(1)}), w.t()).view(residual.sizes());
}

/// W.grad() = gᵀx on the scope's first write to it this step, += after.
void write_weight_grad(grad_writes& writes, const at::Tensor& w, const at::Tensor& g, const at::Tensor& x) {
  auto dw = w.grad();
  const auto gt = g.reshape({-1, w.size(0)}).t();
  const auto x2 = x.reshape({-1, w.size(1)});
  if (writes.first(dw.data_ptr()))
    at::mm_out(dw, gt, x2);
  else
    dw.addmm_(gt, x2);
}

/// The backward of y = (…) + x·Wᵀ with x and W saved: writes gᵀx into
/// W.grad() (the first write of the scope's step overwrites, later ones
/// accumulate) and returns dx (undefined when x needs none).
at::Tensor in_place_backward(torch::autograd::AutogradContext* ctx, const at::Tensor& g) {
  const auto saved = ctx->get_saved_variables();
  const auto& x = saved[0];
  const auto& w = saved[1];
  at::Tensor dx;
  if (ctx->needs_input_grad(0))
    dx = at::matmul(g, w).view(x.sizes());
  write_weight_grad(*reinterpret_cast<grad_writes*>(ctx->saved_data["writes"].toInt()), w, g, x);
  return dx;
}

/// residual + x·Wᵀ, with in_place_linears' weight gradient.
struct in_place_linear_residual : torch::autograd::Function<in_place_linear_residual> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& residual, int64_t writes) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["writes"] = writes;
    return addmm_residual(x, w, residual);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto& g = grads[0];
    return {in_place_backward(ctx, g), at::Tensor(), ctx->needs_input_grad(2) ? g : at::Tensor(), at::Tensor()};
  }
};

/// {x·W₁ᵀ, …} whose backward writes each gᵢᵀx into Wᵢ.grad() (overwriting
/// on the step's first contribution, accumulating after), returns no
/// gradient for the Wᵢ, and sums the input gradient in the GEMMs' β = 1
/// epilogue: dx = g₁W₁, dx += g₂W₂, …  (fused_linear: one weight.)
struct in_place_linears : torch::autograd::Function<in_place_linears> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                at::TensorList ws, int64_t writes) {
    std::vector<at::Tensor> saved{x};
    torch::autograd::variable_list out;
    for (const auto& w : ws) {
      saved.push_back(w);
      out.push_back(at::linear(x, w));
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["writes"] = writes;  // the grad_writes of the scope, by address
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto n = saved.size() - 1;
    auto& writes = *reinterpret_cast<grad_writes*>(ctx->saved_data["writes"].toInt());
    at::Tensor dx;  // [rows, D_in] while it sums
    for (size_t i = 0; i < n; ++i) {
      const auto& g = grads[i];
      if (!g.defined())
        continue;  // an output nothing used: no contribution (its weight gradient is left as is)
      const auto& w = saved[i + 1];
      if (ctx->needs_input_grad(0)) {
        const auto g2 = g.reshape({-1, w.size(0)});
        if (dx.defined())
          dx.addmm_(g2, w);
        else
          dx = at::mm(g2, w);
      }
      write_weight_grad(writes, w, g, x);
    }
    torch::autograd::variable_list out{dx.defined() ? dx.view(x.sizes()) : at::Tensor()};
    out.resize(n + 2);  // no gradient for the weights (written in place) or `writes`
    return out;
  }
};

/// fused_linear's in-place path applies to `w`.
bool writes_in_place(const at::Tensor& w) {
  if (current_writes == nullptr || !at::GradMode::is_enabled() || !w.requires_grad() || w.dim() != 2)
    return false;
  const auto& grad = w.grad();
  return grad.defined() && grad.sizes() == w.sizes() && grad.scalar_type() == w.scalar_type()
         && grad.is_contiguous();
}

} // namespace

bool grad_writes::first(const void* grad) {
  std::lock_guard<std::mutex> lock(mutex_);
  return written_.insert(grad).second;
}

void grad_writes::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  written_.clear();
}

size_t grad_writes::count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return written_.size();
}

weight_grad_accumulation::weight_grad_accumulation(grad_writes& writes) : previous_(current_writes) {
  writes.clear();
  current_writes = &writes;
}

weight_grad_accumulation::~weight_grad_accumulation() {
  current_writes = previous_;
}

bool weight_grad_accumulation::active() {
  return current_writes != nullptr;
}

at::Tensor fused_linear(const at::Tensor& x, const at::Tensor& w) {
  if (!writes_in_place(w))
    return at::linear(x, w);
  return in_place_linears::apply(x, at::TensorList(w), reinterpret_cast<int64_t>(current_writes))[0];
}

at::Tensor fused_linear_residual(const at::Tensor& x, const at::Tensor& w, const at::Tensor& residual) {
  TORCH_CHECK(w.dim() == 2 && w.numel() > 0 && x.dim() >= 1 && x.dim() == residual.dim()
                && residual.size(-1) == w.size(0) && x.size(-1) == w.size(1)
                && x.sizes().slice(0, x.dim() - 1) == residual.sizes().slice(0, residual.dim() - 1)
                && x.scalar_type() == residual.scalar_type(),
              "fused_linear_residual: x ", x.sizes(), ", W ", w.sizes(), " and residual ", residual.sizes(),
              " do not fit (or differ in dtype)");
  if (!writes_in_place(w))
    return addmm_residual(x, w, residual);
  return in_place_linear_residual::apply(x, w, residual, reinterpret_cast<int64_t>(current_writes));
}

std::vector<at::Tensor> fused_linears(const at::Tensor& x, at::TensorList ws) {
  bool in_place = !ws.empty();
  for (const auto& w : ws)
    in_place = in_place && writes_in_place(w);
  if (in_place)
    return in_place_linears::apply(x, ws, reinterpret_cast<int64_t>(current_writes));
  std::vector<at::Tensor> out;
  for (const auto& w : ws)
    out.push_back(fused_linear(x, w));
  return out;
}

} // namespace tandem::gpu
