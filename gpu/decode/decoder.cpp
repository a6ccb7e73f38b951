#include "gpu/decode/decoder.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "gpu/device/env.hpp"
#include "gpu/device/error.hpp"
#include "gpu/engine/graph.hpp"
#include "gpu/models/fused_ops.hpp"
#ifdef TANDEM_HAVE_CUDA
#include "gpu/kernels/decode_attention.hpp"
#include "gpu/kernels/target_fused.hpp"
#endif

namespace tandem::gpu {

namespace {

kv_cache make_cache(int64_t layers, int64_t batch, int64_t kv_heads, int64_t capacity,
                    int64_t head_dim, const at::TensorOptions& opts) {
  kv_cache c;
  for (int64_t i = 0; i < layers; ++i) {
    c.k.push_back(at::zeros({batch, kv_heads, capacity, head_dim}, opts));
    c.v.push_back(at::zeros({batch, kv_heads, capacity, head_dim}, opts));
  }
  c.length.assign(batch, 0);
  return c;
}

/// [B] int64 on `device`: the rows' lengths.
at::Tensor lengths_tensor(const std::vector<int64_t>& length, const at::Device& device) {
  return at::tensor(length, at::TensorOptions().dtype(at::kLong)).to(device);
}

/// Positions start[b] + t, [B, T].
at::Tensor positions_after(const at::Tensor& start, int64_t t) {
  return start.unsqueeze(1) + at::arange(t, start.options()).unsqueeze(0);
}

/// Writes x [B, K, T, h] into cache [B, K, C, h] at positions pos [B, T].
void write_cache(at::Tensor& cache, const at::Tensor& x, const at::Tensor& pos) {
  auto index = pos.view({pos.size(0), 1, pos.size(1), 1}).expand_as(x);
  cache.scatter_(2, index, x);
}

/// Attention of q [B, H, T, h] over keys/values [B, K, S, h] where
/// visible [B, 1, T, S] (bool); returns [B, T, H·h].
at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& visible, int64_t head_dim) {
  const auto heads = q.size(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  auto out = at::scaled_dot_product_attention(q, expand_kv_heads(k, heads), expand_kv_heads(v, heads),
                                              visible, 0.0, false, scale);
  return out.transpose(1, 2).reshape({q.size(0), q.size(2), heads * head_dim});
}

int64_t max_of(const std::vector<int64_t>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

void check_row(const kv_cache& c, int64_t row, int64_t n, int64_t capacity, const char* who) {
  if (row < 0 || row >= static_cast<int64_t>(c.length.size()) || n < 0 || n > capacity)
    throw error(errc::bad_input, std::string(who) + ": row " + std::to_string(row) + " length "
                                   + std::to_string(n) + " outside the cache ("
                                   + std::to_string(c.length.size()) + " rows of "
                                   + std::to_string(capacity) + " positions)");
}

} // namespace

// ---------------------------------------------------------------------------------------
// Target

#ifdef TANDEM_HAVE_CUDA
/// One captured forward: its static inputs and outputs (the graph's pool).
struct target_decoder::graph {
  explicit graph(const at::Device& d) : step(d) {}
  captured_step step;
  at::Tensor ids, logit_at;  ///< [B, T], [B] (undefined without logit_at)
  output out;
};
#else
struct target_decoder::graph {};
#endif

target_decoder::~target_decoder() = default;

target_decoder::target_decoder(const qwen3_target& target, int64_t batch, int64_t capacity,
                               const std::string& mode_in)
  : target_(target), capacity_(capacity) {
  const auto& c = target.config();
  const auto& w = target.weights();
  if (static_cast<int64_t>(w.layers.size()) != c.num_hidden_layers || !w.final_norm.defined())
    throw error(errc::bad_input, "target decoder: the target was loaded without its head "
                                 "(every layer, the final norm and the lm-head are needed)");
  cache_ = make_cache(c.num_hidden_layers, batch, c.num_key_value_heads, capacity, c.head_dim,
                      w.embed.options());
#ifdef TANDEM_HAVE_CUDA
  const auto device = w.embed.device();
  if (device.is_cuda()) {
    lengths_dev_ = at::zeros({batch}, at::TensorOptions().dtype(at::kLong).device(device));
    const auto sms = at::cuda::getDeviceProperties(device.index())->multiProcessorCount;
    splits_ = kernels::decode_attention_splits(static_cast<int>(batch), static_cast<int>(c.num_key_value_heads),
                                               static_cast<int>(capacity), sms);
    kernels::decode_attention_args a;
    a.batch = static_cast<int>(batch);
    a.heads = static_cast<int>(c.num_attention_heads);
    a.kv_heads = static_cast<int>(c.num_key_value_heads);
    a.queries = 16;
    a.head_dim = static_cast<int>(c.head_dim);
    a.capacity = static_cast<int>(capacity);
    a.splits = splits_;
    workspace_ = at::empty({static_cast<int64_t>(kernels::decode_attention_workspace(a) / sizeof(float))},
                           at::TensorOptions().dtype(at::kFloat).device(device));
    // TANDEM_DECODE: "graphs" (the default), "eager" (the kernel, no
    // graphs) or "sdpa" (neither: SDPA over the longest row), to compare.
    const auto mode = mode_choice(mode_in, "TANDEM_DECODE", {"graphs", "eager", "sdpa"});
    mode_ = mode;
    graphs_ = mode == "graphs";
    kernel_ = mode != "sdpa";
    fused_layout_ = target.fused_layout_unsupported().empty();
    // TANDEM_DECODE_GEMV=0: the fused layout's projections on cuBLAS even at
    // one to four rows (the decode GEMV kernel's A/B; docs/bench.md).
    gemv_ = env_choice("TANDEM_DECODE_GEMV", {"1", "0"}) == "1";
    // TANDEM_PDL=0: the GEMV launched plainly.  The kernel layer reads it at
    // the launch (gpu/kernels/pdl.cuh) and cannot refuse a bad value: here.
    pdl_ = env_choice("TANDEM_PDL", {"1", "0"}) == "1";
  }
#endif
}

void target_decoder::set_length(int64_t row, int64_t n) {
  check_row(cache_, row, n, capacity_, "target decoder");
  cache_.length[row] = n;
}

void target_decoder::reset() {
  std::fill(cache_.length.begin(), cache_.length.end(), 0);
}

bool target_decoder::kernel_fits(int64_t t) const {
  const auto& c = target_.config();
  return kernel_ && lengths_dev_.defined() && t >= 1 && t <= 16 && c.head_dim <= 128 && c.head_dim % 4 == 0
         && (c.num_attention_heads / c.num_key_value_heads) * t <= 64;
}

target_decoder::output target_decoder::forward(const at::Tensor& ids, bool want_taps,
                                               const at::Tensor& logit_at) {
  at::NoGradGuard no_grad;
  const auto b = ids.size(0), t = ids.size(1);
  if (b != batch())
    throw error(errc::bad_input, "target decoder: " + std::to_string(b) + " rows for a cache of "
                                   + std::to_string(batch()));
  const auto hi = max_of(cache_.length) + t;  // keys any query can see
  if (hi > capacity_)
    throw error(errc::bad_input, "target decoder: " + std::to_string(hi)
                                   + " positions exceed the cache's " + std::to_string(capacity_));
  const bool kernel = kernel_fits(t);
#ifdef TANDEM_HAVE_CUDA
  if (kernel) {
    // The rows' lengths, where the kernel (and a replayed graph) reads them.
    auto host = at::tensor(cache_.length, at::TensorOptions().dtype(at::kLong)).pin_memory();
    lengths_dev_.copy_(host, /*non_blocking=*/true);
  }
  if (kernel && graphs_) {
    const auto device = ids.device();
    auto& g = graphs_by_shape_[{t, want_taps, logit_at.defined()}];
    auto current = at::cuda::getCurrentCUDAStream(device.index());
    if (!g) {
      auto fresh = std::make_unique<graph>(device);
      fresh->ids = at::empty_like(ids);
      if (logit_at.defined())
        fresh->logit_at = at::empty_like(logit_at);
      g = std::move(fresh);
    }
    // The graph's stream takes over after what the caller queued (the
    // inputs, the lengths), and the caller's stream after the replay.
    at::cuda::CUDAEvent before, after;
    before.record(current);
    before.block(g->step.stream());
    {
      c10::cuda::CUDAStreamGuard on(g->step.stream());
      g->ids.copy_(ids, true);
      if (logit_at.defined())
        g->logit_at.copy_(logit_at, true);
      if (!g->step.captured()) {
        // Warm-up (cuBLAS workspaces, the allocator's blocks), then capture;
        // the warm-up writes the same keys/values the replay writes again.
        run(g->ids, want_taps, g->logit_at, true);
        g->step.capture([&] { g->out = run(g->ids, want_taps, g->logit_at, true); }, {});
      }
      g->step.replay();
      ++replays_;
      after.record(g->step.stream());
    }
    after.block(current);
    // Copies: the graph's outputs are overwritten by its next replay.
    output out;
    out.logits = g->out.logits.clone();
    if (want_taps)
      out.taps = g->out.taps.clone();
    return out;
  }
#endif
  return run(ids, want_taps, logit_at, kernel);
}

target_decoder::output target_decoder::run(const at::Tensor& ids, bool want_taps,
                                           const at::Tensor& logit_at, bool kernel) {
  const auto& c = target_.config();
  const auto& w = target_.weights();
  const auto& taps_at = target_.tap_ids();
  const auto b = ids.size(0), t = ids.size(1);
  const auto device = w.embed.device();
  at::Tensor pos, visible;
  int64_t hi = 0;
  if (kernel) {
    pos = positions_after(lengths_dev_, t);  // every length from device memory: graph-safe
  } else {
    hi = max_of(cache_.length) + t;
    auto start = lengths_tensor(cache_.length, device);
    pos = positions_after(start, t);                                              // [B, T]
    auto keys = at::arange(hi, start.options());
    visible = (keys.view({1, 1, hi}) <= pos.unsqueeze(2)).unsqueeze(1);          // [B, 1, T, hi]
  }
  auto [cos, sin] = rope_tables(pos, c.head_dim, c.rope_theta);
  const layer_dims d{c.hidden_size, c.intermediate_size, c.num_attention_heads,
                     c.num_key_value_heads, c.head_dim, c.rms_norm_eps};
  auto x = at::embedding(w.embed, ids);
  std::vector<at::Tensor> taps(taps_at.size());
  // The fused path: the kernel modes on a target the fused-layout kernels
  // take (qwen3_target::fused_layout_unsupported, asked once at construction).
  bool fused = false;
  at::Tensor cos_flat, sin_flat;
#ifdef TANDEM_HAVE_CUDA
  fused = kernel && fused_layout_;
  if (fused) {
    cos_flat = cos.reshape({b * t, c.head_dim}).contiguous();
    sin_flat = sin.reshape({b * t, c.head_dim}).contiguous();
  }
#endif
  // A projection of the fused path: x̂ · wᵀ (+ residual), x̂ = norm(in) when
  // `norm` is defined, swiglu_rows(in) with `swiglu`, else in; the decode
  // GEMV kernel (those fused in) at one to four rows, else cuBLAS.
  auto project = [&](const at::Tensor& in, const at::Tensor& weight, const at::Tensor& residual,
                     const at::Tensor& norm, bool swiglu = false) {
#ifdef TANDEM_HAVE_CUDA
    if (gemv_)
      if (auto y = decode_linear(in, weight, residual, norm, d.eps, swiglu); y.defined())
        return y;
#endif
    auto a = norm.defined() ? rms_norm(in, norm, d.eps) : swiglu ? swiglu_rows(in) : in;
    return residual.defined() ? at::addmm(residual, a, weight.t()) : at::mm(a, weight.t());
  };
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const auto& l = w.layers[i];
    at::Tensor q;
    if (fused) {
#ifdef TANDEM_HAVE_CUDA
      // The target's fused layout (qwen3_packed.cpp): one GEMM for q, k and
      // v (the input norm fused into it at a few rows), q/k norm + RoPE in
      // one kernel, in place.
      const int64_t hh = d.heads * d.head_dim;
      auto qkv = project(x.reshape({b * t, d.hidden}), l.qkv_proj, {}, l.input_norm);
      auto split = [&](int64_t first, int64_t width, int64_t heads) {
        return qkv.narrow(1, first, width).view({b, t, heads, d.head_dim}).transpose(1, 2);  // [B, heads, T, h]
      };
      // The keys and values go into the cache from the same kernel, at
      // lengths_dev_ + t (the positions `pos` holds: fused implies kernel).
      qk_norm_rope_inplace(qkv, l.q_norm, l.k_norm, d.heads, d.kv_heads, d.head_dim, d.eps, cos_flat, sin_flat,
                           cache_.k[i], cache_.v[i], lengths_dev_, t);
      q = split(0, hh, d.heads);
#endif
    } else {
      const auto h = rms_norm(x, l.input_norm, d.eps);
      q = project_q(h, l, d, cos, sin);
      write_cache(cache_.k[i], project_k(h, l, d, cos, sin), pos);
      write_cache(cache_.v[i], project_v(h, l, d), pos);
    }
    at::Tensor attn;
    if (kernel) {
#ifdef TANDEM_HAVE_CUDA
      auto qc = q.contiguous();  // [B, H, T, h]
      auto o = at::empty({b, t, d.heads, d.head_dim}, qc.options());
      kernels::decode_attention_args a;
      a.batch = static_cast<int>(b);
      a.heads = static_cast<int>(d.heads);
      a.kv_heads = static_cast<int>(d.kv_heads);
      a.queries = static_cast<int>(t);
      a.head_dim = static_cast<int>(d.head_dim);
      a.capacity = static_cast<int>(capacity_);
      a.splits = splits_;
      a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
      a.dtype = qc.scalar_type() == at::kBFloat16 ? kernels::attn_dtype::bf16
                : qc.scalar_type() == at::kHalf   ? kernels::attn_dtype::fp16
                                                  : kernels::attn_dtype::fp32;
      a.q = qc.data_ptr();
      a.k = cache_.k[i].data_ptr();
      a.v = cache_.v[i].data_ptr();
      a.lengths = lengths_dev_.data_ptr<int64_t>();
      a.out = o.data_ptr();
      a.workspace = workspace_.data_ptr<float>();
      if (!kernels::decode_attention(a, at::cuda::getCurrentCUDAStream()))
        throw error(errc::bad_input, "target decoder: decode attention refused its shapes");
      attn = o.view({b, t, d.heads * d.head_dim});
#endif
    } else {
      auto k = cache_.k[i].narrow(2, 0, hi), v = cache_.v[i].narrow(2, 0, hi);
      attn = masked_attention(q, k, v, visible, d.head_dim);
    }
    if (fused) {
#ifdef TANDEM_HAVE_CUDA
      // Residual adds in the GEMMs' epilogues; out of place (a tap may be x itself).
      x = project(attn.reshape({b * t, d.heads * d.head_dim}), l.o_proj, x.reshape({b * t, d.hidden}), {});
      auto gu = project(x, l.gate_up_proj, {}, l.post_norm);
      x = project(gu, l.down_proj, x, {}, /*swiglu=*/true).view({b, t, d.hidden});
#endif
    } else {
      x = x + at::linear(attn, l.o_proj);
      x = x + swiglu_mlp(rms_norm(x, l.post_norm, d.eps), l);
    }
    if (want_taps)
      for (size_t j = 0; j < taps_at.size(); ++j)
        if (taps_at[j] == static_cast<int64_t>(i))
          taps[j] = target_.tap_of(x, static_cast<int64_t>(i));
  }
  output out;
  if (want_taps)
    out.taps = at::cat(taps, -1);
  if (logit_at.defined())
    x = x.gather(1, logit_at.view({b, 1, 1}).expand({b, 1, x.size(2)}));
  if (fused)
    out.logits = project(x.reshape({-1, d.hidden}), w.lm_head, {}, w.final_norm)
                   .view({b, x.size(1), w.lm_head.size(0)})
                   .to(at::kFloat);
  else
    out.logits = at::linear(rms_norm(x, w.final_norm, d.eps), w.lm_head).to(at::kFloat);
  return out;
}

// ---------------------------------------------------------------------------------------
// Drafter

drafter_decoder::drafter_decoder(const dflash_config& cfg, const dflash_weights& w,
                                 at::Tensor embed, at::Tensor lm_head, int64_t batch,
                                 int64_t capacity)
  : cfg_(cfg), w_(w), embed_(std::move(embed)), lm_head_(std::move(lm_head)), capacity_(capacity) {
  const auto& l = cfg.layer;
  cache_ = make_cache(l.num_hidden_layers, batch, l.num_key_value_heads, capacity, l.head_dim,
                      w.fc.options());
}

void drafter_decoder::set_context_length(int64_t row, int64_t n) {
  check_row(cache_, row, n, capacity_, "drafter decoder");
  cache_.length[row] = n;
}

void drafter_decoder::reset() {
  std::fill(cache_.length.begin(), cache_.length.end(), 0);
}

void drafter_decoder::extend_context(const at::Tensor& taps, const std::vector<int64_t>& count) {
  at::NoGradGuard no_grad;
  const auto& l = cfg_.layer;
  const layer_dims d{l.hidden_size, l.intermediate_size, l.num_attention_heads,
                     l.num_key_value_heads, l.head_dim, l.rms_norm_eps};
  const auto b = taps.size(0), p = taps.size(1);
  if (b != static_cast<int64_t>(cache_.length.size()) || count.size() != cache_.length.size())
    throw error(errc::bad_input, "drafter decoder: context rows do not match the cache's");
  for (int64_t r = 0; r < b; ++r)
    if (count[r] < 0 || count[r] > p || cache_.length[r] + p > capacity_)
      throw error(errc::bad_input, "drafter decoder: row " + std::to_string(r) + " context of "
                                     + std::to_string(cache_.length[r]) + " + "
                                     + std::to_string(p) + " exceeds the cache's "
                                     + std::to_string(capacity_) + " positions");
  auto pos = positions_after(lengths_tensor(cache_.length, taps.device()), p);  // [B, P]
  auto [cos, sin] = rope_tables(pos, d.head_dim, l.rope_theta);
  auto ctx = rms_norm(at::linear(taps.to(w_.fc.scalar_type()), w_.fc), w_.hidden_norm, d.eps);
  for (size_t i = 0; i < w_.layers.size(); ++i) {
    write_cache(cache_.k[i], project_k(ctx, w_.layers[i], d, cos, sin), pos);
    write_cache(cache_.v[i], project_v(ctx, w_.layers[i], d), pos);
  }
  for (int64_t r = 0; r < b; ++r)
    cache_.length[r] += count[r];
}

at::Tensor drafter_decoder::draft(const at::Tensor& block_ids, bool shift) {
  at::NoGradGuard no_grad;
  const auto& l = cfg_.layer;
  const layer_dims d{l.hidden_size, l.intermediate_size, l.num_attention_heads,
                     l.num_key_value_heads, l.head_dim, l.rms_norm_eps};
  const auto b = block_ids.size(0), t = block_ids.size(1);
  const auto hi = max_of(cache_.length);
  if (t < 2 || t > cfg_.block_size)
    throw error(errc::bad_input, "drafter decoder: a block of " + std::to_string(t)
                                   + " tokens (2 … " + std::to_string(cfg_.block_size) + ")");
  auto start = lengths_tensor(cache_.length, block_ids.device());
  auto pos = positions_after(start, t);                                          // [B, T]
  auto [cos, sin] = rope_tables(pos, d.head_dim, l.rope_theta);
  // Context key c is visible to row b iff c < length(b); block keys always.
  auto ctx_visible = at::arange(hi, start.options()).view({1, 1, hi}) < start.view({b, 1, 1});
  auto visible = at::cat({ctx_visible.expand({b, t, hi}),
                          at::ones({b, t, t}, ctx_visible.options())}, 2).unsqueeze(1);
  auto x = at::embedding(embed_, block_ids);
  for (size_t i = 0; i < w_.layers.size(); ++i) {
    const auto& lw = w_.layers[i];
    auto h = rms_norm(x, lw.input_norm, d.eps);
    auto q = project_q(h, lw, d, cos, sin);
    auto k = at::cat({cache_.k[i].narrow(2, 0, hi), project_k(h, lw, d, cos, sin)}, 2);
    auto v = at::cat({cache_.v[i].narrow(2, 0, hi), project_v(h, lw, d)}, 2);
    x = x + at::linear(masked_attention(q, k, v, visible, d.head_dim), lw.o_proj);
    x = x + swiglu_mlp(rms_norm(x, lw.post_norm, d.eps), lw);
  }
  auto scored = x.narrow(1, shift ? 0 : 1, t - 1);
  return at::linear(rms_norm(scored, w_.norm, d.eps), lm_head_).to(at::kFloat);
}

} // namespace tandem::gpu
