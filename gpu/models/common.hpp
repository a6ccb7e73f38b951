#pragma once
/// Building blocks shared by the Qwen3 target and the DFlash drafter:
/// RMSNorm, rotary embeddings, the decoder layer's weights, document layout.
/// Plain LibTorch functions over tensors; no module objects, no global state.

#include <map>
#include <string>

#include "gpu/pch.hpp"

namespace tandem::gpu {

/// One Qwen3 decoder layer's parameters (HF names in comments; D hidden,
/// H query heads, K kv heads, h head_dim, I intermediate).
struct decoder_layer_weights {
  at::Tensor input_norm;  ///< [D]      input_layernorm.weight
  at::Tensor q_proj;      ///< [H*h, D] self_attn.q_proj.weight
  at::Tensor k_proj;      ///< [K*h, D] self_attn.k_proj.weight
  at::Tensor v_proj;      ///< [K*h, D] self_attn.v_proj.weight
  at::Tensor o_proj;      ///< [D, H*h] self_attn.o_proj.weight
  at::Tensor q_norm;      ///< [h]      self_attn.q_norm.weight
  at::Tensor k_norm;      ///< [h]      self_attn.k_norm.weight
  at::Tensor post_norm;   ///< [D]      post_attention_layernorm.weight
  at::Tensor gate_proj;   ///< [I, D]   mlp.gate_proj.weight
  at::Tensor up_proj;     ///< [I, D]   mlp.up_proj.weight
  at::Tensor down_proj;   ///< [D, I]   mlp.down_proj.weight
  /// The frozen target's fused projections (qwen3_target fuses them on a
  /// CUDA device; undefined elsewhere and in the drafter): q_proj, k_proj and
  /// v_proj are then row views of qkv_proj, gate_proj and up_proj of
  /// gate_up_proj, so the per-projection code (decode, export) reads the
  /// same memory.  Not in layer_tensors().
  at::Tensor qkv_proj;     ///< [(H+2K)*h, D]: q rows, then k, then v
  at::Tensor gate_up_proj; ///< [2I, D]: gate rows, then up
};
constexpr int decoder_layer_tensor_count = 11;

/// Shapes of one decoder layer.
struct layer_dims {
  int64_t hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0;
  double eps = 1e-6;
};

/// Reads `prefix` + HF names from `tensors`, checks shapes, converts to
/// `dtype`.  Throws gpu::error(bad_input) naming `file` and the tensor.
decoder_layer_weights take_decoder_layer(const std::map<std::string, at::Tensor>& tensors,
                                         const std::string& prefix, const layer_dims& dims,
                                         at::ScalarType dtype, const std::string& file);

/// A layer of random weights (normal, std `std`; norms 1), made directly
/// on `device` with the private generator `gen`: benchmarks at real shapes
/// without a checkpoint.
decoder_layer_weights random_decoder_layer(const layer_dims& dims, at::ScalarType dtype,
                                           at::Device device, at::Generator gen, double std);

/// Writes the layer back under HF names (for export).
void put_decoder_layer(std::map<std::string, at::Tensor>& out, const std::string& prefix,
                       const decoder_layer_weights& w);

/// Every tensor of the layer, in a fixed order (for optimizers, counting).
std::vector<at::Tensor*> layer_tensors(decoder_layer_weights& w);

/// Reads one tensor: presence and shape are checked, dtype converted.
at::Tensor take_tensor(const std::map<std::string, at::Tensor>& tensors, const std::string& name,
                       at::IntArrayRef shape, at::ScalarType dtype, const std::string& file);

/// Qwen3 RMSNorm: computed in float32, scaled by `weight` in the input dtype.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

/// Rotary tables for integer `positions` (any shape P...): cos and sin of
/// shape [P..., head_dim], float32, HF "rotate_half" layout.
std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& positions, int64_t head_dim,
                                              double theta);

/// x: [B, heads, T, h]; cos/sin: [B, T, h].  Returns x rotated, x's dtype.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// GQA: [B, K, T, h] → [B, H, T, h], each kv head serving H/K query heads
/// (keeps SDPA on its fused kernels, which take equal head counts).
at::Tensor expand_kv_heads(const at::Tensor& kv, int64_t heads);

/// The attention projections of a decoder layer for x [B, T, D] at the
/// positions of cos/sin [B, T, h]: q = RoPE(q_norm(Wq x)) [B, H, T, h],
/// k = RoPE(k_norm(Wk x)) [B, K, T, h], v = Wv x [B, K, T, h] (k and v not
/// yet expanded to H heads).  The target, the drafter and both decoders
/// (gpu/decode/) use them, so a cached key is computed exactly as in training.
at::Tensor project_q(const at::Tensor& x, const decoder_layer_weights& w, const layer_dims& d,
                     const at::Tensor& cos, const at::Tensor& sin);
at::Tensor project_k(const at::Tensor& x, const decoder_layer_weights& w, const layer_dims& d,
                     const at::Tensor& cos, const at::Tensor& sin);
at::Tensor project_v(const at::Tensor& x, const decoder_layer_weights& w, const layer_dims& d);

/// The same from projections already made (raw = x·Wᵀ [B, T, heads·h], e.g.
/// by fused_linears): project_q(x) = q_heads(x·Wqᵀ), and so on.
at::Tensor q_heads(const at::Tensor& raw, const decoder_layer_weights& w, const layer_dims& d,
                   const at::Tensor& cos, const at::Tensor& sin);
at::Tensor k_heads(const at::Tensor& raw, const decoder_layer_weights& w, const layer_dims& d,
                   const at::Tensor& cos, const at::Tensor& sin);
at::Tensor v_heads(const at::Tensor& raw, const layer_dims& d);

/// SwiGLU MLP of a decoder layer; with `residual` defined, residual + MLP(x)
/// with the add in the down projection's GEMM (fused_linear_residual).
at::Tensor swiglu_mlp(const at::Tensor& x, const decoder_layer_weights& w, const at::Tensor& residual = {});

/// Where each token's document starts and ends, for rows that pack several
/// documents.  All [B, S] int64 on the tokens' device.
struct doc_layout {
  at::Tensor start;     ///< index of the first token of the token's document
  at::Tensor end;       ///< one past its last token
  at::Tensor position;  ///< index within its document (RoPE position)
  at::Tensor segment;   ///< document number within the row
};

/// From per-row document lengths [B, K] (zeros allowed; a row's lengths sum
/// to at most S, the rest of the row is one more "padding" document).
doc_layout make_doc_layout(const at::Tensor& doc_lengths, int64_t seq_len);

/// One document per row, filling it.
doc_layout whole_row_layout(int64_t batch, int64_t seq_len, const at::Device& device);

} // namespace tandem::gpu
