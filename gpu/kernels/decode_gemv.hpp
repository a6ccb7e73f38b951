#pragma once
/// The decode step's projections at a few tokens: y = x · Wᵀ (+ residual),
/// optionally with the RMSNorm before it fused in, for the target's batch-1
/// decode (gpu/decode/decoder.cpp), where every projection reads its whole
/// weight for one to four rows of activations and the step is bound by HBM.
/// cuBLAS's kernels at these shapes read the weights at a fraction of the
/// bandwidth (docs/bench.md, target_decode); this one streams them.
///
/// Math (T = bf16 or fp16; fp32 accumulation, one rounding per output):
///   x̂ = x, or with norm_weight: x̂ = T(w_n · T(x · rstd)),
///       rstd = rsqrt(mean(x², over k) + eps) in fp32 (the rounding of
///       rms_norm; only the order of the sum of squares differs),
///   or with swiglu_input (x holds [gate | up], 2k columns):
///       x̂ = T(g / (1 + exp(−g)) · u) in fp32 (swiglu_rows' rounding)
///   y[m, n] = T(Σ_k float(x̂[m, k]) · float(W[n, k])  (+ float(residual[m, n])))
/// The residual is added to the fp32 sum before the one rounding, as
/// addmm's beta = 1 epilogue does.
///
/// Design: each CTA stages x̂ (m · k elements) in shared memory once, then
/// its warps stream W two rows at a time, every lane with eight 16-byte
/// loads in flight (ld.global.nc, not kept in L1: each weight is read once
/// a step), and reduce the two rows' m dot products by shuffles.  The grid
/// is sized so that every warp gets the same number of row pairs.  Launched
/// as a programmatic dependent launch (pdl.cuh): its first weight loads go
/// out while the kernel before it finishes, and only then does it wait for
/// x.  No allocation, no synchronisation: graph-capturable.  No LibTorch.
///
/// Limits (decode_gemv_unsupported): 1 ≤ m ≤ 4; k a multiple of 8; x, W,
/// y, residual and norm_weight 16-byte aligned, with row strides (elements)
/// that keep every row 16-byte aligned; m · k · sizeof(T) ≤ 96 KiB.

#include <cstdint>

#include <cuda_runtime_api.h>

namespace tandem::gpu::kernels {

enum class gemv_dtype { bf16, fp16 };

struct decode_gemv_args {
  int m = 0;             ///< rows of x (tokens)
  int64_t n = 0;         ///< outputs: rows of W
  int64_t k = 0;         ///< inputs: columns of x and W
  gemv_dtype dtype = gemv_dtype::bf16;
  const void* x = nullptr;            ///< [m, k], row stride ldx
  int64_t ldx = 0;
  const void* w = nullptr;            ///< [n, k] contiguous (nn.Linear's layout)
  const void* residual = nullptr;     ///< [m, n], row stride ldr; nullptr: none
  int64_t ldr = 0;
  const void* norm_weight = nullptr;  ///< [k]; nullptr: x is used as it is
  float eps = 1e-6f;
  bool swiglu_input = false;          ///< x is [m, 2k]: gate columns, then up (not with norm_weight)
  void* y = nullptr;                  ///< [m, n], row stride ldy (may not alias x or W)
  int64_t ldy = 0;
};

/// nullptr when the kernel takes these arguments; otherwise why not.  Does
/// not look at y (any pointer: the kernel writes it element by element), so
/// a caller can ask before allocating it.
const char* decode_gemv_unsupported(const decode_gemv_args& a);

/// Launches on `stream` (the current device).  cudaErrorInvalidValue,
/// launching nothing, when decode_gemv_unsupported says why not or y is null.
cudaError_t decode_gemv(const decode_gemv_args& a, cudaStream_t stream);

} // namespace tandem::gpu::kernels
