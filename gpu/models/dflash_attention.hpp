#pragma once
/// The drafter's KV-injection attention (DFLASH.md "Training step" 3) as one
/// differentiable op.  On CUDA it runs Tandem's kernels
/// (gpu/kernels/dflash_attention.cu), which touch only the visible keys
/// (a GQA group they do not take, such as Qwen3-14B's 5, by padding the
/// query heads with zero heads or repeating each kv head into one they do);
/// on the CPU, or for a dtype or shape they do
/// not take, it falls back to the dense-mask SDPA formulation (correct
/// everywhere, ~7× the work at Qwen3-8B shapes).  Both paths compute the
/// same function:
///
///   query row j·Bs + r (block j) sees context key c < S iff keep[b, j] and
///   ctx_lo[b, j] <= c < ctx_hi[b, j], and block key S + i iff keep[b, j]
///   and i lies in block j.  A block with keep = false sees nothing: its
///   output rows are exactly 0 and it sends no gradient (DFLASH.md pitfall 3).

#include <string>

#include "gpu/pch.hpp"

namespace tandem::gpu {

/// out [B, H, Q, d] from q [B, H, Q, d], k_ctx/v_ctx [B, Hkv, S, d],
/// k_blk/v_blk [B, Hkv, Q, d] (after RoPE and k_norm; any strides),
/// ctx_lo/ctx_hi [B, N] integer, keep [B, N] bool, Q = N·Bs.  Differentiable
/// in q, k_ctx, v_ctx, k_blk, v_blk.  The kernel path returns `out` over
/// [B, Q, H, d] memory, so `out.transpose(1, 2).reshape({B, Q, H·d})` is a
/// view.  Throws gpu::error(bad_input) for inconsistent shapes.
at::Tensor dflash_attention(const at::Tensor& q, const at::Tensor& k_ctx, const at::Tensor& v_ctx,
                            const at::Tensor& k_blk, const at::Tensor& v_blk,
                            const at::Tensor& ctx_lo, const at::Tensor& ctx_hi,
                            const at::Tensor& keep, double scale);

/// Which path dflash_attention takes for operands of this device and dtype
/// and these sizes: "cuda kernel", "cuda kernel (<form>)" where <form> is
/// "blocks of <Bs> rows padded to 16", "query heads padded to a group of
/// <P>[, kv heads repeated <r>x]: GQA group <G>" or "kv heads repeated <r>x:
/// GQA group <G>" (the first and one of the others joined by "; "), or
/// "sdpa dense mask (<why not>)".  The choice between padding and repeating
/// assumes an ordinary block count (dflash_attention itself also checks the
/// key-major role's shared memory for the call's count).
std::string dflash_attention_path(const at::TensorOptions& options, int64_t heads,
                                  int64_t kv_heads, int64_t head_dim, int64_t block_size);

/// Attention of q over k, v [B, H, *, d] under a boolean mask, differentiable
/// through autograd.  On CUDA, SDPA takes the memory-efficient kernel for a
/// boolean mask, whose backward sums dQ over key splits with atomics (not
/// run-to-run deterministic); so there, while the dense scores fit in
/// masked_attention_math_bytes, the math composite runs instead (bit-for-bit
/// repeatable), and past that SDPA (the memory the scores would take matters
/// more).  Elsewhere SDPA.
at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask, double scale);
inline constexpr int64_t masked_attention_math_bytes = int64_t{1} << 30;

/// The fallback: masked_attention over the dense mask.
at::Tensor dflash_attention_dense(const at::Tensor& q, const at::Tensor& k_ctx,
                                  const at::Tensor& v_ctx, const at::Tensor& k_blk,
                                  const at::Tensor& v_blk, const at::Tensor& ctx_lo,
                                  const at::Tensor& ctx_hi, const at::Tensor& keep, double scale);

/// The mask both paths implement, [B, 1, N·Bs, S + N·Bs] bool (true =
/// visible; a padding block's rows are all false).
at::Tensor dflash_visible_mask(const at::Tensor& ctx_lo, const at::Tensor& ctx_hi,
                               const at::Tensor& keep, int64_t ctx_len, int64_t block_size);

/// The kernels themselves, for tests and benchmarks (CUDA only; throw
/// gpu::error when dflash_attention_path is not "cuda kernel").
struct dflash_attention_result {
  at::Tensor out;  ///< [B, H, Q, d] over [B, Q, H, d] memory
  at::Tensor lse;  ///< [B, H, Q] float32, natural log; −inf on padding rows
};
dflash_attention_result dflash_attention_forward(const at::Tensor& q, const at::Tensor& k_ctx,
                                                 const at::Tensor& v_ctx, const at::Tensor& k_blk,
                                                 const at::Tensor& v_blk, const at::Tensor& ctx_lo,
                                                 const at::Tensor& ctx_hi, const at::Tensor& keep,
                                                 double scale);

struct dflash_attention_grads {
  at::Tensor dq, dk_ctx, dv_ctx, dk_blk, dv_blk;  ///< shapes of q, k_ctx, v_ctx, k_blk, v_blk
};
dflash_attention_grads dflash_attention_backward(
  const at::Tensor& q, const at::Tensor& k_ctx, const at::Tensor& v_ctx, const at::Tensor& k_blk,
  const at::Tensor& v_blk, const at::Tensor& ctx_lo, const at::Tensor& ctx_hi,
  const at::Tensor& keep, double scale, const at::Tensor& out, const at::Tensor& lse,
  const at::Tensor& dout);

/// The forward kernel in chunked mode, as a target's causal attention over
/// packed documents (gpu/models/qwen3_packed.cpp; issue 20): each document
/// becomes 16-row chunks, chunk c of a document seeing the document's rows
/// before it as context and its own rows causally, the GQA group's heads
/// sharing each K/V tile.  The table of chunks, [B, N] each, N = ⌈S/16⌉ +
/// documents a row (a fixed bound, so a captured graph keeps its shapes):
/// chunks past a row's count have rows = 0 and keep = false.
struct causal_chunks {
  at::Tensor lo, hi, keep, row0, rows;  ///< int32, int32, bool, int32, int32
};

/// The chunk table of rows of length `s` split into documents [B, D] by
/// their `starts` and `lengths` (int64, on the device; together covering
/// each row, zero lengths allowed), by tensor operations only (no host sync).
causal_chunks causal_chunks_of(const at::Tensor& starts, const at::Tensor& lengths, int64_t s);

/// Empty when causal_chunked_attention takes operands of this dtype, device
/// and shape; otherwise why not.  It is used where it was measured faster
/// than FlashAttention-2 varlen: bf16, head_dim 128, a GQA group of a
/// multiple of 4 (the wgmma path), CUDA sm_90.
std::string causal_chunked_unsupported(const at::TensorOptions& options, int64_t heads,
                                       int64_t kv_heads, int64_t head_dim);

/// out [B·S, H, d] (contiguous) from q [B·S, H, d] and k, v [B·S, Hkv, d]
/// (any strides with d contiguous and 16-byte aligned rows, e.g. views of
/// a fused qkv projection), rows of `s` tokens, under the chunk table.
at::Tensor causal_chunked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const causal_chunks& chunks, int64_t s, double scale);

} // namespace tandem::gpu
