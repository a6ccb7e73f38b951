#pragma once
/// The DFlash drafter's KV-injection attention (DFLASH.md "Training step" 3)
/// as CUDA kernels that touch only the visible keys, forward and backward.
/// No LibTorch here: raw pointers, element strides and a stream; every
/// temporary is the caller's (graph-capturable: no allocation, no sync).
///
/// Layout, per row b: S context keys, then Q = N·16 block keys; query row
/// j·16 + r (block j) sees context key c iff keep[b, j] and
/// ctx_lo[b, j] <= c < ctx_hi[b, j], and block key i iff keep[b, j],
/// i / 16 == j and i % 16 < own_keys (all 16 unless the shape says fewer).  A block with keep = false sees nothing: its output rows are
/// 0, its log-sum-exp −inf, and it sends no gradient anywhere.
///
/// Design (FA2-style, fp32 accumulation; on sm_90a at d = 128 with G a
/// multiple of 4 the context tiles go through Hopper's wgmma, see
/// wgmma.cuh: a warpgroup = 4 heads of one block = 64 query rows, or 64
/// context keys in the key-major role, K/V and Q/dO tiles in 128-byte-
/// swizzled shared memory; elsewhere mma.sync m16n8k16 + ldmatrix):
/// - forward: a CTA takes 16-row query tiles that share a kv head (warp =
///   one (block, q head)); own block first, then the union of the CTA's
///   context ranges in 64-key tiles in shared memory (cp.async), online
///   softmax; writes O (bf16/fp16) and the fp32 LSE.  With wgmma (an sm_90a
///   build on an sm_90 device, G = 4 or 8) the context is staged: at G = 4
///   three blocks a CTA (12 warps) share each K/V tile over four stages with
///   a full and an empty mbarrier each, so that their warpgroups need not
///   wait for each other every tile (at G = 8 one block's two warpgroups);
///   elsewhere one block a CTA (4 warps, 8 at G = 8), two stages.  Tiles wholly inside a range
///   (all but its ends) skip the per-key visibility tests, here and in the
///   backward's query-major role.
/// - backward: delta = rowsum(dO∘O) in a small kernel, then one launch of
///   two roles (8 warps a CTA): key-major CTAs first (128 context keys,
///   warp = 16 keys with K/V and dK/dV in registers; they walk the blocks
///   whose range meets their keys, in order, all heads of the group per
///   pipeline stage), then query-major CTAs (dQ over every visible key, and
///   the own block's dK/dV summed over the group in a fixed order), which
///   fill the machine behind the long key-major ones.  No atomics: results
///   are bit-for-bit deterministic.
/// Anchors need not be sorted for correctness; sorted anchors make each
/// key tile's list of blocks a contiguous run and the CTAs' unions tight.

#include <cstdint>

#include <cuda_runtime_api.h>

namespace tandem::gpu::kernels {

enum class attn_dtype { bf16, fp16 };

/// A [B, heads, T, d] input: element strides; d contiguous, 16-byte aligned
/// rows (strides multiples of 8, data 16-byte aligned).
struct attn_in {
  const void* data = nullptr;
  int64_t batch = 0, head = 0, token = 0;
};

/// A [B, heads, T, d] output (even strides, d contiguous).
struct attn_out {
  void* data = nullptr;
  int64_t batch = 0, head = 0, token = 0;
};

struct dflash_attention_shape {
  int batch = 0;       ///< B
  int heads = 0;       ///< H query heads
  int kv_heads = 0;    ///< Hkv (H % Hkv == 0)
  int ctx_len = 0;     ///< S
  int blocks = 0;      ///< N
  int block_size = 0;  ///< Bs: the kernels take 16
  /// Own-block keys a query row sees: the first own_keys of its block's 16
  /// (0: all 16).  A drafter with a block size below 16 runs as blocks of 16
  /// rows, its own rows first (gpu/models/dflash_attention.cpp pads them):
  /// the padding keys stay unseen; the padding rows are computed like any
  /// other and send zero gradients because their dO is zero (the caller drops
  /// their output).
  int own_keys = 0;
  int head_dim = 0;    ///< d: 32, 64 or 128
  float scale = 0;     ///< softmax scale (d^-0.5)
  attn_dtype dtype = attn_dtype::bf16;
};

/// Per-block visibility, [B, N] contiguous each.
struct dflash_ranges {
  const int32_t* ctx_lo = nullptr;  ///< first visible context key
  const int32_t* ctx_hi = nullptr;  ///< one past the last (the anchor)
  const uint8_t* keep = nullptr;    ///< 0: the block sees nothing
};

struct dflash_attention_fwd_args {
  dflash_attention_shape shape;
  attn_in q;                 ///< [B, H, Q, d]
  attn_in k_ctx, v_ctx;      ///< [B, Hkv, S, d]
  attn_in k_blk, v_blk;      ///< [B, Hkv, Q, d]
  dflash_ranges ranges;
  attn_out out;              ///< [B, H, Q, d]
  float* lse = nullptr;      ///< [B, H, Q] contiguous, natural log
  int variant = 0;           ///< 0: the tuned default; bits pick benchmark variants (.cu)
  /// Chunked mode (a target's causal, document-packed attention; forward
  /// only): block j's query rows are row0[b, j] … row0[b, j] + rows[b, j] − 1
  /// (at most 16) of q, out and lse, which hold q_rows rows a batch row; its
  /// own keys are the same rows of k_blk/v_blk, key i seen by row r iff
  /// i ≤ r.  Null: rows j·16 … j·16 + 15, all 16 keys seen (DFlash).
  const int32_t* row0 = nullptr;  ///< [B, N]
  const int32_t* rows = nullptr;  ///< [B, N]
  int q_rows = 0;
};

struct dflash_attention_bwd_args {
  dflash_attention_shape shape;
  attn_in q, k_ctx, v_ctx, k_blk, v_blk;  ///< as in the forward
  attn_in out, dout;                      ///< [B, H, Q, d]
  const float* lse = nullptr;             ///< [B, H, Q] from the forward
  dflash_ranges ranges;
  float* delta = nullptr;                 ///< [B, H, Q] workspace: rowsum(dO∘O)
  attn_out dq;                            ///< [B, H, Q, d]
  attn_out dk_ctx, dv_ctx;                ///< [B, Hkv, S, d]
  attn_out dk_blk, dv_blk;                ///< [B, Hkv, Q, d]
  int variant = 0;                        ///< as in the forward
};

/// nullptr when the kernels take `shape`; otherwise why not (for a
/// "falls back to dense SDPA" message).
const char* dflash_attention_unsupported(const dflash_attention_shape& shape);

/// Whether the kernels run `shape` through Hopper's wgmma (the forward's
/// context and both backward roles) with `variant` on a device of compute
/// capability `device_major`: the build has sm_90a, the device is sm_90,
/// d = 128, a GQA group of a multiple of 4, variant bit 64 off, and the
/// key-major role's block list fits its shared memory (shape.blocks; 0 for
/// "any ordinary count").  Otherwise they run their mma.sync forms.
bool dflash_attention_uses_wgmma(const dflash_attention_shape& shape, int variant, int device_major);

/// Writes out and lse.  cudaErrorInvalidValue for an unsupported shape or a
/// misaligned operand; otherwise the launch's error.
cudaError_t dflash_attention_forward(const dflash_attention_fwd_args& args, cudaStream_t stream);

/// Writes delta, dq, dk_ctx, dv_ctx, dk_blk, dv_blk (every element).
cudaError_t dflash_attention_backward(const dflash_attention_bwd_args& args, cudaStream_t stream);

} // namespace tandem::gpu::kernels
