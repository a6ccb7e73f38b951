#pragma once
/// The DFlash training objective (DFLASH.md "Training step"): anchor
/// sampling, the block layout and its attention mask, and the decay-weighted
/// cross-entropy through the target's lm-head, computed in chunks so the
/// N·Bs·V logits never exist at once.  Everything stays on the device: no
/// host synchronisation, so the whole step can be captured in a graph.

#include "gpu/io/hf_config.hpp"
#include "gpu/models/common.hpp"
#include "gpu/models/dflash.hpp"

namespace tandem::gpu {

/// Anchors of a batch: N slots per row, sorted ascending; slots past the
/// row's count have keep = false (and anchor 0).
struct anchor_set {
  at::Tensor anchors;  ///< [B, N] int64
  at::Tensor keep;     ///< [B, N] bool
};

/// Draws anchors on the device with `gen`: candidates are positions a with
/// loss_mask[a] = 1, a <= S − Bs, and a + 1 inside a's document; each row
/// takes min(N, count − 1) of them uniformly without replacement, sorted.
anchor_set sample_anchors(const at::Tensor& loss_mask, const doc_layout& docs, int64_t num_anchors,
                          int64_t block_size, at::Generator gen);

/// The block layout for given anchors: the drafter's inputs (block
/// embeddings through the target's `embedding`), labels and loss weights.
struct block_batch {
  dflash_inputs inputs;
  at::Tensor labels;       ///< [B, Q] int64: tokens[anchor + k]
  at::Tensor mask;         ///< [B, Q] float: m = keep·[in doc]·[k > 0]·loss_mask
  at::Tensor loss_weight;  ///< [B, Q] float: m · exp(−(k − 1)/γ)
};

/// `tokens` [B, S] int64, `loss_mask` [B, S], `target_hidden` [B, S, n·D].
/// `dense_mask` false leaves `inputs.visible` undefined: dflash_forward
/// needs only the per-block ranges, and the dense [B, 1, Q, S+Q] mask is
/// 92 MB at Qwen3-8B shapes (the engine's step skips it; tests compare it).
block_batch make_block_batch(const at::Tensor& tokens, const at::Tensor& loss_mask,
                             const doc_layout& docs, const at::Tensor& target_hidden,
                             const anchor_set& anchors, const at::Tensor& embedding,
                             int64_t block_size, int64_t mask_token_id, double gamma,
                             bool dense_mask = true);

/// Σ weight·CE(hidden·headᵀ, label) and Σ mask·[argmax = label] over rows,
/// with logits computed `chunk_rows` rows at a time, once: the forward also
/// computes the gradient in hidden (for an upstream gradient of 1) while each
/// chunk's logits exist, and backward scales it.  `head` gets no gradient;
/// hidden does.
struct chunked_ce_result {
  at::Tensor weighted_ce;  ///< [] float32, differentiable in hidden
  at::Tensor hits;         ///< [] float32, Σ mask over correct argmax
  at::Tensor row_hits;     ///< [rows] float32, mask·[argmax = label] per row
};
chunked_ce_result chunked_cross_entropy(const at::Tensor& hidden, const at::Tensor& head,
                                        const at::Tensor& labels, const at::Tensor& weight,
                                        const at::Tensor& mask, int64_t chunk_rows);

struct objective_options {
  int64_t block_size = 16;
  int64_t mask_token_id = 0;
  double gamma = 7.0;         ///< loss decay; DFLASH.md: 7 for Bs 16, 5 for 10, 4 for 8
  int64_t chunk_rows = 2048;  ///< lm-head rows per chunk
};

/// DFLASH.md's γ for a block size (7 for 16, 5 for 10, 4 for 8; otherwise
/// interpolated as Bs/2 − 1, at least 1).
double default_gamma(int64_t block_size);

/// chunked_cross_entropy over the rows that can be scored: positions
/// 1 … Bs − 1 of every block of `hidden` [B, N·Bs, D] (position 0 is the
/// anchor's own token, never scored), or `hidden` as it is when it holds
/// only those, [B, N·(Bs − 1), D] (dflash_forward's scored_only).
/// `row_hits` is [B·N·(Bs − 1)], block by block.
chunked_ce_result scored_cross_entropy(const at::Tensor& hidden, const at::Tensor& head,
                                       const block_batch& batch, const objective_options& opts);

struct objective_output {
  at::Tensor loss;      ///< [] float32: Σ m·w·CE / (Σ m·w + 1e-6)
  at::Tensor accuracy;  ///< [] float32: Σ m·hit / max(Σ m, 1)
  at::Tensor scored;    ///< [] float32: Σ m
  /// [] float32: simulated acceptance length, as SpecForge reports it: per
  /// block, 1 + the run of leading positions k = 1, 2, … whose argmax is
  /// the label (and scored), averaged over the blocks with a scored
  /// position.  An estimate from teacher-forced blocks, not τ.
  at::Tensor sim_accept;
};

/// Loss of one batch; differentiable in the drafter's weights.
objective_output dflash_objective(const dflash_weights& w, const dflash_config& cfg,
                                  const block_batch& batch, const at::Tensor& lm_head,
                                  const objective_options& opts);

} // namespace tandem::gpu
