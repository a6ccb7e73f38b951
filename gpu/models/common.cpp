#include "gpu/models/common.hpp"

#include "gpu/device/error.hpp"
#include "gpu/models/fused_ops.hpp"
#include "gpu/models/linear.hpp"
#include "gpu/device/shape_text.hpp"

namespace tandem::gpu {

at::Tensor take_tensor(const std::map<std::string, at::Tensor>& tensors, const std::string& name,
                       at::IntArrayRef shape, at::ScalarType dtype, const std::string& file) {
  auto it = tensors.find(name);
  if (it == tensors.end())
    throw error(errc::bad_input, "missing tensor " + name + " in " + file);
  const auto& t = it->second;
  if (t.sizes() != shape)
    throw error(errc::bad_input, "tensor " + name + " in " + file + " has shape "
                                   + shape_text(t.sizes()) + ", expected " + shape_text(shape)
                                   + " from config.json (the weights do not match the config)");
  if (!at::isFloatingType(t.scalar_type()))
    throw error(errc::bad_input, "tensor " + name + " in " + file + " has dtype "
                                   + std::string(c10::toString(t.scalar_type()))
                                   + ", expected a floating-point dtype");
  return t.to(dtype).contiguous();
}

decoder_layer_weights take_decoder_layer(const std::map<std::string, at::Tensor>& tensors,
                                         const std::string& prefix, const layer_dims& d,
                                         at::ScalarType dtype, const std::string& file) {
  auto take = [&](const std::string& name, at::IntArrayRef shape) {
    return take_tensor(tensors, prefix + name, shape, dtype, file);
  };
  const int64_t q = d.heads * d.head_dim, kv = d.kv_heads * d.head_dim;
  decoder_layer_weights w;
  w.input_norm = take("input_layernorm.weight", {d.hidden});
  w.q_proj = take("self_attn.q_proj.weight", {q, d.hidden});
  w.k_proj = take("self_attn.k_proj.weight", {kv, d.hidden});
  w.v_proj = take("self_attn.v_proj.weight", {kv, d.hidden});
  w.o_proj = take("self_attn.o_proj.weight", {d.hidden, q});
  w.q_norm = take("self_attn.q_norm.weight", {d.head_dim});
  w.k_norm = take("self_attn.k_norm.weight", {d.head_dim});
  w.post_norm = take("post_attention_layernorm.weight", {d.hidden});
  w.gate_proj = take("mlp.gate_proj.weight", {d.intermediate, d.hidden});
  w.up_proj = take("mlp.up_proj.weight", {d.intermediate, d.hidden});
  w.down_proj = take("mlp.down_proj.weight", {d.hidden, d.intermediate});
  return w;
}

decoder_layer_weights random_decoder_layer(const layer_dims& d, at::ScalarType dtype,
                                           at::Device device, at::Generator gen, double std) {
  auto opts = at::TensorOptions().dtype(dtype).device(device);
  auto normal = [&](at::IntArrayRef shape) { return at::empty(shape, opts).normal_(0.0, std, gen); };
  const int64_t q = d.heads * d.head_dim, kv = d.kv_heads * d.head_dim;
  decoder_layer_weights w;
  w.input_norm = at::ones({d.hidden}, opts);
  w.q_proj = normal({q, d.hidden});
  w.k_proj = normal({kv, d.hidden});
  w.v_proj = normal({kv, d.hidden});
  w.o_proj = normal({d.hidden, q});
  w.q_norm = at::ones({d.head_dim}, opts);
  w.k_norm = at::ones({d.head_dim}, opts);
  w.post_norm = at::ones({d.hidden}, opts);
  w.gate_proj = normal({d.intermediate, d.hidden});
  w.up_proj = normal({d.intermediate, d.hidden});
  w.down_proj = normal({d.hidden, d.intermediate});
  return w;
}

void put_decoder_layer(std::map<std::string, at::Tensor>& out, const std::string& prefix,
                       const decoder_layer_weights& w) {
  out[prefix + "input_layernorm.weight"] = w.input_norm;
  out[prefix + "self_attn.q_proj.weight"] = w.q_proj;
  out[prefix + "self_attn.k_proj.weight"] = w.k_proj;
  out[prefix + "self_attn.v_proj.weight"] = w.v_proj;
  out[prefix + "self_attn.o_proj.weight"] = w.o_proj;
  out[prefix + "self_attn.q_norm.weight"] = w.q_norm;
  out[prefix + "self_attn.k_norm.weight"] = w.k_norm;
  out[prefix + "post_attention_layernorm.weight"] = w.post_norm;
  out[prefix + "mlp.gate_proj.weight"] = w.gate_proj;
  out[prefix + "mlp.up_proj.weight"] = w.up_proj;
  out[prefix + "mlp.down_proj.weight"] = w.down_proj;
}

std::vector<at::Tensor*> layer_tensors(decoder_layer_weights& w) {
  return {&w.input_norm, &w.q_proj,    &w.k_proj,  &w.v_proj,    &w.o_proj,   &w.q_norm,
          &w.k_norm,     &w.post_norm, &w.gate_proj, &w.up_proj, &w.down_proj};
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // CUDA: one fused kernel (gpu/kernels/norm_rope.cu); the CPU keeps the
  // composite, bit for bit (parity with Hugging Face, bit-exact resume).
  return x.is_cuda() ? fused_rms_norm(x, weight, eps) : rms_norm_composite(x, weight, eps);
}

std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& positions, int64_t head_dim,
                                              double theta) {
  auto opts = at::TensorOptions().dtype(at::kFloat).device(positions.device());
  // inv_freq_i = theta^(-2i/h), computed in float64 then rounded as HF does
  // (HF computes it in float32 from an int64 arange; both round the same).
  auto exponent = at::arange(0, head_dim, 2, opts.dtype(at::kLong)).to(at::kFloat) / head_dim;
  auto inv_freq = 1.0 / at::pow(theta, exponent);                 // [h/2]
  auto freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq;  // [P..., h/2]
  auto emb = at::cat({freqs, freqs}, -1);                          // [P..., h]
  return {emb.cos(), emb.sin()};
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return x.is_cuda() ? fused_apply_rope(x, cos, sin) : apply_rope_composite(x, cos, sin);
}

