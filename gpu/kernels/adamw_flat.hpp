#pragma once
/// The drafter's optimizer update over flat buffers, in two kernels (no
/// LibTorch here: plain pointers and a stream).  Every parameter of the
/// drafter lives in one contiguous buffer per role — fp32 masters, fp32 first
/// and second moments, the bf16/fp16 model copy and the gradient — so one
/// elementwise pass does what the foreach chain did in five
/// (copy grad → fp32, norm, clip multiply, fused AdamW, refresh the model):
///
///   bytes per parameter   before: 2 zero + 6 copy + 4 norm + 8 clip + 28 adamw + 6 refresh = 54
///                         now:    2 zero + 2 sumsq + 28 update (grad 2, master/m/v 24, model 2) = 32
///
/// The update is PyTorch's fused AdamW (aten/src/ATen/native/cuda/
/// fused_adam_utils.cuh, ADAMW mode) in float arithmetic, with the clip
/// factor min(1, clip / (norm + 1e-6)) applied to the gradient first (as
/// torch.nn.utils.clip_grad_norm_) and the whole update skipped when
/// `skipped` is non-zero (a non-finite loss or norm: nothing changes):
///
///   g  = grad · coef
///   p -= lr · wd · p
///   m  = β1 · m + (1 − β1) · g
///   v  = β2 · v + (1 − β2) · g²
///   p -= (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + eps)
///   model = round(p)
///
/// Device scalars (float32, read by every thread; nothing read back): `lr`,
/// `step` (t, already counting this update), `norm`, `skipped`.  Buffers
/// must be 16-byte aligned and `n` a multiple of 8 (the flat layouts pad).

#include <cstdint>

#include <cuda_runtime_api.h>

namespace tandem::gpu::kernels {

enum class flat_type : uint8_t { f32, bf16, f16 };

/// partial[b] = Σ g[i]² over block b's share (fixed grid of `blocks` blocks,
/// so the sum is deterministic); the caller sums the partials.
/// `blocks` ≤ sumsq_max_blocks.
constexpr int sumsq_max_blocks = 1024;
cudaError_t sumsq_partials(const void* g, flat_type type, int64_t n, float* partial, int blocks,
                           cudaStream_t stream);

struct adamw_flat_args {
  float* master = nullptr;         ///< [n] fp32, updated in place
  float* exp_avg = nullptr;        ///< [n] fp32
  float* exp_avg_sq = nullptr;     ///< [n] fp32
  const void* grad = nullptr;      ///< [n] grad_type
  flat_type grad_type = flat_type::bf16;
  void* model = nullptr;           ///< [n] model_type, written = round(master); null: none
  flat_type model_type = flat_type::bf16;
  int64_t n = 0;
  const float* lr = nullptr;       ///< [] device
  const float* step = nullptr;     ///< [] device: t of this update (≥ 1)
  const float* norm = nullptr;     ///< [] device: the gradient's global L2 norm
  const float* skipped = nullptr;  ///< [] device: non-zero → no change at all
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0;  ///< as PyTorch: double
  float clip = 0.f;                ///< ≤ 0: no clipping
};

cudaError_t adamw_flat(const adamw_flat_args& a, cudaStream_t stream);

} // namespace tandem::gpu::kernels
