// The target actor's forward over packed rows (qwen3.hpp, forward_packed).
//
// Per layer, on tokens flattened to [T = B·S, D]:
//   h   = rms_norm(x)                                (fused kernel)
//   qkv = h · [Wq; Wk; Wv]ᵀ                          (one GEMM)
//   q/k norm + RoPE in place                         (kernels/target_fused.cu)
//   a   = attention, causal per document, GQA (below)
//   x  += a · Woᵀ                                    (addmm_: the add in the GEMM's epilogue)
//   h   = rms_norm(x)
//   gu  = h · [Wg; Wu]ᵀ                              (one GEMM)
//   x  += swiglu(gu) · Wdᵀ                           (kernel, then addmm_)
// The attention: where causal_chunked_unsupported is empty (bf16, head_dim
// 128, GQA groups of 4k, sm_90: Qwen3-8B on Hopper), Tandem's DFlash
// forward kernel in chunked mode (gpu/models/dflash_attention.hpp), each
// document as 16-row chunks whose context is the document before them, the
// group's heads sharing each K/V tile (one layer at 4 × 3072, 32/8 heads:
// 0.348 ms at four documents a row against FlashAttention-2 varlen's
// 0.419, 0.954 against 1.012 at one; docs/bench.md).  Elsewhere, or with
// TANDEM_TARGET_ATTENTION=flash2, FlashAttention-2 (PyTorch's bundled
// aten::_flash_attention_forward): its variable-length kernel takes the
// documents as cu_seqlens (no [S, S] mask, no work on invisible pairs),
// reads the kv heads without expanding them, and needs no host sync;
// gpu/dev/target_attention_probe.py timed it against the mask path, SDPA's
// causal kernels and cuDNN.

#include "gpu/models/qwen3.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "gpu/device/error.hpp"
#include "gpu/models/dflash_attention.hpp"
#include "gpu/models/fused_ops.hpp"

#ifdef TANDEM_HAVE_CUDA
#include "gpu/kernels/target_fused.hpp"
#endif

