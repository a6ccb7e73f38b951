#pragma once
/// Hugging Face `config.json` files of the models Tandem reads and writes:
/// the Qwen3 target (`Qwen3ForCausalLM`) and the DFlash drafter
/// (`DFlashDraftModel`, the z-lab layout; see DFLASH.md). Every malformed or
/// unsupported config throws gpu::error(errc::bad_input) naming the file and
/// the field.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "gpu/device/error.hpp"

namespace tandem::gpu {

/// The fields of a Qwen3 config that the model code needs. Fields absent
/// from the file take transformers' Qwen3Config defaults where it has a
/// sensible one (noted); the dimensions are required.
struct qwen3_config {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;       ///< default: num_attention_heads
  int64_t head_dim = 0;                  ///< default: hidden_size / num_attention_heads
  int64_t max_position_embeddings = 0;   ///< default: 32768
  double rms_norm_eps = 1e-6;            ///< default: 1e-6
  double rope_theta = 10000.0;           ///< default: 10000
  bool tie_word_embeddings = false;      ///< default: false
  bool attention_bias = false;           ///< default: false
};

/// Reads `path` (config.json, or the directory holding it). The config must
/// be a Qwen3 causal LM: `architectures` contains "Qwen3ForCausalLM", or,
/// when `architectures` is absent (transformers 5 omits it for a bare
/// config), `model_type` is "qwen3". rope_theta is read from the top level
/// (transformers 4) or from `rope_parameters` / `rope_scaling`
/// (transformers 5); RoPE types other than "default", activations other
/// than SiLU and sliding-window attention are rejected.
qwen3_config load_qwen3_config(const std::filesystem::path& path);

/// A DFlash drafter's config: its Qwen3 decoder layers plus the DFlash fields.
struct dflash_config {
  qwen3_config layer;                    ///< num_hidden_layers = draft layers
  int64_t block_size = 16;               ///< Bs
  int64_t num_target_layers = 0;         ///< L of the target
  int64_t mask_token_id = -1;            ///< a row of the target's embedding
  std::vector<int64_t> target_layer_ids; ///< taps, 0-indexed decoder-layer outputs
};

/// Reads `path` (config.json, or the directory holding it). `architectures`
/// must contain "DFlashDraftModel". As the `dflash` package does, each DFlash
/// field is looked up in `dflash_config` first, then at the top level:
/// mask_token_id is required (0 <= id < vocab_size); block_size defaults to
/// 16; target_layer_ids defaults to default_tap_ids(num_target_layers,
/// num_hidden_layers), the dflash package's rule (5 taps for a 5-layer
/// drafter). num_target_layers is required.
dflash_config load_dflash_config(const std::filesystem::path& path);

/// The z-lab config.json of `c` (pretty-printed JSON text): architectures,
/// block_size, num_target_layers, dflash_config{mask_token_id,
/// target_layer_ids}, the Qwen3 layer fields, model_type "qwen3", and
/// `dtype` ("bfloat16", "float16" or "float32").
std::string to_json(const dflash_config& c, const std::string& dtype = "bfloat16");

/// Same as to_json (the name the model code uses).
inline std::string dflash_config_json(const dflash_config& c,
                                      const std::string& dtype = "bfloat16") {
  return to_json(c, dtype);
}

/// The default tap ids for a target of `num_target_layers` layers:
/// round(1 + i·(L−4)/(n−1)) for i in [0, n), rounding half to even as
/// Python does (the dflash package's build_target_layer_ids); n == 1 gives
/// [L/2]. Qwen3-8B (36, 5) → [1, 9, 17, 25, 33]. Throws bad_input when an
/// id would fall outside [0, L).
std::vector<int64_t> default_tap_ids(int64_t num_target_layers, int64_t num_taps);

/// The taps a run uses when model.tap_layers is not set: default_tap_ids(L,
/// 5) when that gives 5 distinct layers in order (L ≥ 8; Qwen3-8B:
/// [1, 9, 17, 25, 33]); for a smaller target, min(5, L) layers spread
/// evenly over [0, L) (4 layers: [0, 1, 2, 3]; 1 layer: [0]).  Never throws
/// for L ≥ 1.
std::vector<int64_t> training_tap_ids(int64_t num_target_layers);

} // namespace tandem::gpu
