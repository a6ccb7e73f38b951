#include "gpu/models/qwen3.hpp"

#include <algorithm>
#include <cstdlib>

#include "gpu/device/env.hpp"
#include "gpu/device/error.hpp"
#include "gpu/io/safetensors.hpp"

namespace tandem::gpu {

namespace {

layer_dims dims_of(const qwen3_config& c) {
  return {c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
          c.head_dim, c.rms_norm_eps};
}

} // namespace

qwen3_weights qwen3_weights_from(const std::map<std::string, at::Tensor>& t,
                                 const qwen3_config& c, at::ScalarType dtype,
                                 const std::string& file, int64_t keep_layers) {
  const auto n = keep_layers < 0 ? c.num_hidden_layers : std::min(keep_layers, c.num_hidden_layers);
  qwen3_weights w;
  w.embed = take_tensor(t, "model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, dtype, file);
  const auto d = dims_of(c);
  for (int64_t i = 0; i < n; ++i)
    w.layers.push_back(take_decoder_layer(t, "model.layers." + std::to_string(i) + ".", d, dtype, file));
  if (keep_layers < 0) {
    w.final_norm = take_tensor(t, "model.norm.weight", {c.hidden_size}, dtype, file);
    if (c.tie_word_embeddings)
      w.lm_head = w.embed;
    else
      w.lm_head = take_tensor(t, "lm_head.weight", {c.vocab_size, c.hidden_size}, dtype, file);
  } else if (c.tie_word_embeddings || t.count("lm_head.weight") == 0) {
    // The drafter needs the head even when the target stops early.
    w.lm_head = w.embed;
    if (!c.tie_word_embeddings)
      throw error(errc::bad_input, "missing tensor lm_head.weight in " + file
                                     + " (tie_word_embeddings is false)");
  } else {
    w.lm_head = take_tensor(t, "lm_head.weight", {c.vocab_size, c.hidden_size}, dtype, file);
  }
  // A tap of the last layer is taken after the final norm (HF hidden_states[L]).
  if (!w.final_norm.defined() && n == c.num_hidden_layers)
    w.final_norm = take_tensor(t, "model.norm.weight", {c.hidden_size}, dtype, file);
  return w;
}

qwen3_target::qwen3_target(qwen3_config cfg, qwen3_weights weights, std::vector<int64_t> tap_ids)
  : cfg_(std::move(cfg)), w_(std::move(weights)), tap_ids_(std::move(tap_ids)) {
  if (tap_ids_.empty())
    tap_ids_ = training_tap_ids(cfg_.num_hidden_layers);
  prefer_flash2_ = env_choice("TANDEM_TARGET_ATTENTION", {"auto", "flash2"}) == "flash2";
  for (auto id : tap_ids_)
    if (id < 0 || id >= static_cast<int64_t>(w_.layers.size()))
      throw error(errc::bad_input, "tap layer " + std::to_string(id) + " outside the target's "
                                     + std::to_string(w_.layers.size()) + " loaded layers");
  // On a GPU the packed forward reads one [q; k; v] and one [gate; up]
  // matrix a layer; the separate projections become row views of them
  // (common.hpp), so every other path reads the same memory.  One layer at
  // a time: the allocated peak grows by one layer's projections.
  bool fused_any = false;
  for (auto& l : w_.layers) {
    // Already fused (the views still alias their fused tensors): kept.  A
    // copy whose views were moved or cast on their own drops its stale
    // fused tensors and is fused again.
    if (l.qkv_proj.defined() && l.q_proj.is_alias_of(l.qkv_proj) && l.gate_proj.is_alias_of(l.gate_up_proj))
      continue;
    l.qkv_proj = at::Tensor();
    l.gate_up_proj = at::Tensor();
    if (!l.q_proj.is_cuda() || (l.q_proj.scalar_type() != at::kBFloat16 && l.q_proj.scalar_type() != at::kHalf))
      continue;
    fused_any = true;
    const auto nq = l.q_proj.size(0), nk = l.k_proj.size(0), ni = l.gate_proj.size(0);
    l.qkv_proj = at::cat({l.q_proj, l.k_proj, l.v_proj}, 0);
    l.q_proj = l.qkv_proj.narrow(0, 0, nq);
    l.k_proj = l.qkv_proj.narrow(0, nq, nk);
    l.v_proj = l.qkv_proj.narrow(0, nq + nk, nk);
    l.gate_up_proj = at::cat({l.gate_proj, l.up_proj}, 0);
    l.gate_proj = l.gate_up_proj.narrow(0, 0, ni);
    l.up_proj = l.gate_up_proj.narrow(0, ni, ni);
  }
#ifdef TANDEM_HAVE_CUDA
  // The separate blocks freed above cannot serve the fused sizes: hand them
  // back rather than keep ~0.2 GB a layer reserved (8B) until an OOM retry.
  if (fused_any)
    c10::cuda::CUDACachingAllocator::emptyCache();
#else
  (void)fused_any;
#endif
}

qwen3_target qwen3_target::load(const std::filesystem::path& dir, at::Device device,
                                at::ScalarType dtype, std::vector<int64_t> tap_ids,
                                bool with_head) {
  auto cfg = load_qwen3_config(dir);
  if (tap_ids.empty())
    tap_ids = training_tap_ids(cfg.num_hidden_layers);
  const auto deepest = *std::max_element(tap_ids.begin(), tap_ids.end());
  auto tensors = load_safetensors(dir);
  // Messages name the weights' file (the index of a sharded checkpoint).
  std::error_code ec;
  auto weights = dir;
  if (std::filesystem::is_directory(dir, ec)) {
    for (const char* name : {"model.safetensors", "model.safetensors.index.json"})
      if (std::filesystem::exists(dir / name, ec)) {
        weights = dir / name;
        break;
      }
  }
  // A checkpoint deeper than its config (a config.json from a smaller
  // sibling model): the weights do not match the config.  (Here, not in
  // qwen3_weights_from: the drafter reads the target's embedding and head
  // through it with its own, shallower config.)
  const std::string layers_prefix = "model.layers.";
  for (auto it = tensors.lower_bound(layers_prefix);
       it != tensors.end() && it->first.compare(0, layers_prefix.size(), layers_prefix) == 0; ++it) {
    const auto rest = it->first.substr(layers_prefix.size());
    const auto dot = rest.find('.');
    const auto digits = rest.substr(0, dot);
    if (digits.empty() || digits.size() > 9
        || !std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      continue;
    if (std::stoll(digits) >= cfg.num_hidden_layers)
      throw error(errc::bad_input, "tensor " + it->first + " in " + weights.string() + " is a layer past "
                                     + "config.json's num_hidden_layers = "
                                     + std::to_string(cfg.num_hidden_layers)
                                     + " (the weights do not match the config)");
  }
  auto w = qwen3_weights_from(tensors, cfg, dtype, weights.string(), with_head ? -1 : deepest + 1);
  auto move = [&](at::Tensor& x) {
    if (x.defined())
      x = x.to(device);
  };
  move(w.embed);
  move(w.final_norm);
  const bool tied = w.lm_head.is_same(w.embed) || cfg.tie_word_embeddings;
  if (tied)
    w.lm_head = w.embed;
  else
    move(w.lm_head);
  for (auto& l : w.layers)
    for (auto* p : layer_tensors(l))
      move(*p);
  return qwen3_target(std::move(cfg), std::move(w), std::move(tap_ids));
}

at::Tensor qwen3_attention(const at::Tensor& x, const decoder_layer_weights& w,
                           const layer_dims& d, const at::Tensor& cos, const at::Tensor& sin,
                           const at::Tensor& visible) {
  const auto b = x.size(0), s = x.size(1);
  auto q = project_q(x, w, d, cos, sin);
  auto k = expand_kv_heads(project_k(x, w, d, cos, sin), d.heads);
  auto v = expand_kv_heads(project_v(x, w, d), d.heads);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.head_dim));
  auto out = visible.defined()
               ? at::scaled_dot_product_attention(q, k, v, visible, 0.0, false, scale)
               : at::scaled_dot_product_attention(q, k, v, {}, 0.0, true, scale);
  return at::linear(out.transpose(1, 2).reshape({b, s, d.heads * d.head_dim}), w.o_proj);
}

at::Tensor qwen3_target::tap_of(const at::Tensor& x, int64_t layer) const {
  if (layer != cfg_.num_hidden_layers - 1)
    return x;
  if (!w_.final_norm.defined())
    throw error(errc::bad_input, "a tap of the last layer needs the target's final norm (model.norm.weight)");
  return rms_norm(x, w_.final_norm, cfg_.rms_norm_eps);
}

qwen3_output qwen3_target::run(const at::Tensor& input_ids, const at::Tensor& positions,
                               const at::Tensor& visible, bool want_logits) const {
  at::NoGradGuard no_grad;
  if (want_logits && (!w_.final_norm.defined()
                      || static_cast<int64_t>(w_.layers.size()) < cfg_.num_hidden_layers))
    throw error(errc::bad_input, "logits asked of a target loaded without its head (with_head=false)");
  auto x = at::embedding(w_.embed, input_ids);
  auto [cos, sin] = rope_tables(positions, cfg_.head_dim, cfg_.rope_theta);
  const auto deepest = *std::max_element(tap_ids_.begin(), tap_ids_.end());
  const auto last = want_logits ? static_cast<int64_t>(w_.layers.size()) - 1 : deepest;
  const auto d = dims_of(cfg_);
  std::vector<at::Tensor> taps(tap_ids_.size());
  for (int64_t i = 0; i <= last; ++i) {
    const auto& l = w_.layers[i];
    x = x + qwen3_attention(rms_norm(x, l.input_norm, d.eps), l, d, cos, sin, visible);
    x = x + swiglu_mlp(rms_norm(x, l.post_norm, d.eps), l);
    for (size_t t = 0; t < tap_ids_.size(); ++t)
      if (tap_ids_[t] == i)
        taps[t] = tap_of(x, i);
  }
  qwen3_output out;
  out.taps = at::cat(taps, -1);
  if (want_logits)
    out.logits = at::linear(rms_norm(x, w_.final_norm, d.eps), w_.lm_head).to(at::kFloat);
  return out;
}

qwen3_output qwen3_target::forward(const at::Tensor& input_ids, const doc_layout& docs,
                                   bool want_logits) const {
  // Causal within each document: key j visible to query i iff j <= i and
  // both tokens are in the same document.
  const auto s = input_ids.size(1);
  auto idx = at::arange(s, input_ids.options().dtype(at::kLong));
  auto causal = idx.unsqueeze(1) >= idx.unsqueeze(0);                         // [S, S]
  auto same_doc = docs.segment.unsqueeze(2) == docs.segment.unsqueeze(1);     // [B, S, S]
  auto visible = (causal.unsqueeze(0) & same_doc).unsqueeze(1);               // [B, 1, S, S]
  return run(input_ids, docs.position, visible, want_logits);
}

qwen3_output qwen3_target::forward(const at::Tensor& input_ids, bool want_logits) const {
  // One document per row: plain causal attention (SDPA's fused causal path).
  auto positions = at::arange(input_ids.size(1), input_ids.options().dtype(at::kLong))
                     .unsqueeze(0).expand({input_ids.size(0), input_ids.size(1)});
  return run(input_ids, positions, at::Tensor(), want_logits);
}

} // namespace tandem::gpu