namespace tandem::gpu {

std::string qwen3_target::packed_path() const {
#ifndef TANDEM_HAVE_CUDA
  return "mask (built without CUDA)";
#else
  if (auto why = fused_layout_unsupported(); !why.empty())
    return "mask (" + why + ")";
  const auto dev = w_.layers[0].qkv_proj.device();
  if (at::cuda::getDeviceProperties(dev.index())->major < 8)
    return "mask (FlashAttention-2 needs compute capability 8.0 or newer)";
  if (cfg_.num_attention_heads % cfg_.num_key_value_heads != 0)
    return "mask (query heads are not a multiple of kv heads)";
  return "packed";
#endif
}

std::string qwen3_target::packed_attention() const {
  if (w_.layers.empty() || !w_.layers[0].qkv_proj.defined())
    return "flash2 varlen (projections not fused)";
  const auto why = causal_chunked_unsupported(w_.layers[0].qkv_proj.options(), cfg_.num_attention_heads,
                                              cfg_.num_key_value_heads, cfg_.head_dim);
  if (!why.empty())
    return "flash2 varlen (" + why + ")";
  if (prefer_flash2_)
    return "flash2 varlen (asked for: TANDEM_TARGET_ATTENTION=flash2 or prefer_flash2)";
  return "dflash chunked";
}

std::string qwen3_target::fused_layout_unsupported() const {
#ifndef TANDEM_HAVE_CUDA
  return "built without CUDA";
#else
  if (w_.layers.empty() || !w_.layers[0].qkv_proj.defined())
    return "projections not fused: not a CUDA bf16/fp16 target";
  if (const char* why = kernels::qk_norm_rope_unsupported(static_cast<int>(cfg_.head_dim)))
    return why;
  for (const auto& l : w_.layers)
    if (reinterpret_cast<uintptr_t>(l.q_norm.data_ptr()) % 16 != 0
        || reinterpret_cast<uintptr_t>(l.k_norm.data_ptr()) % 16 != 0)
      return "a q_norm or k_norm weight is not 16-byte aligned";
  if (cfg_.intermediate_size % 8 != 0)
    return "intermediate_size is not a multiple of 8";
  return "";
#endif
}

qwen3_output qwen3_target::forward_packed(const at::Tensor& input_ids, const at::Tensor& doc_lengths) const {
  const auto b = input_ids.size(0), s = input_ids.size(1);
#ifdef TANDEM_HAVE_CUDA
  if (packed_path() == "packed") {
    at::NoGradGuard no_grad;
    const layer_dims d{cfg_.hidden_size, cfg_.intermediate_size, cfg_.num_attention_heads,
                       cfg_.num_key_value_heads, cfg_.head_dim, cfg_.rms_norm_eps};
    const int64_t t = b * s, hh = d.heads * d.head_dim, kh = d.kv_heads * d.head_dim;
    // Documents as FlashAttention's cu_seqlens over the flattened tokens:
    // each row's lengths, then what they leave of S (the row's padding
    // document), so row r starts at r·S.  Zero lengths are empty sequences.
    // Lengths that overrun S are cut at S, as make_doc_layout cuts them (the
    // RoPE positions below come from it): FlashAttention trusts cu_seqlens,
    // so no sequence may leave its row.
    auto lengths = doc_lengths.to(input_ids.device(), at::kLong).clamp_min(0);
    auto ends = at::cat({lengths, at::full({b, 1}, s, lengths.options())}, 1).cumsum(1).clamp_max(s);
    const auto docs = make_doc_layout(lengths, s);
    // The chunked kernel takes the same documents (and padding) as a table
    // of 16-row chunks instead.
    const bool chunked = packed_attention() == "dflash chunked";
    causal_chunks chunks;
    at::Tensor cu;
    if (chunked) {
      auto starts = at::cat({at::zeros({b, 1}, ends.options()), ends.narrow(1, 0, ends.size(1) - 1)}, 1);
      chunks = causal_chunks_of(starts, ends - starts, s);
    } else {
      auto row0 = at::arange(b, lengths.options()).unsqueeze(1) * s;
      cu = at::cat({at::zeros({1}, lengths.options()), (ends + row0).flatten()}).to(at::kInt);
    }
    auto [cos, sin] = rope_tables(docs.position.reshape({t}), cfg_.head_dim, cfg_.rope_theta);
    cos = cos.contiguous();
    sin = sin.contiguous();
    const double scale = 1.0 / std::sqrt(static_cast<double>(d.head_dim));
    const auto deepest = *std::max_element(tap_ids_.begin(), tap_ids_.end());
    const auto n_taps = static_cast<int64_t>(tap_ids_.size());
    auto x = at::embedding(w_.embed, input_ids.reshape({t}));
    auto taps = at::empty({t, n_taps * d.hidden}, x.options());  // each tap copied in as its layer ends
    for (int64_t i = 0; i <= deepest; ++i) {
      const auto& l = w_.layers[i];
      auto qkv = at::mm(rms_norm(x, l.input_norm, d.eps), l.qkv_proj.t());  // [T, (H+2K)h]
      qk_norm_rope_inplace(qkv, l.q_norm, l.k_norm, d.heads, d.kv_heads, d.head_dim, d.eps, cos, sin);
      auto q = qkv.narrow(1, 0, hh).unflatten(1, {d.heads, d.head_dim});
      auto k = qkv.narrow(1, hh, kh).unflatten(1, {d.kv_heads, d.head_dim});
      auto v = qkv.narrow(1, hh + kh, kh).unflatten(1, {d.kv_heads, d.head_dim});
      auto attn = chunked ? causal_chunked_attention(q, k, v, chunks, s, scale)
                          : std::get<0>(at::_flash_attention_forward(q, k, v, cu, cu, s, s, 0.0, /*is_causal=*/true,
                                                                     /*return_debug_mask=*/false, scale));
      x.addmm_(attn.reshape({t, hh}), l.o_proj.t());  // in place: no copy of x for beta = 1
      auto gu = at::mm(rms_norm(x, l.post_norm, d.eps), l.gate_up_proj.t());  // [T, 2I]
      auto act = swiglu_rows(gu);
      x.addmm_(act, l.down_proj.t());
      for (int64_t k2 = 0; k2 < n_taps; ++k2)
        if (tap_ids_[k2] == i)
          taps.narrow(1, k2 * d.hidden, d.hidden).copy_(tap_of(x, i));  // x changes in place after
    }
    qwen3_output out;
    out.taps = taps.view({b, s, n_taps * d.hidden});
    return out;
  }
#endif
  return forward(input_ids, make_doc_layout(doc_lengths, s));
}

} // namespace tandem::gpu
