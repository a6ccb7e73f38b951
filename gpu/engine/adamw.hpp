#pragma once
/// The drafter's optimizer (DFLASH.md recipe; DESIGN.md §4): global-norm
/// gradient clipping and AdamW over fp32 master weights, with the learning
/// rate and step counters kept in device tensors so the whole update runs
/// without a host synchronisation and can later be captured in a graph.
///
/// One update, all on the parameters' device:
///   norm   = ‖(‖g_i‖₂)_i‖₂                       (as torch.nn.utils.clip_grad_norm_)
///   g_i   *= min(1, clip / (norm + 1e-6))         (when clip > 0)
///   skip   = !isfinite(loss) || !isfinite(norm)   (then nothing below changes)
///   step  += 1;  lr = schedule(step)
///   at::_fused_adamw_(masters, g, exp_avg, exp_avg_sq, steps, lr, found_inf = skip)
///
/// Schedule (1-based update number t, W = ceil(warmup_ratio · total_steps)):
/// lr·t/W for t ≤ W, then lr·½(1 + cos(π·min(1, (t − W)/(total − W)))): the
/// first update uses lr/W, update W the full lr, update `total_steps` (and
/// any later one) lr 0.  total_steps ≤ 0: a constant lr, no warmup.
/// Flat mode (CUDA; the drafter engine's mixed-precision path): the masters
/// are views of ONE contiguous fp32 buffer, the moments views of two more at
/// the same offsets, and `step_flat` runs the update above as two kernels
/// over the flat gradient (bf16 or fp32) that also write the bf16 model copy
/// (gpu/kernels/adamw_flat.hpp: 32 instead of 54 bytes per parameter).
/// gpu/ only (torch); the engines use it, tests check it.

#include <cstdint>
#include <vector>

#include "gpu/engine/lr_schedule.hpp"
#include "gpu/pch.hpp"

namespace tandem::gpu {

struct adamw_options {
  double lr = 6e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;   ///< decoupled (AdamW); applied to every parameter
  double grad_clip = 1.0;      ///< max global L2 norm; ≤ 0 disables clipping
  double warmup_ratio = 0.04;  ///< of total_steps, linear from lr/W up to lr
  int64_t total_steps = 0;     ///< cosine to 0 over the steps after warmup; ≤ 0: constant lr
};

/// W = ceil(warmup_ratio · total_steps) (0 when total_steps ≤ 0).
int64_t warmup_steps(const adamw_options& o);

/// The learning rate of the `step`-th update (1-based), in float64.  The
/// device computes the same formula in float64 and rounds it to float32.
double scheduled_lr(const adamw_options& o, int64_t step);

class adamw {
public:
  /// `params`: the fp32 master weights, updated in place.  All on one device.
  adamw(std::vector<at::Tensor> params, const adamw_options& opts);

  /// Flat mode: every param is a contiguous view of `flat` ([N] fp32, CUDA,
  /// 16-byte aligned, N a multiple of 8; see flat_layout in drafter_engine).
  adamw(std::vector<at::Tensor> params, const adamw_options& opts, at::Tensor flat);

  /// What one update produced, as device scalars (float32 []); nothing read back.
  struct stats {
    at::Tensor grad_norm;  ///< global norm before clipping
    at::Tensor lr;         ///< the lr the update used (scheduled for step + 1)
    at::Tensor skipped;    ///< 1: non-finite loss or norm, nothing was changed
  };

  /// One update.  `grads` (fp32, shaped like the params) are clipped in
  /// place; `loss` ([] any float dtype) is only checked for finiteness.
  stats step(const std::vector<at::Tensor>& grads, const at::Tensor& loss);

  /// Flat mode only: one update from `grad` ([N], bf16/fp16/fp32, laid out
  /// as the masters' flat buffer; read, not changed) that also writes
  /// `model` ([N] bf16/fp16, or undefined) = the updated masters, rounded.
  stats step_flat(const at::Tensor& grad, const at::Tensor& model, const at::Tensor& loss);
  bool is_flat() const { return flat_.defined(); }

  const std::vector<at::Tensor>& params() const { return params_; }
  const std::vector<at::Tensor>& exp_avg() const { return exp_avg_; }
  const std::vector<at::Tensor>& exp_avg_sq() const { return exp_avg_sq_; }
  /// Updates applied so far: [] float32 on the device (every parameter's
  /// counter holds the same value).
  const at::Tensor& step_count() const { return steps_.front(); }
  const adamw_options& options() const { return opts_; }

  /// The learning-rate multiplier of the next updates (the scheduled lr
  /// times `scale`, in float64 before the rounding to float32): written
  /// into a device tensor on the current stream, so a captured update reads
  /// it when replayed.  1 at construction; not part of the saved state (the
  /// runtime sends it with every step).
  void set_lr_scale(double scale) {
    if (scale != lr_scale_value_) {
      lr_scale_.fill_(scale);
      lr_scale_value_ = scale;
    }
  }

  /// Overwrites the state (moments per parameter, in order, and the update
  /// count); shapes must match.  Values are copied, never aliased.
  void load_state(const std::vector<at::Tensor>& exp_avg, const std::vector<at::Tensor>& exp_avg_sq,
                  int64_t step);

private:
  at::Tensor lr_for(const at::Tensor& step) const;
  /// Given out.grad_norm: the skip rule (a non-finite loss or norm), the lr of
  /// update count + 1, and the counters advanced unless skipped.
  void count_update(stats& out, const at::Tensor& loss);

  adamw_options opts_;
  std::vector<at::Tensor> params_;      ///< fp32 masters (not owned: aliases the engine's)
  std::vector<at::Tensor> exp_avg_;     ///< fp32, like params
  std::vector<at::Tensor> exp_avg_sq_;  ///< fp32, like params
  std::vector<at::Tensor> steps_;       ///< [] float32 each, all equal (the fused kernel reads one per tensor)
  at::Tensor flat_, flat_avg_, flat_avg_sq_;  ///< flat mode: [N] fp32 masters, moments
  at::Tensor partials_;                 ///< flat mode: [blocks] fp32, the norm's partial sums
  at::Tensor lr_scale_;                 ///< [] float64: the multiplier (set_lr_scale)
  double lr_scale_value_ = 1.0;
};

} // namespace tandem::gpu
