#include "gpu/engine/adamw.hpp"

#include <cmath>

#include "gpu/device/error.hpp"
#ifdef TANDEM_HAVE_CUDA
#include "gpu/kernels/adamw_flat.hpp"
#endif

namespace tandem::gpu {

namespace {

constexpr double pi = 3.14159265358979323846;

} // namespace

int64_t warmup_steps(const adamw_options& o) {
  return warmup_steps(o.warmup_ratio, o.total_steps);
}

double scheduled_lr(const adamw_options& o, int64_t step) {
  return scheduled_lr(o.lr, o.warmup_ratio, o.total_steps, step);
}

adamw::adamw(std::vector<at::Tensor> params, const adamw_options& opts)
  : opts_(opts), params_(std::move(params)) {
  if (params_.empty())
    throw error(errc::bad_input, "adamw: no parameters");
  for (const auto& p : params_) {
    if (p.scalar_type() != at::kFloat)
      throw error(errc::bad_input, "adamw: master weights must be float32, got "
                                     + std::string(c10::toString(p.scalar_type())));
    if (p.device() != params_.front().device())
      throw error(errc::bad_input, "adamw: parameters on several devices");
    exp_avg_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
    exp_avg_sq_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
    steps_.push_back(at::zeros({}, p.options()));
  }
  lr_scale_ = at::ones({}, params_.front().options().dtype(at::kDouble));
}

adamw::adamw(std::vector<at::Tensor> params, const adamw_options& opts, at::Tensor flat)
  : opts_(opts), params_(std::move(params)), flat_(std::move(flat)) {
#ifndef TANDEM_HAVE_CUDA
  throw error(errc::device_unavailable, "adamw: flat mode needs CUDA (built without it)");
#else
  if (params_.empty())
    throw error(errc::bad_input, "adamw: no parameters");
  if (!flat_.defined() || !flat_.is_cuda() || flat_.scalar_type() != at::kFloat || flat_.dim() != 1
      || !flat_.is_contiguous() || flat_.numel() % 8 != 0
      || reinterpret_cast<uintptr_t>(flat_.data_ptr()) % 16 != 0)
    throw error(errc::bad_input, "adamw: the flat master buffer must be a contiguous 16-byte aligned "
                                 "CUDA float32 vector of a multiple of 8 elements");
  flat_avg_ = at::zeros_like(flat_);
  flat_avg_sq_ = at::zeros_like(flat_);
  const auto* base = flat_.data_ptr<float>();
  for (const auto& p : params_) {
    const auto off = p.data_ptr<float>() - base;
    if (p.scalar_type() != at::kFloat || !p.is_contiguous() || off < 0
        || off + p.numel() > flat_.numel() || !p.storage().is_alias_of(flat_.storage()))
      throw error(errc::bad_input, "adamw: a parameter is not a contiguous view of the flat buffer");
    exp_avg_.push_back(flat_avg_.narrow(0, off, p.numel()).view(p.sizes()));
    exp_avg_sq_.push_back(flat_avg_sq_.narrow(0, off, p.numel()).view(p.sizes()));
  }
  steps_.push_back(at::zeros({}, flat_.options()));
  lr_scale_ = at::ones({}, flat_.options().dtype(at::kDouble));
  partials_ = at::zeros({kernels::sumsq_max_blocks}, flat_.options());
#endif
}

at::Tensor adamw::lr_for(const at::Tensor& step) const {
  // The host formula of scheduled_lr, in float64 on the device, then float32
  // (the fused kernel's tensor lr is float32).
  // Times the run-time multiplier (a device tensor: read when the update
  // runs, also in a replayed graph), in float64 before the rounding; at 1
  // the product is exact, so the schedule is unchanged.
  const auto w = warmup_steps(opts_);
  if (opts_.total_steps <= 0)
    return (at::full({}, opts_.lr, step.options().dtype(at::kDouble)) * lr_scale_).to(at::kFloat);
  auto t = step.to(at::kDouble);
  const double span = static_cast<double>(std::max<int64_t>(1, opts_.total_steps - w));
  auto progress = at::clamp((t - static_cast<double>(w)) / span, 0.0, 1.0);
  auto cosine = (at::cos(progress * pi) + 1.0) * (0.5 * opts_.lr);
  if (w == 0)
    return (cosine * lr_scale_).to(at::kFloat);
  auto warm = (t * opts_.lr) / static_cast<double>(w);
  return (at::where(t <= static_cast<double>(w), warm, cosine) * lr_scale_).to(at::kFloat);
}

void adamw::count_update(stats& out, const at::Tensor& loss) {
  auto finite = at::isfinite(out.grad_norm) & at::isfinite(loss.detach()).all();
  out.skipped = at::logical_not(finite).to(at::kFloat);
  // The lr of update t = count + 1, whether or not it is applied.
  out.lr = lr_for(steps_.front() + 1.0);
  // As PyTorch's fused path: counters first (the kernel reads t for its
  // bias corrections), but not for a skipped update.
  at::_foreach_add_(steps_, 1.0 - out.skipped);
}

adamw::stats adamw::step(const std::vector<at::Tensor>& grads, const at::Tensor& loss) {
  if (grads.size() != params_.size())
    throw error(errc::bad_input, "adamw: " + std::to_string(grads.size()) + " gradients for "
                                   + std::to_string(params_.size()) + " parameters");
  at::NoGradGuard no_grad;
  stats out;
  auto norms = at::_foreach_norm(grads, 2);
  out.grad_norm = at::linalg_vector_norm(at::stack(norms), 2);
  if (opts_.grad_clip > 0) {
    auto coef = at::clamp_max(opts_.grad_clip / (out.grad_norm + 1e-6), 1.0);
    at::_foreach_mul_(grads, coef);
  }
  count_update(out, loss);
  at::_fused_adamw_(params_, grads, exp_avg_, exp_avg_sq_, /*max_exp_avg_sqs=*/{}, steps_, out.lr,
                    opts_.beta1, opts_.beta2, opts_.weight_decay, opts_.eps, /*amsgrad=*/false,
                    /*maximize=*/false, /*grad_scale=*/std::nullopt, /*found_inf=*/out.skipped);
  return out;
}

#ifdef TANDEM_HAVE_CUDA
namespace {

kernels::flat_type flat_type_of(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat: return kernels::flat_type::f32;
    case at::kBFloat16: return kernels::flat_type::bf16;
    case at::kHalf: return kernels::flat_type::f16;
    default:
      throw error(errc::bad_input, std::string("adamw: the flat ") + what + " must be float32, bfloat16 or "
                                     "float16, got " + c10::toString(t.scalar_type()));
  }
}

} // namespace
#endif

