#include "gpu/engine/adamw.hpp"

#include <cmath>

#include "gpu/error.hpp"

namespace tandem::gpu {

namespace {

constexpr double pi = 3.14159265358979323846;

} // namespace

int64_t warmup_steps(const adamw_options& o) {
  if (o.total_steps <= 0 || o.warmup_ratio <= 0)
    return 0;
  return static_cast<int64_t>(std::ceil(o.warmup_ratio * static_cast<double>(o.total_steps)));
}

double scheduled_lr(const adamw_options& o, int64_t step) {
  if (o.total_steps <= 0)
    return o.lr;
  const auto w = warmup_steps(o);
  const auto t = static_cast<double>(step);
  if (step <= w)
    return o.lr * t / static_cast<double>(w);
  const double span = static_cast<double>(std::max<int64_t>(1, o.total_steps - w));
  const double progress = std::min(1.0, std::max(0.0, (t - static_cast<double>(w)) / span));
  return 0.5 * o.lr * (1.0 + std::cos(pi * progress));
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
}

at::Tensor adamw::lr_for(const at::Tensor& step) const {
  // The host formula of scheduled_lr, in float64 on the device, then float32
  // (the fused kernel's tensor lr is float32).
  const auto w = warmup_steps(opts_);
  if (opts_.total_steps <= 0)
    return at::full({}, opts_.lr, step.options().dtype(at::kDouble)).to(at::kFloat);
  auto t = step.to(at::kDouble);
  const double span = static_cast<double>(std::max<int64_t>(1, opts_.total_steps - w));
  auto progress = at::clamp((t - static_cast<double>(w)) / span, 0.0, 1.0);
  auto cosine = (at::cos(progress * pi) + 1.0) * (0.5 * opts_.lr);
  if (w == 0)
    return cosine.to(at::kFloat);
  auto warm = (t * opts_.lr) / static_cast<double>(w);
  return at::where(t <= static_cast<double>(w), warm, cosine).to(at::kFloat);
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
  auto finite = at::isfinite(out.grad_norm) & at::isfinite(loss.detach()).all();
  out.skipped = at::logical_not(finite).to(at::kFloat);
  // The lr of update t = count + 1, whether or not it is applied.
  out.lr = lr_for(steps_.front() + 1.0);
  // As PyTorch's fused path: counters first (the kernel reads t for its
  // bias corrections), but not for a skipped update.
  at::_foreach_add_(steps_, 1.0 - out.skipped);
  at::_fused_adamw_(params_, grads, exp_avg_, exp_avg_sq_, /*max_exp_avg_sqs=*/{}, steps_, out.lr,
                    opts_.beta1, opts_.beta2, opts_.weight_decay, opts_.eps, /*amsgrad=*/false,
                    /*maximize=*/false, /*grad_scale=*/std::nullopt, /*found_inf=*/out.skipped);
  return out;
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
