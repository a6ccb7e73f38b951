#pragma once
/// Useful FLOPs of the drafter's training step and the target's forward
/// (docs/bench.md, "FLOP formulas"): what `tandem bench` and the run's
/// metrics (`tflop` of each step) count.  Plain arithmetic, no LibTorch.

#include <cstdint>

#include "gpu/io/hf_config.hpp"

namespace tandem::gpu {

/// Peak dense bf16 of an H100/H200, the MFU denominator.
constexpr double peak_tflops_bf16 = 989.0;

/// The matmul dimensions of one Qwen3-style decoder layer.
struct matmul_dims {
  double hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0, vocab = 0;
};

/// The matmul dimensions of a Qwen3 config.
inline matmul_dims dims_of(const qwen3_config& c) {
  return {static_cast<double>(c.hidden_size), static_cast<double>(c.num_attention_heads),
          static_cast<double>(c.num_key_value_heads), static_cast<double>(c.head_dim),
          static_cast<double>(c.intermediate_size), static_cast<double>(c.vocab_size)};
}

/// One decoder layer's matmuls over `tokens` query tokens and `kv_tokens`
/// extra key/value-only tokens (the drafter's context).
inline double layer_linear_flops(const matmul_dims& c, double tokens, double kv_tokens) {
  const double d = c.hidden, q = c.heads * c.head_dim, kv = c.kv_heads * c.head_dim, i = c.intermediate;
  return 2 * tokens * (d * q + q * d + 3 * d * i) + 2 * (tokens + kv_tokens) * 2 * d * kv;
}

/// Attention over `pairs` visible (query, key) pairs: QKᵀ and PV.
inline double attention_flops(const matmul_dims& c, double pairs) {
  return 4 * pairs * c.heads * c.head_dim;
}

/// One drafter step: forward = layers · (linear + attention over visible
/// pairs) + fc + lm-head over the scored positions 1 … Bs − 1 of each block
/// (position 0, the anchor's own token, skips it, and the last layer's o
/// projection and MLP, which feed only the lm-head); backward = 2 × layers +
/// fc's weight gradient + the lm-head's input gradient (it is frozen).  The
/// first layer's q, k and v projections of the block rows count once per
/// distinct row (each block's anchor and the one mask row: the other rows
/// repeat the mask row) for the forward and the weight gradient, and not for
/// an input gradient (the embeddings are frozen).  `anchor_sum` = Σ_j anchor_j
/// over the batch (each block sees its anchor's prefix and its own block).
/// Nothing is counted for clip and AdamW (memory-bound).
inline double drafter_step_flops(const matmul_dims& layer, int64_t draft_layers, int64_t n_taps,
                                 double batch, double seq, double anchors, double block,
                                 double anchor_sum) {
  const double d = layer.hidden;
  const double q = anchors * block;
  const double pairs = anchor_sum * block + batch * q * block;
  const double one = layer_linear_flops(layer, batch * q, batch * seq) + attention_flops(layer, pairs);
  const double fc = 2.0 * batch * seq * n_taps * d * d;
  const double head_f = 2.0 * batch * anchors * (block - 1) * d * layer.vocab;
  const double hq = layer.heads * layer.head_dim;
  const double unscored = draft_layers > 0 ? 2.0 * batch * anchors * (hq * d + 3 * d * layer.intermediate) : 0.0;
  const double kv = layer.kv_heads * layer.head_dim;
  const auto qkv = [&](double rows) { return 2.0 * rows * d * (hq + 2 * kv); };
  const double first = draft_layers > 0 ? 3 * qkv(batch * q) - 2 * qkv(batch * anchors + 1) : 0.0;
  return 3 * (static_cast<double>(draft_layers) * one - unscored) - first + 2 * fc + 2 * head_f;
}

/// Σ anchor_j at its expected value when the N anchors of each row are
/// uniform over the candidates 0 … S − Bs (one document a row): what the
/// bench and the run's metrics use, since the anchors stay on the device.
inline double expected_anchor_sum(double batch, double seq, double anchors, double block) {
  return batch * anchors * (seq - block) / 2.0;
}

/// drafter_step_flops with Σ anchor_j at its expectation.
inline double expected_drafter_step_flops(const matmul_dims& layer, int64_t draft_layers, int64_t n_taps,
                                          double batch, double seq, double anchors, double block) {
  return drafter_step_flops(layer, draft_layers, n_taps, batch, seq, anchors, block,
                            expected_anchor_sum(batch, seq, anchors, block));
}

} // namespace tandem::gpu