adamw::stats adamw::step_flat(const at::Tensor& grad, const at::Tensor& model, const at::Tensor& loss) {
#ifndef TANDEM_HAVE_CUDA
  (void)grad, (void)model, (void)loss;
  throw error(errc::device_unavailable, "adamw: flat mode needs CUDA (built without it)");
#else
  if (!is_flat())
    throw error(errc::bad_input, "adamw: step_flat on an optimizer built without a flat buffer");
  auto same_layout = [&](const at::Tensor& t) {
    return t.is_contiguous() && t.dim() == 1 && t.numel() == flat_.numel() && t.device() == flat_.device();
  };
  if (!same_layout(grad) || (model.defined() && !same_layout(model)))
    throw error(errc::bad_input, "adamw: the flat gradient and model must be [" + std::to_string(flat_.numel())
                                   + "] contiguous on " + flat_.device().str());
  at::NoGradGuard no_grad;
  auto stream = at::cuda::getCurrentCUDAStream(flat_.device().index()).stream();
  auto check = [](cudaError_t e, const char* what) {
    if (e != cudaSuccess)
      throw error(errc::device_failure, std::string("adamw: ") + what + ": " + cudaGetErrorString(e));
  };
  // Deterministic: a fixed grid of partial sums, then their sum.
  const int blocks = static_cast<int>(partials_.numel());
  check(kernels::sumsq_partials(grad.data_ptr(), flat_type_of(grad, "gradient"), grad.numel(),
                                partials_.data_ptr<float>(), blocks, stream),
        "gradient norm");
  stats out;
  out.grad_norm = partials_.sum().sqrt();
  count_update(out, loss);
  kernels::adamw_flat_args a;
  a.master = flat_.data_ptr<float>();
  a.exp_avg = flat_avg_.data_ptr<float>();
  a.exp_avg_sq = flat_avg_sq_.data_ptr<float>();
  a.grad = grad.data_ptr();
  a.grad_type = flat_type_of(grad, "gradient");
  if (model.defined()) {
    a.model = model.data_ptr();
    a.model_type = flat_type_of(model, "model");
  }
  a.n = flat_.numel();
  a.lr = out.lr.data_ptr<float>();
  a.step = steps_.front().data_ptr<float>();
  a.norm = out.grad_norm.data_ptr<float>();
  a.skipped = out.skipped.data_ptr<float>();
  a.beta1 = opts_.beta1;
  a.beta2 = opts_.beta2;
  a.eps = opts_.eps;
  a.weight_decay = opts_.weight_decay;
  a.clip = static_cast<float>(opts_.grad_clip);
  check(kernels::adamw_flat(a, stream), "update");
  return out;
#endif
}

void adamw::load_state(const std::vector<at::Tensor>& exp_avg,
                       const std::vector<at::Tensor>& exp_avg_sq, int64_t step) {
  if (exp_avg.size() != params_.size() || exp_avg_sq.size() != params_.size())
    throw error(errc::bad_input, "adamw: optimizer state for " + std::to_string(exp_avg.size())
                                   + " parameters, expected " + std::to_string(params_.size()));
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (exp_avg[i].sizes() != params_[i].sizes() || exp_avg_sq[i].sizes() != params_[i].sizes())
      throw error(errc::bad_input, "adamw: optimizer state " + std::to_string(i)
                                     + " does not have its parameter's shape");
    exp_avg_[i].copy_(exp_avg[i]);
    exp_avg_sq_[i].copy_(exp_avg_sq[i]);
  }
  for (auto& s : steps_)
    s.fill_(static_cast<double>(step));
}

} // namespace tandem::gpu
