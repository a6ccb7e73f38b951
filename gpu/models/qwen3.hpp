#pragma once
/// The frozen Qwen3 (dense) target: forward over packed rows, returning the
/// fused tap tensor the drafter trains on, and logits only when asked.
/// Inference only (no autograd).  Runs on whatever device its weights are on.

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "gpu/io/hf_config.hpp"
#include "gpu/models/common.hpp"

namespace tandem::gpu {

/// Every parameter of a Qwen3 causal LM (HF names in comments).
struct qwen3_weights {
  at::Tensor embed;                          ///< [V, D] model.embed_tokens.weight
  std::vector<decoder_layer_weights> layers; ///< L of them: model.layers.{i}.*
  at::Tensor final_norm;                     ///< [D] model.norm.weight
  at::Tensor lm_head;                        ///< [V, D] lm_head.weight (= embed when tied)
};

/// Reads and checks a HF state dict; `dtype` is the compute dtype (float32
/// on the CPU, bfloat16 on the GPU).  Only layers up to `keep_layers` are
/// read (the deepest tap + 1), unless `keep_layers` < 0.
qwen3_weights qwen3_weights_from(const std::map<std::string, at::Tensor>& tensors,
                                 const qwen3_config& cfg, at::ScalarType dtype,
                                 const std::string& file, int64_t keep_layers = -1);

struct qwen3_output {
  at::Tensor taps;    ///< [B, S, n·D]: outputs of the tap layers, concatenated
  at::Tensor logits;  ///< [B, S, V] float32, or undefined when not asked for
};

class qwen3_target {
public:
  /// `tap_ids`: 0-indexed decoder layers whose outputs are tapped (HF
  /// hidden_states[id + 1]); empty means DFLASH.md's default for 5 taps.
  /// As in HF (and so in the dflash package and the serving engines that
  /// follow it), the last layer's hidden state, hidden_states[L], is taken
  /// after the final norm; every other tap is the raw residual stream.
  qwen3_target(qwen3_config cfg, qwen3_weights weights, std::vector<int64_t> tap_ids = {});

  /// Loads config.json + safetensors (single file or sharded) from `dir`
  /// onto `device` in `dtype`.  Layers past the deepest tap are not loaded
  /// unless `with_head` (then the final norm and lm-head are kept too).
  static qwen3_target load(const std::filesystem::path& dir, at::Device device,
                           at::ScalarType dtype, std::vector<int64_t> tap_ids = {},
                           bool with_head = false);

  /// input_ids [B, S] int64; `docs` says where packed documents start and
  /// end (each attends only within itself, positions restart at 0).  With
  /// `want_logits` all layers run, else it stops after the deepest tap.
  qwen3_output forward(const at::Tensor& input_ids, const doc_layout& docs,
                       bool want_logits = false) const;

  /// Same, one document per row.
  qwen3_output forward(const at::Tensor& input_ids, bool want_logits = false) const;
  /// The target actor's forward: input_ids [B, S] int64 and each row's
  /// document lengths [B, K] (zeros allowed; what a row's lengths leave of S
  /// is one more document), taps only (stops after the deepest tap).  On a
  /// CUDA device in bf16/fp16 it runs the packed path (gpu/models/
  /// qwen3_packed.cpp): tokens flattened to [B·S, D], fused q/k/v and
  /// gate/up GEMMs, the residual adds in the GEMMs' epilogues, one kernel
  /// for q/k norm + RoPE and one for SwiGLU, and a causal attention over
  /// the documents without expanding the kv heads (packed_attention says
  /// which).  No host sync and fixed shapes per (B, S, K):
  /// capturable as a CUDA graph (target_engine does).  Elsewhere it is
  /// forward(input_ids, make_doc_layout(doc_lengths, S)).
  qwen3_output forward_packed(const at::Tensor& input_ids, const at::Tensor& doc_lengths) const;
  /// "packed", or why forward_packed runs the mask path instead.
  std::string packed_path() const;
  /// The packed path's attention: "dflash chunked" (Tandem's kernel,
  /// gpu/models/dflash_attention.hpp causal_chunked_attention), or "flash2
  /// varlen (<why not>)" (FlashAttention-2's variable-length kernel;
  /// TANDEM_TARGET_ATTENTION=flash2 asks for it, read when the target is
  /// made; `auto`, the default, takes the chunked kernel where it can).
  std::string packed_attention() const;
  /// Asks for FlashAttention-2 in the packed forward (or not) from now on,
  /// whatever TANDEM_TARGET_ATTENTION said: `tandem bench target_forward`'s
  /// A/B lines.  Graphs captured before keep the attention they captured.
  void prefer_flash2(bool on) { prefer_flash2_ = on; }
  /// "" when the fused-layout kernels (gpu/kernels/target_fused.cu: q/k
  /// norm + RoPE in place, SwiGLU over gate/up rows) take this target —
  /// fused projections (a CUDA bf16/fp16 target), a head_dim and an
  /// intermediate size they take, 16-byte-aligned q/k norm weights — else
  /// why not.  The packed forward and the decoder both ask.
  std::string fused_layout_unsupported() const;

  const qwen3_config& config() const { return cfg_; }
  const std::vector<int64_t>& tap_ids() const { return tap_ids_; }
  const at::Tensor& embedding() const { return w_.embed; }  ///< [V, D]
  const at::Tensor& lm_head() const { return w_.lm_head; }  ///< [V, D]
  const qwen3_weights& weights() const { return w_; }        ///< for the decoder (gpu/decode/)
  /// Layer `layer`'s output `x` as a tap: x, or for the last layer
  /// final_norm(x) (HF hidden_states[L]).
  at::Tensor tap_of(const at::Tensor& x, int64_t layer) const;

private:
  qwen3_output run(const at::Tensor& input_ids, const at::Tensor& positions,
                   const at::Tensor& visible, bool want_logits) const;

  qwen3_config cfg_;
  qwen3_weights w_;
  std::vector<int64_t> tap_ids_;
  bool prefer_flash2_ = false;  ///< TANDEM_TARGET_ATTENTION=flash2, or prefer_flash2()
};

/// Causal attention of a decoder layer over packed rows.  `visible` is a
/// [B, 1, S, S] boolean mask, or undefined for plain causal rows.
at::Tensor qwen3_attention(const at::Tensor& x, const decoder_layer_weights& w,
                           const layer_dims& d, const at::Tensor& cos, const at::Tensor& sin,
                           const at::Tensor& visible);

} // namespace tandem::gpu
