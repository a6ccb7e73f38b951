#include "gpu/models/dflash.hpp"

#include <cstdlib>
#include <fstream>
#include <tuple>
#include <vector>

#include "gpu/device/env.hpp"
#include "gpu/device/error.hpp"
#include "gpu/models/block_rows.hpp"
#include "gpu/models/dflash_attention.hpp"
#include "gpu/models/fused_ops.hpp"
#include "gpu/models/linear.hpp"
#include "gpu/io/safetensors.hpp"

namespace tandem::gpu {

namespace {

layer_dims dims_of(const dflash_config& c) {
  const auto& l = c.layer;
  return {l.hidden_size, l.intermediate_size, l.num_attention_heads, l.num_key_value_heads,
          l.head_dim, l.rms_norm_eps};
}

std::string layer_prefix(size_t i) {
  return "layers." + std::to_string(i) + ".";
}

/// The first layer's q, k and v for block rows that are each block's anchor
/// and Bs − 1 copies of the mask token's embedding: the input norm and the
/// projections run on the B·N + 1 distinct rows, and each result is spread
/// back to [B, Q, ·] (spread_block_rows; the copies' gradients are summed by
/// its backward before the weight-gradient GEMMs, which then see B·N + 1 rows).
std::vector<at::Tensor> distinct_rows_qkv(const dflash_inputs& in, const decoder_layer_weights& l,
                                          const layer_dims& d) {
  const auto b = in.block_embeds.size(0), q = in.block_embeds.size(1), dim = in.block_embeds.size(2);
  const auto n = in.anchor_embeds.size(1);
  TORCH_CHECK(in.anchor_embeds.dim() == 3 && in.anchor_embeds.size(0) == b && in.anchor_embeds.size(2) == dim
                && n > 0 && q % n == 0 && q / n >= 2 && in.mask_embed.numel() == dim,
              "dflash_forward: anchor_embeds ", in.anchor_embeds.sizes(), " and mask_embed ", in.mask_embed.sizes(),
              " do not describe block_embeds ", in.block_embeds.sizes());
  const auto bs = q / n;
  auto rows = at::cat({in.anchor_embeds.reshape({b * n, dim}), in.mask_embed.reshape({1, dim})});
  auto h = fused_rms_norm(rows, l.input_norm, d.eps);
  std::vector<at::Tensor> out;
  for (auto& p : fused_linears(h, {l.q_proj, l.k_proj, l.v_proj}))
    out.push_back(spread_block_rows(p, b, n, bs));
  return out;
}

/// TANDEM_FIRST_LAYER_ROWS (docs/environment.md), read once: `distinct`
/// (unset or empty) runs the first layer's q/k/v on the distinct rows,
/// `all` on every block row, the path it was measured against.
bool first_layer_on_distinct_rows() {
  static const bool distinct = env_choice("TANDEM_FIRST_LAYER_ROWS", {"distinct", "all"}) == "distinct";
  return distinct;
}

} // namespace

dflash_weights dflash_weights_from(const std::map<std::string, at::Tensor>& t,
                                   const dflash_config& c, at::ScalarType dtype,
                                   const std::string& file) {
  const auto d = c.layer.hidden_size;
  const auto taps = static_cast<int64_t>(c.target_layer_ids.size());
  dflash_weights w;
  w.fc = take_tensor(t, "fc.weight", {d, taps * d}, dtype, file);
  w.hidden_norm = take_tensor(t, "hidden_norm.weight", {d}, dtype, file);
  w.norm = take_tensor(t, "norm.weight", {d}, dtype, file);
  for (int64_t i = 0; i < c.layer.num_hidden_layers; ++i)
    w.layers.push_back(take_decoder_layer(t, layer_prefix(i), dims_of(c), dtype, file));
  return w;
}

std::map<std::string, at::Tensor> dflash_state_dict(const dflash_weights& w) {
  std::map<std::string, at::Tensor> out;
  out["fc.weight"] = w.fc;
  out["hidden_norm.weight"] = w.hidden_norm;
  out["norm.weight"] = w.norm;
  for (size_t i = 0; i < w.layers.size(); ++i)
    put_decoder_layer(out, layer_prefix(i), w.layers[i]);
  return out;
}

std::vector<std::pair<std::string, at::Tensor*>> dflash_parameters(dflash_weights& w) {
  std::vector<std::pair<std::string, at::Tensor*>> out{
    {"fc.weight", &w.fc}, {"hidden_norm.weight", &w.hidden_norm}, {"norm.weight", &w.norm}};
  static const char* names[] = {
    "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
    "self_attn.k_norm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
    "mlp.up_proj.weight",      "mlp.down_proj.weight"};
  for (size_t i = 0; i < w.layers.size(); ++i) {
    auto ptrs = layer_tensors(w.layers[i]);
    for (size_t k = 0; k < ptrs.size(); ++k)
      out.emplace_back(layer_prefix(i) + names[k], ptrs[k]);
  }
  return out;
}

std::pair<dflash_config, dflash_weights> load_dflash(const std::filesystem::path& dir,
                                                     at::Device device, at::ScalarType dtype) {
  auto cfg = load_dflash_config(dir);
  auto tensors = load_safetensors(dir);
  // Layers past num_hidden_layers mean config.json and the weights disagree:
  // loading the first layers only would be another drafter, silently.
  int64_t extra = 0;
  std::string first;
  for (const auto& [name, t] : tensors) {
    if (name.rfind("layers.", 0) != 0)
      continue;
    const auto index = std::strtoll(name.c_str() + 7, nullptr, 10);
    if (index >= cfg.layer.num_hidden_layers && extra++ == 0)
      first = name;
  }
  if (extra > 0)
    throw error(errc::bad_input, dir.string() + ": the weights hold " + std::to_string(extra) + " tensors of layers "
                                   "past config.json's num_hidden_layers = "
                                   + std::to_string(cfg.layer.num_hidden_layers) + " (" + first
                                   + ", ...): config.json does not describe these weights");
  auto w = dflash_weights_from(tensors, cfg, dtype, dir.string());
  for (auto& [name, p] : dflash_parameters(w))
    *p = p->to(device);
  return {std::move(cfg), std::move(w)};
}

void export_dflash(const std::filesystem::path& dir, const dflash_config& cfg,
                   const dflash_weights& w, at::ScalarType dtype) {
  std::filesystem::create_directories(dir);
  std::map<std::string, at::Tensor> out;
  for (auto& [name, t] : dflash_state_dict(w))
    out[name] = t.detach().to(at::kCPU, dtype).contiguous();
  save_safetensors(dir / "model.safetensors", out, {{"format", "pt"}});
  auto json = dflash_config_json(cfg, dtype == at::kBFloat16 ? "bfloat16"
                                      : dtype == at::kHalf   ? "float16"
                                                             : "float32");
  auto tmp = dir / "config.json.tmp";
  {
    std::ofstream f(tmp);
    f << json << "\n";
    if (!f)
      throw error(errc::bad_input, "cannot write " + tmp.string());
  }
  std::filesystem::rename(tmp, dir / "config.json");
}

at::Tensor scored_positions(const at::Tensor& t, int64_t block_size) {
  return drop_block_firsts(t, block_size);
}

at::Tensor dflash_forward(const dflash_weights& w, const dflash_config& cfg,
                          const dflash_inputs& in, int64_t scored_only) {
  const auto d = dims_of(cfg);
  const auto b = in.block_embeds.size(0), q_len = in.block_embeds.size(1);
  // H_t = RMSNorm(fc(concat(taps))): the same context for every layer.
  auto ctx = rms_norm(fused_linear(in.target_hidden, w.fc), w.hidden_norm, d.eps);  // [B, S, D]
  auto [cos_c, sin_c] = rope_tables(in.ctx_positions, d.head_dim, cfg.layer.rope_theta);
  auto [cos_q, sin_q] = rope_tables(in.block_positions, d.head_dim, cfg.layer.rope_theta);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.head_dim));
  TORCH_CHECK(scored_only == 0 || (scored_only >= 2 && q_len % scored_only == 0), "dflash_forward: block size ",
              scored_only, " does not divide the ", q_len, " block positions (or is below 2)");
  // CUDA: the residual adds go into the o and down GEMMs, each input's
  // gradient is summed in the GEMMs of its projections (fused_linears) or in
  // the norm's backward kernel (fused_rms_norm_passing), and every layer's
  // context keys and values are projected by one node.  The CPU keeps the
  // composites, bit for bit.
  const bool fuse = in.block_embeds.is_cuda();
  std::vector<at::Tensor> ctx_kv;  // fuse: layer i's k at 2i, v at 2i + 1
  if (fuse) {
    std::vector<at::Tensor> kv_w;
    for (const auto& l : w.layers) {
      kv_w.push_back(l.k_proj);
      kv_w.push_back(l.v_proj);
    }
    ctx_kv = fused_linears(ctx, kv_w);
  }
  auto x = in.block_embeds;
  for (size_t li = 0; li < w.layers.size(); ++li) {
    const auto& l = w.layers[li];
    at::Tensor h, x_res, q, k_ctx, k_blk, v_ctx, v_blk;
    if (fuse) {
      std::vector<at::Tensor> qkv;
      if (li == 0 && in.mask_embed.defined() && in.anchor_embeds.defined() && !x.requires_grad()
          && first_layer_on_distinct_rows()) {
        x_res = x;
        qkv = distinct_rows_qkv(in, l, d);
      } else {
        std::tie(h, x_res) = fused_rms_norm_passing(x, l.input_norm, d.eps);
        qkv = fused_linears(h, {l.q_proj, l.k_proj, l.v_proj});
      }
      q = q_heads(qkv[0], l, d, cos_q, sin_q);
      k_blk = k_heads(qkv[1], l, d, cos_q, sin_q);
      v_blk = v_heads(qkv[2], d);
      k_ctx = k_heads(ctx_kv[2 * li], l, d, cos_c, sin_c);
      v_ctx = v_heads(ctx_kv[2 * li + 1], d);
    } else {
      h = rms_norm(x, l.input_norm, d.eps);
      x_res = x;
      q = project_q(h, l, d, cos_q, sin_q);
      k_ctx = project_k(ctx, l, d, cos_c, sin_c);
      k_blk = project_k(h, l, d, cos_q, sin_q);
      v_ctx = project_v(ctx, l, d);
      v_blk = project_v(h, l, d);
    }
    at::Tensor attn;  // [B, H, Q, h]
    if (in.ctx_lo.defined()) {
      attn = dflash_attention(q, k_ctx, v_ctx, k_blk, v_blk, in.ctx_lo, in.ctx_hi, in.keep, scale);
    } else {
      auto k = expand_kv_heads(at::cat({k_ctx, k_blk}, 2), d.heads);
      auto v = expand_kv_heads(at::cat({v_ctx, v_blk}, 2), d.heads);
      attn = at::scaled_dot_product_attention(q, k, v, in.visible, 0.0, false, scale);
    }
    auto a = attn.transpose(1, 2).reshape({b, q_len, d.heads * d.head_dim});
    if (scored_only > 0 && li + 1 == w.layers.size()) {
      a = scored_positions(a, scored_only);  // position 0's o projection and MLP in the last layer feed nothing
      x_res = scored_positions(x_res, scored_only);
    }
    if (fuse) {
      x = fused_linear_residual(a, l.o_proj, x_res);
      auto [h2, x_res2] = fused_rms_norm_passing(x, l.post_norm, d.eps);
      x = swiglu_mlp(h2, l, x_res2);
    } else {
      x = x_res + fused_linear(a, l.o_proj);
      x = x + swiglu_mlp(rms_norm(x, l.post_norm, d.eps), l);
    }
  }
  return rms_norm(x, w.norm, d.eps);
}

} // namespace tandem::gpu
