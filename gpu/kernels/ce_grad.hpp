#pragma once
/// Fused cross-entropy over a chunk of lm-head logits, with the logits'
/// gradient written in place (the elementwise half of chunked_ce_fn in
/// gpu/models/dflash_objective.cpp; the composite it replaces is there too).
/// No LibTorch here: raw pointers, element strides and a stream; every
/// temporary is the caller's (graph-capturable: no allocation, no sync).
///
/// Per row r of logits x [rows, V] (T = bf16, fp16 or fp32), all math fp32:
///   m      = max_j x_j,  arg = the first j with x_j = m (torch.argmax)
///   lse    = m + log Σ_j exp(x_j − m)          (torch.logsumexp's formula)
///   loss_r = (lse − x[label]) · w_r            (the composite's product)
///   hit_r  = [arg = label] · mask_r
///   g_j    = T((exp(x_j − lse) − [j = label]) · w_r)   written over x_j
///            (the composite: sub, exp, scatter_add −1, mul w, cast to T)
/// loss_r and hit_r go to per-row fp32 outputs; the caller sums them
/// (at::sum), so no float atomics anywhere and every result is
/// bit-reproducible for a given size.
///
/// Design: a row belongs to one CTA of 512 threads (grid-stride over rows;
/// by default two CTAs per SM, so about 264 rows × V·sizeof(T) are live —
/// the second read is meant to hit L2).  Pass 1 reads the row once in
/// 16-byte chunks (a scalar path when the row is not 16-byte aligned) and
/// keeps an online (max, Σexp, argmax) per thread, reduced by warp shuffles
/// and then across warps in a fixed order.  Pass 2 walks the row backwards
/// (the last-read bytes are the likeliest still in L2) and writes g.  With
/// write_grad = false pass 2 is skipped (forward only: one read per row).
/// Edge cases: NaN logits are ignored by the max (torch would propagate
/// them); a label outside [0, V) gives loss_r = NaN and no one-hot term
/// (the composite's gather would fault).

#include <cstdint>

#include <cuda_runtime_api.h>

namespace tandem::gpu::kernels {

enum class ce_dtype { bf16, fp16, fp32 };

struct ce_grad_args {
  int64_t rows = 0;            ///< rows of the chunk
  int64_t vocab = 0;           ///< V: 1..2^31−1
  int64_t row_stride = 0;      ///< elements between rows (>= V)
  ce_dtype dtype = ce_dtype::bf16;
  void* logits = nullptr;      ///< [rows, row_stride] T; becomes g when write_grad
  const int64_t* labels = nullptr;  ///< [rows]
  const float* weight = nullptr;    ///< [rows] w
  const float* mask = nullptr;      ///< [rows] m (accuracy only)
  float* row_loss = nullptr;   ///< [rows] out: w · (lse − x[label])
  float* row_hit = nullptr;    ///< [rows] out: m · [argmax = label]
  float* row_lse = nullptr;    ///< [rows] out, or nullptr (not wanted)
  bool write_grad = true;      ///< false: forward only, logits left as they are
  int ctas = 0;                ///< grid size; 0 = 2 per SM (tuning knob for the harness)
};

/// Writes row_loss, row_hit (and row_lse), and g over the logits when
/// write_grad.  cudaErrorInvalidValue for a bad size or a null operand;
/// otherwise the launch's error.
cudaError_t ce_grad(const ce_grad_args& args, cudaStream_t stream);

/// The backward's scaling of the stored input gradient by the upstream
/// scalar: dst_i = T(float(src_i) · *scale), the fp32 product rounded once
/// to T — chunked_ce_fn's composite (src.to(float) · s).to(T) bit for bit in
/// one pass (it ran three: widen, multiply, narrow).  16-byte accesses where
/// src, dst and n allow, else one element a thread.
struct ce_scale_args {
  int64_t n = 0;                  ///< elements
  ce_dtype dtype = ce_dtype::bf16;
  const void* src = nullptr;      ///< [n] T
  void* dst = nullptr;            ///< [n] T (may be src)
  const float* scale = nullptr;   ///< one float on the device
};

/// cudaErrorInvalidValue for a negative size or a null operand; otherwise
/// the launch's error.
cudaError_t ce_scale(const ce_scale_args& args, cudaStream_t stream);

} // namespace tandem::gpu::kernels
