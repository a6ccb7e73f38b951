#pragma once
/// The DFlash drafter (DFLASH.md): Qwen3 decoder layers whose attention
/// sees keys/values of the fused target context H_t before the block's own;
/// no embedding or head of its own (the target's are used, frozen).

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "gpu/io/hf_config.hpp"
#include "gpu/models/common.hpp"

namespace tandem::gpu {

/// Every trainable parameter of a drafter (z-lab names in comments; n taps).
struct dflash_weights {
  at::Tensor fc;                             ///< [D, n·D] fc.weight
  at::Tensor hidden_norm;                    ///< [D]      hidden_norm.weight
  std::vector<decoder_layer_weights> layers; ///< layers.{i}.*
  at::Tensor norm;                           ///< [D]      norm.weight
};

/// Reads and checks a drafter state dict (z-lab names).
dflash_weights dflash_weights_from(const std::map<std::string, at::Tensor>& tensors,
                                   const dflash_config& cfg, at::ScalarType dtype,
                                   const std::string& file);

/// The state dict under z-lab names (tensors shared, not copied).
std::map<std::string, at::Tensor> dflash_state_dict(const dflash_weights& w);

/// Pointers to every parameter, in state-dict order (names alongside).
std::vector<std::pair<std::string, at::Tensor*>> dflash_parameters(dflash_weights& w);

/// Loads `dir` (config.json with dflash_config + model.safetensors).
std::pair<dflash_config, dflash_weights> load_dflash(const std::filesystem::path& dir,
                                                     at::Device device, at::ScalarType dtype);

/// Writes the z-lab layout into `dir` (config.json + model.safetensors, in
/// `dtype`), loadable by the `dflash` package, SGLang and vLLM.
void export_dflash(const std::filesystem::path& dir, const dflash_config& cfg,
                   const dflash_weights& w, at::ScalarType dtype);

/// Inputs of one drafter forward in the training layout: per row, S context
/// positions then Q = N·Bs block positions.  Attention visibility comes as
/// per-block ranges (block j sees context keys ctx_lo ≤ c < ctx_hi and its
/// own block, nothing at all when keep is false), which dflash_attention
/// (gpu/models/dflash_attention.hpp) walks without a dense mask; when they
/// are undefined, the dense `visible` mask is used as given.
struct dflash_inputs {
  at::Tensor target_hidden;    ///< [B, S, n·D] raw taps (fc + hidden_norm applied inside)
  at::Tensor block_embeds;     ///< [B, Q, D] target embedding of the block tokens
  /// Optional, both or neither: block_embeds is [anchor_embeds[:, j], mask_embed × (Bs − 1)]
  /// for every block j (Bs = Q / N), which dflash_forward uses on CUDA to run the first
  /// layer's input norm and q/k/v projections on the B·N + 1 distinct rows only.
  at::Tensor anchor_embeds;    ///< [B, N, D] the embedding of each block's anchor token
  at::Tensor mask_embed;       ///< [D] the embedding of the mask token
  at::Tensor ctx_positions;    ///< [B, S] RoPE positions of the context
  at::Tensor block_positions;  ///< [B, Q] RoPE positions of the block tokens
  at::Tensor visible;          ///< [B, 1, Q, S+Q] bool: query may see key (dense form)
  at::Tensor ctx_lo;           ///< [B, N] int32: first context key block j sees
  at::Tensor ctx_hi;           ///< [B, N] int32: one past its last (the anchor)
  at::Tensor keep;             ///< [B, N] bool: false = padding block, sees nothing
};

/// Positions 1 … Bs−1 of every block of `t`, whose dimension 1 holds N·Bs
/// block positions ([B, N·Bs, …]): [B, N·(Bs−1), …], block by block (a copy:
/// drop_block_firsts, gpu/models/block_rows.hpp).  Position 0 is the anchor's
/// own token, never scored.
at::Tensor scored_positions(const at::Tensor& t, int64_t block_size);

/// Drafter forward: block hidden states after the final norm, [B, Q, D].
/// Differentiable in the drafter's weights.
///
/// scored_only = Bs (> 0; training): the last layer computes, after its
/// attention, only positions 1 … Bs − 1 of every block (position 0 is the
/// anchor's own token, never scored, and no later layer reads it), so the
/// result is [B, Q·(Bs − 1)/Bs, D], block by block.  On CUDA the layers'
/// residual adds also go into the o and down projections' GEMMs
/// (fused_linear_residual), and with anchor_embeds and mask_embed given (and
/// block_embeds needing no gradient) the first layer's input norm and q/k/v
/// projections run on the distinct rows (one a block plus the mask row) and
/// are spread to every block position after; the CPU keeps its composites bit for bit.
at::Tensor dflash_forward(const dflash_weights& w, const dflash_config& cfg,
                          const dflash_inputs& in, int64_t scored_only = 0);

} // namespace tandem::gpu