at::Tensor expand_kv_heads(const at::Tensor& kv, int64_t heads) {
  const auto groups = heads / kv.size(1);
  return groups == 1 ? kv : kv.repeat_interleave(groups, 1);
}

namespace {

/// RoPE(norm(raw)) for raw [B, T, heads·h]: fused_rms_norm_rope, which is the
/// two calls (rms_norm, apply_rope) except when training on CUDA, where it is
/// one kernel each way.
at::Tensor normed_heads(const at::Tensor& raw, const at::Tensor& norm, int64_t heads, const layer_dims& d,
                        const at::Tensor& cos, const at::Tensor& sin) {
  return fused_rms_norm_rope(raw.view({raw.size(0), raw.size(1), heads, d.head_dim}), norm, d.eps, cos, sin);
}

} // namespace

at::Tensor q_heads(const at::Tensor& raw, const decoder_layer_weights& w, const layer_dims& d,
                   const at::Tensor& cos, const at::Tensor& sin) {
  return normed_heads(raw, w.q_norm, d.heads, d, cos, sin);
}

at::Tensor k_heads(const at::Tensor& raw, const decoder_layer_weights& w, const layer_dims& d,
                   const at::Tensor& cos, const at::Tensor& sin) {
  return normed_heads(raw, w.k_norm, d.kv_heads, d, cos, sin);
}

at::Tensor v_heads(const at::Tensor& raw, const layer_dims& d) {
  const auto b = raw.size(0), t = raw.size(1);
  return raw.view({b, t, d.kv_heads, d.head_dim}).transpose(1, 2);
}

at::Tensor project_q(const at::Tensor& x, const decoder_layer_weights& w, const layer_dims& d,
                     const at::Tensor& cos, const at::Tensor& sin) {
  return q_heads(fused_linear(x, w.q_proj), w, d, cos, sin);
}

at::Tensor project_k(const at::Tensor& x, const decoder_layer_weights& w, const layer_dims& d,
                     const at::Tensor& cos, const at::Tensor& sin) {
  return k_heads(fused_linear(x, w.k_proj), w, d, cos, sin);
}

at::Tensor project_v(const at::Tensor& x, const decoder_layer_weights& w, const layer_dims& d) {
  return v_heads(fused_linear(x, w.v_proj), d);
}

at::Tensor swiglu_mlp(const at::Tensor& x, const decoder_layer_weights& w, const at::Tensor& residual) {
  // fused_linears: at::linear each, except inside a weight_grad_accumulation
  // scope (the drafter's training step), where the weight gradients go
  // straight into W.grad() and x's gradient is summed in the GEMMs
  // (gpu/models/linear.hpp).
  auto gu = fused_linears(x, {w.gate_proj, w.up_proj});
  const auto& gate = gu[0];
  const auto& up = gu[1];
  // CUDA bf16/fp16: one fused kernel each way (gpu/kernels/swiglu.cu); the
  // CPU keeps the composite, bit for bit (parity, bit-exact resume), and so
  // does fp32 on CUDA (fused_swiglu falls back to it).
  auto act = x.is_cuda() ? fused_swiglu(gate, up) : swiglu_composite(gate, up);
  return residual.defined() ? fused_linear_residual(act, w.down_proj, residual) : fused_linear(act, w.down_proj);
}

doc_layout make_doc_layout(const at::Tensor& doc_lengths, int64_t seq_len) {
  TORCH_CHECK(doc_lengths.dim() == 2, "doc_lengths must be [B, K]");
  auto lengths = doc_lengths.to(at::kLong).clamp_min(0);
  const auto batch = lengths.size(0);
  auto used = lengths.sum(1, /*keepdim=*/true);                        // [B, 1]
  auto tail = at::clamp_min(seq_len - used, 0);                        // padding document
  auto all = at::cat({lengths, tail}, 1);                              // [B, K+1]
  auto ends = all.cumsum(1);                                           // [B, K+1]
  auto starts = ends - all;
  auto idx = at::arange(seq_len, lengths.options()).unsqueeze(0).expand({batch, seq_len});
  // Document of token t: the number of documents that end at or before t.
  auto segment = at::searchsorted(ends.contiguous(), idx.contiguous(), /*out_int32=*/false,
                                  /*right=*/true);
  segment = at::clamp_max(segment, all.size(1) - 1);
  doc_layout out;
  out.segment = segment;
  out.start = starts.gather(1, segment);
  out.end = ends.gather(1, segment);
  out.position = idx - out.start;
  return out;
}

doc_layout whole_row_layout(int64_t batch, int64_t seq_len, const at::Device& device) {
  auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  doc_layout out;
  out.position = at::arange(seq_len, opts).unsqueeze(0).expand({batch, seq_len}).contiguous();
  out.start = at::zeros({batch, seq_len}, opts);
  out.end = at::full({batch, seq_len}, seq_len, opts);
  out.segment = at::zeros({batch, seq_len}, opts);
  return out;
}

} // namespace tandem::gpu
