#include "bench/bench.hpp"

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "bench/data_bench.hpp"
#include "gpu/decode/decoder.hpp"
#include "gpu/decode/speculative.hpp"
#include "gpu/models/dflash_objective.hpp"
#include "gpu/engine/drafter_engine.hpp"
#include "gpu/device/error.hpp"
#include "gpu/models/flops.hpp"
#include "gpu/models/dflash.hpp"
#include "gpu/models/dflash_attention.hpp"
#include "gpu/models/qwen3.hpp"
#include "gpu/engine/target_forward.hpp"
#include "gpu/pch.hpp"
#include "gpu/io/safetensors.hpp"
#include "gpu/transport/tensors.hpp"

#include <torch/csrc/autograd/profiler_kineto.h>

#ifdef TANDEM_HAVE_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace tandem::gpu {

namespace {

constexpr int schema_version = 1;

/// Shapes of one benchmark size.
struct bench_shapes {
  qwen3_config target;        ///< target model (its layers up to the deepest tap run)
  int64_t draft_layers = 5;
  int64_t batch = 4;          ///< target rows
  int64_t seq = 3072;         ///< tokens per row
  int64_t anchors = 512;      ///< N
  int64_t block = 16;         ///< Bs
};

/// `block` > 0: the drafter's block size instead of 16 (bench --block-size).
bench_shapes shapes_for(const std::string& size, int64_t block = 0) {
  bench_shapes s;
  auto& t = s.target;
  if (size == "8b") {  // Qwen3-8B
    t.vocab_size = 151936; t.hidden_size = 4096; t.intermediate_size = 12288;
    t.num_hidden_layers = 36; t.num_attention_heads = 32; t.num_key_value_heads = 8;
    t.head_dim = 128;
  } else if (size == "14b") {  // Qwen3-14B: a GQA group of 5 (40 heads, 8 kv heads)
    t.vocab_size = 151936; t.hidden_size = 5120; t.intermediate_size = 17408;
    t.num_hidden_layers = 40; t.num_attention_heads = 40; t.num_key_value_heads = 8;
    t.head_dim = 128;
  } else if (size == "tiny") {  // launch-bound, and fits a 2-core CPU
    t.vocab_size = 2048; t.hidden_size = 256; t.intermediate_size = 768;
    t.num_hidden_layers = 8; t.num_attention_heads = 4; t.num_key_value_heads = 2;
    t.head_dim = 64;
    s.draft_layers = 2; s.batch = 2; s.seq = 256; s.anchors = 32; s.block = 16;
  } else {
    throw error(errc::bad_input, "unknown bench size '" + size + "' (tiny, 8b, 14b, auto)");
  }
  t.rms_norm_eps = 1e-6; t.rope_theta = 1e6; t.max_position_embeddings = 40960;
  if (block > 0) {
    if (block < 2 || block > s.seq)
      throw error(errc::bad_input, "bench --block-size " + std::to_string(block) + ": a block size from 2 to "
                                     + std::to_string(s.seq) + " (the size's sequence length)");
    s.block = block;
  }
  return s;
}

struct timing {
  std::vector<double> ms;
  double median = 0, mad = 0;
};

timing summarise(std::vector<double> ms) {
  timing t;
  t.ms = ms;
  std::sort(ms.begin(), ms.end());
  t.median = ms[ms.size() / 2];
  std::vector<double> dev;
  for (auto x : ms)
    dev.push_back(std::abs(x - t.median));
  std::sort(dev.begin(), dev.end());
  t.mad = dev[dev.size() / 2];
  return t;
}

/// Times `fn` `iters` times after `warmup` runs, with CUDA events on the
/// current stream on a GPU, a steady clock on the CPU.  `setup`, when given,
/// runs before each `fn`, untimed (on a GPU it is queued before the start
/// event, so its kernels are not counted either).
timing time_runs(const at::Device& dev, int warmup, int iters, const std::function<void()>& fn,
                 const std::function<void()>& setup = {}) {
  for (int i = 0; i < warmup; ++i) {
    if (setup)
      setup();
    fn();
  }
  std::vector<double> ms;
#ifdef TANDEM_HAVE_CUDA
  if (dev.is_cuda()) {
    auto stream = c10::cuda::getCurrentCUDAStream(dev.index());
    stream.synchronize();
    for (int i = 0; i < iters; ++i) {
      at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
      if (setup)
        setup();
      start.record(stream);
      fn();
      stop.record(stream);
      stop.synchronize();
      ms.push_back(start.elapsed_time(stop));
    }
    return summarise(ms);
  }
#endif
  for (int i = 0; i < iters; ++i) {
    if (setup)
      setup();
    auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return summarise(ms);
}

void reset_peak(const at::Device& dev) {
#ifdef TANDEM_HAVE_CUDA
  if (dev.is_cuda())
    c10::cuda::CUDACachingAllocator::resetPeakStats(dev.index());
#endif
}

double peak_gib(const at::Device& dev) {
#ifdef TANDEM_HAVE_CUDA
  if (dev.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(dev.index());
    return static_cast<double>(stats.allocated_bytes[0].peak) / (1024.0 * 1024 * 1024);
  }
#endif
  return 0;
}

std::string device_name(const at::Device& dev) {
#ifdef TANDEM_HAVE_CUDA
  if (dev.is_cuda())
    return at::cuda::getDeviceProperties(dev.index())->name;
#endif
  return "cpu";
}

/// Marks phase boundaries inside runs: CUDA events on the current stream on
/// a GPU (read after the runs, so marking adds no host synchronisation), a
/// steady clock on the CPU.
class phase_clock {
public:
  explicit phase_clock(const at::Device& dev) : dev_(dev) {}

  /// Starts a new run's marks.
  void begin() {
#ifdef TANDEM_HAVE_CUDA
    events_.emplace_back();
#endif
    times_.emplace_back();
    mark();
  }

  void mark() {
#ifdef TANDEM_HAVE_CUDA
    if (dev_.is_cuda()) {
      events_.back().push_back(std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault));
      events_.back().back()->record(c10::cuda::getCurrentCUDAStream(dev_.index()));
      return;
    }
#endif
    times_.back().push_back(std::chrono::steady_clock::now());
  }

  /// Milliseconds between consecutive marks of run `r` (synchronises).
  std::vector<double> intervals(size_t r) const {
    std::vector<double> out;
#ifdef TANDEM_HAVE_CUDA
    if (dev_.is_cuda()) {
      const auto& ev = events_.at(r);
      if (!ev.empty())
        ev.back()->synchronize();
      for (size_t i = 1; i < ev.size(); ++i)
        out.push_back(ev[i - 1]->elapsed_time(*ev[i]));
      return out;
    }
#endif
    const auto& t = times_.at(r);
    for (size_t i = 1; i < t.size(); ++i)
      out.push_back(std::chrono::duration<double, std::milli>(t[i] - t[i - 1]).count());
    return out;
  }

private:
  at::Device dev_;
#ifdef TANDEM_HAVE_CUDA
  std::vector<std::vector<std::shared_ptr<at::cuda::CUDAEvent>>> events_;
#endif
  std::vector<std::vector<std::chrono::steady_clock::time_point>> times_;
};

nlohmann::json base_line(const std::string& name, const bench_options& o, const at::Device& dev,
                         const std::string& size) {
  return {{"schema", schema_version}, {"case", name},         {"git_commit", o.git_commit},
          {"device", device_name(dev)}, {"size", size},        {"warmup", o.warmup},
          {"iters", o.iters}};
}

void finish_line(nlohmann::json& j, const timing& t, double flop, double tokens, double mem_gib) {
  j["median_ms"] = t.median;
  j["mad_ms"] = t.mad;
  j["samples_ms"] = t.ms;
  j["tokens_per_s"] = tokens / (t.median / 1e3);
  j["tflop"] = flop / 1e12;
  j["tflops"] = flop / 1e12 / (t.median / 1e3);
  j["mfu"] = j["tflops"].get<double>() / peak_tflops_bf16;
  j["peak_mem_gib"] = mem_gib;
}

nlohmann::json profile_kernels(const at::Device& dev, int steps, const std::string& trace,
                               const std::function<void()>& step);

/// Target forward with taps, stopping after the deepest tap (no head), as the
/// target engine runs it (target_forward_runner), one line a variant:
///   graphs / eager / mask  `--docs` documents a row (default 4, equal
///                          lengths), the packed path replayed as CUDA graphs,
///                          the packed path eagerly, and the dense-mask path
///                          (the engine's before issue 20);
///   graphs_1doc            one document a row, graphs (the Python
///                          reference's case: bench/reference_target.py);
///   causal_sdpa            one document a row through forward(ids): SDPA's
///                          causal kernel, kv heads expanded (the bench's
///                          line before issue 20);
///   graphs_flash2,         graphs and graphs_1doc with FlashAttention-2
///   graphs_1doc_flash2     varlen (TANDEM_TARGET_ATTENTION=flash2), when the
///                          packed path's attention is the chunked kernel.
/// Each line's "attention" is the packed path's (qwen3_target::packed_attention).
/// The eager line carries kernel_ms (per forward, profiled after the timed runs).
void bench_target_forward(const bench_options& o, const at::Device& dev, const std::string& size,
                          at::ScalarType dtype, const std::function<void(const std::string&)>& emit) {
  auto s = shapes_for(size);
  if (o.rows > 0)
    s.batch = o.rows;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
#ifdef TANDEM_HAVE_CUDA
  if (dev.is_cuda())
    gen = at::cuda::detail::createCUDAGenerator(dev.index());
#endif
  gen.set_current_seed(1);
  const auto taps = default_tap_ids(s.target.num_hidden_layers, 5);
  const auto run_layers = *std::max_element(taps.begin(), taps.end()) + 1;
  layer_dims d{s.target.hidden_size, s.target.intermediate_size, s.target.num_attention_heads,
               s.target.num_key_value_heads, s.target.head_dim, s.target.rms_norm_eps};
  qwen3_weights w;
  auto opts = at::TensorOptions().dtype(dtype).device(dev);
  w.embed = at::empty({s.target.vocab_size, s.target.hidden_size}, opts).normal_(0, 0.02, gen);
  w.lm_head = w.embed;
  for (int64_t i = 0; i < run_layers; ++i)
    w.layers.push_back(random_decoder_layer(d, dtype, dev, gen, 0.02));
  qwen3_target target(s.target, std::move(w), taps);
  auto long_opts = at::TensorOptions().dtype(at::kLong).device(dev);
  auto ids = at::randint(s.target.vocab_size, {s.batch, s.seq}, gen, long_opts);
  const int64_t docs = std::max<int64_t>(1, o.docs);
  auto lengths_of = [&](int64_t n) {
    auto l = at::full({s.batch, n}, s.seq / n, long_opts);
    l.select(1, n - 1).add_(s.seq - (s.seq / n) * n);
    return l;
  };
  const double tokens = s.batch * s.seq;
  auto flop_of = [&](const at::Tensor& lengths) {
    auto l = lengths.to(at::kCPU).to(at::kDouble);
    const double pairs = (l * (l + 1) / 2).sum().item<double>();  // causal within each document
    return run_layers * layer_linear_flops(dims_of(s.target), tokens, 0) + run_layers * attention_flops(dims_of(s.target), pairs);
  };
  auto line = [&](const std::string& variant, int64_t n_docs, const timing& t, double flop, const std::string& path) {
    auto j = base_line("target_forward", o, dev, size);
    j["variant"] = variant;
    j["path"] = path;
    // SDPA's cuDNN backend (the mask and causal_sdpa lines may use it): on
    // unless an engine of this process turned it off (engine_device).
    j["cudnn_sdpa"] = at::globalContext().userEnabledCuDNNSDP();
    j["shapes"] = {{"batch", s.batch}, {"seq", s.seq}, {"hidden", s.target.hidden_size},
                   {"layers_run", run_layers}, {"layers", s.target.num_hidden_layers},
                   {"taps", taps}, {"docs_per_row", n_docs}, {"dtype", c10::toString(dtype)}};
    finish_line(j, t, flop, tokens, peak_gib(dev));
    return j;
  };
  struct variant {
    const char* name;
    const char* mode;
    int64_t docs;
    bool flash2 = false;
  };
  std::vector<variant> variants{{"graphs", "graphs", docs}, {"eager", "eager", docs},
                                {"mask", "mask", docs}, {"graphs_1doc", "graphs", 1}};
  if (target.packed_attention() == "dflash chunked") {
    variants.push_back({"graphs_flash2", "graphs", docs, true});
    variants.push_back({"graphs_1doc_flash2", "graphs", 1, true});
  }
  for (const auto& v : variants) {
    auto lengths = lengths_of(v.docs);
    if (v.flash2)  // offered only when TANDEM_TARGET_ATTENTION did not already ask for it
      target.prefer_flash2(true);
    target_forward_runner runner(target, dev, v.mode);
    reset_peak(dev);
    auto t = time_runs(dev, std::max(o.warmup, 1), o.iters, [&] { (void)runner.taps(ids, lengths); });
    auto j = line(v.name, v.docs, t, flop_of(lengths), runner.path());
    j["attention"] = std::string(v.mode) == "mask" ? "sdpa mask" : target.packed_attention();
    if (v.flash2)
      target.prefer_flash2(false);
    j["graph_pool_gib"] = dev.is_cuda() ? nlohmann::json(static_cast<double>(runner.graph_pool_bytes()) / (1 << 30))
                                        : nlohmann::json(nullptr);  // no graphs on the CPU
    if (std::string(v.name) == "eager" && o.profile_steps > 0) {
      auto kernels = profile_kernels(dev, o.profile_steps,
                                     o.trace_dir.empty() ? "" : o.trace_dir + "/target_forward_" + size + ".json",
                                     [&] { (void)runner.taps(ids, lengths); });
      if (!kernels.empty())
        j["kernel_ms"] = kernels;
    }
    emit(j.dump());
  }
  reset_peak(dev);
  auto t = time_runs(dev, o.warmup, o.iters, [&] { (void)target.forward(ids); });
  emit(line("causal_sdpa", 1, t, flop_of(lengths_of(1)), "sdpa causal, kv heads expanded").dump());
}

/// One eager drafter training step: anchors, layout, forward, chunked CE,
/// backward (no optimizer: that is the GPU-engine issue's captured step).
nlohmann::json bench_drafter_step(const bench_options& o, const at::Device& dev,
                                  const std::string& size, at::ScalarType dtype) {
  auto s = shapes_for(size, o.block);
  const int64_t batch = 1;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2);
#ifdef TANDEM_HAVE_CUDA
  if (dev.is_cuda())
    gen = at::cuda::detail::createCUDAGenerator(dev.index());
#endif
  gen.set_current_seed(2);
  auto opts = at::TensorOptions().dtype(dtype).device(dev);
  dflash_config cfg;
  cfg.layer = s.target;
  cfg.layer.num_hidden_layers = s.draft_layers;
  cfg.block_size = s.block;
  cfg.num_target_layers = s.target.num_hidden_layers;
  cfg.mask_token_id = s.target.vocab_size - 1;
  cfg.target_layer_ids = default_tap_ids(s.target.num_hidden_layers, 5);
  const auto d = s.target.hidden_size;
  const auto n_taps = static_cast<int64_t>(cfg.target_layer_ids.size());
  dflash_weights w;
  w.fc = at::empty({d, n_taps * d}, opts).normal_(0, 0.02, gen);
  w.hidden_norm = at::ones({d}, opts);
  w.norm = at::ones({d}, opts);
  layer_dims ld{d, s.target.intermediate_size, s.target.num_attention_heads,
                s.target.num_key_value_heads, s.target.head_dim, s.target.rms_norm_eps};
  for (int64_t i = 0; i < s.draft_layers; ++i)
    w.layers.push_back(random_decoder_layer(ld, dtype, dev, gen, 0.02));
  for (auto& [name, p] : dflash_parameters(w))
    p->requires_grad_(true);
  auto embed = at::empty({s.target.vocab_size, d}, opts).normal_(0, 0.02, gen);
  auto head = at::empty({s.target.vocab_size, d}, opts).normal_(0, 0.02, gen);
  auto lopts = at::TensorOptions().dtype(at::kLong).device(dev);
  auto tokens = at::randint(s.target.vocab_size, {batch, s.seq}, gen, lopts);
  auto loss_mask = at::ones({batch, s.seq}, lopts.dtype(at::kByte));
  auto hidden = at::empty({batch, s.seq, n_taps * d}, opts).normal_(0, 1, gen);
  auto docs = whole_row_layout(batch, s.seq, dev);
  objective_options oo;
  oo.block_size = s.block;
  oo.mask_token_id = cfg.mask_token_id;
  oo.gamma = default_gamma(s.block);
  oo.chunk_rows = 2048;
  at::Tensor anchors_used;
  // Phases (docs/bench.md): layout, forward, ce, backward, marked inside
  // every run; the medians are over the timed runs only.
  static const char* const phase_names[] = {"layout", "forward", "ce", "backward"};
  phase_clock clock(dev);
  reset_peak(dev);
  auto step = [&] {
    for (auto& [name, p] : dflash_parameters(w))
      p->mutable_grad() = at::Tensor();
    clock.begin();
    auto a = sample_anchors(loss_mask, docs, s.anchors, s.block, gen);
    auto b = make_block_batch(tokens, loss_mask, docs, hidden, a, embed, s.block, cfg.mask_token_id, oo.gamma,
                                /*dense_mask=*/false);
    clock.mark();
    // dflash_objective, split at its phases (as it does: on CUDA the last
    // layer skips each block's unscored position 0).
    auto h = dflash_forward(w, cfg, b.inputs, dev.is_cuda() ? s.block : 0);
    clock.mark();
    auto ce = scored_cross_entropy(h, head, b, oo);
    auto loss = ce.weighted_ce / (b.loss_weight.sum() + 1e-6);
    clock.mark();
    loss.backward();
    clock.mark();
    anchors_used = a.anchors;
  };
  auto t = time_runs(dev, o.warmup, o.iters, step);
  std::vector<std::vector<double>> phase_ms(4);
  for (int r = o.warmup; r < o.warmup + o.iters; ++r) {
    auto iv = clock.intervals(static_cast<size_t>(r));
    for (size_t i = 0; i < iv.size() && i < phase_ms.size(); ++i)
      phase_ms[i].push_back(iv[i]);
  }
  const double flop = drafter_step_flops(dims_of(cfg.layer), s.draft_layers, n_taps, batch, s.seq, s.anchors,
                                         s.block, anchors_used.to(at::kDouble).sum().item<double>());
  const double q = s.anchors * s.block;
  auto j = base_line("drafter_step_eager", o, dev, size);
  const auto attention = dflash_attention_path(opts, s.target.num_attention_heads,
                                               s.target.num_key_value_heads, s.target.head_dim,
                                               s.block);
  j["shapes"] = {{"batch", batch}, {"seq", s.seq}, {"anchors", s.anchors}, {"block", s.block},
                 {"hidden", d}, {"layers", s.draft_layers}, {"vocab", s.target.vocab_size},
                 {"attention", attention}, {"optimizer", "none (forward + backward)"},
                 {"dtype", c10::toString(dtype)}};
  finish_line(j, t, flop, batch * q, peak_gib(dev));
  nlohmann::json phases = nlohmann::json::object();
  for (size_t i = 0; i < phase_ms.size(); ++i)
    if (!phase_ms[i].empty())
      phases[phase_names[i]] = summarise(phase_ms[i]).median;
  j["phases_ms"] = phases;
  return j;
}

/// One drafter layer's KV-injection attention, forward + backward, at the
/// drafter's shapes (batch 1): dflash_attention against the dense-mask SDPA
/// formulation on the same operands.  Anchors as in training on packed rows:
/// 4 equal documents a row, loss mask on the second half of each.
nlohmann::json bench_dflash_attention(const bench_options& o, const at::Device& dev,
                                      const std::string& size, at::ScalarType dtype) {
  auto s = shapes_for(size, o.block);
  const int64_t batch = 1, docs = 4;
  const auto heads = s.target.num_attention_heads, kv_heads = s.target.num_key_value_heads,
             hd = s.target.head_dim;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
#ifdef TANDEM_HAVE_CUDA
  if (dev.is_cuda())
    gen = at::cuda::detail::createCUDAGenerator(dev.index());
#endif
  gen.set_current_seed(3);
  auto lopts = at::TensorOptions().dtype(at::kLong).device(dev);
  auto layout = make_doc_layout(at::full({batch, docs}, s.seq / docs, lopts), s.seq);
  auto idx = at::arange(s.seq, lopts).unsqueeze(0);
  auto loss_mask = ((idx - layout.start) * 2 >= layout.end - layout.start).to(at::kByte);
  auto anchors = sample_anchors(loss_mask, layout, s.anchors, s.block, gen);
  auto blocks = make_block_batch(at::zeros({batch, s.seq}, lopts), loss_mask, layout,
                                 at::zeros({batch, s.seq, 1}, lopts.dtype(at::kFloat)), anchors,
                                 at::zeros({2, 1}, lopts.dtype(at::kFloat)), s.block, 1, 7.0);
  const auto& in = blocks.inputs;
  const int64_t q_len = s.anchors * s.block;
  auto opts = at::TensorOptions().dtype(dtype).device(dev);
  // Operands in the drafter's layout: [B, T, heads, d] memory seen as [B, heads, T, d].
  auto operand = [&](int64_t h, int64_t t) {
    return at::empty({batch, t, h, hd}, opts).normal_(0, 1, gen).transpose(1, 2).requires_grad_(true);
  };
  auto q = operand(heads, q_len), k_ctx = operand(kv_heads, s.seq), v_ctx = operand(kv_heads, s.seq),
       k_blk = operand(kv_heads, q_len), v_blk = operand(kv_heads, q_len);
  auto dout = at::empty({batch, q_len, heads, hd}, opts).normal_(0, 1, gen).transpose(1, 2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  using attention_fn = at::Tensor (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      const at::Tensor&, const at::Tensor&, double);
  auto forward = [&](attention_fn fn) {
    return fn(q, k_ctx, v_ctx, k_blk, v_blk, in.ctx_lo, in.ctx_hi, in.keep, scale);
  };
  auto backward = [&](const at::Tensor& out) {
    (void)torch::autograd::grad({out}, {q, k_ctx, v_ctx, k_blk, v_blk}, {dout});
  };
  struct measured {
    timing fwd, bwd, total;
  };
  auto measure = [&](attention_fn fn) {
    measured m;
    {
      at::NoGradGuard no_grad;
      m.fwd = time_runs(dev, o.warmup, o.iters, [&] { (void)forward(fn); });
    }
    at::Tensor out;
    m.bwd = time_runs(dev, o.warmup, o.iters, [&] { backward(out); }, [&] { out = forward(fn); });
    out = at::Tensor();
    m.total = time_runs(dev, o.warmup, o.iters, [&] { backward(forward(fn)); });
    return m;
  };
  reset_peak(dev);
  const auto ours = measure(&dflash_attention);
  const double mem = peak_gib(dev);
  const auto dense = measure(&dflash_attention_dense);

  // Useful FLOPs (docs/bench.md): visible (query, key) pairs only.  Block j
  // has Bs queries seeing (ctx_hi − ctx_lo) context keys and Bs block keys.
  const auto keep = in.keep.to(at::kLong);
  const double pairs = ((in.ctx_hi - in.ctx_lo).to(at::kLong) * keep + s.block * keep)
                         .sum()
                         .item<double>()
                       * s.block;
  const double fwd_flop = 4.0 * pairs * heads * hd, bwd_flop = 2.5 * fwd_flop;
  auto j = base_line("dflash_attention", o, dev, size);
  j["shapes"] = {{"batch", batch}, {"seq", s.seq}, {"anchors", s.anchors}, {"block", s.block},
                 {"heads", heads}, {"kv_heads", kv_heads}, {"head_dim", hd}, {"documents", docs},
                 {"attention", dflash_attention_path(opts, heads, kv_heads, hd, s.block)},
                 {"dtype", c10::toString(dtype)}};
  finish_line(j, ours.total, fwd_flop + bwd_flop, batch * q_len, mem);
  j["visible_pairs"] = pairs;
  j["dense_pairs"] = static_cast<double>(batch * q_len * (s.seq + q_len));
  j["forward_ms"] = ours.fwd.median;
  j["forward_mad_ms"] = ours.fwd.mad;
  j["backward_ms"] = ours.bwd.median;
  j["backward_mad_ms"] = ours.bwd.mad;
  j["forward_tflops"] = fwd_flop / 1e12 / (ours.fwd.median / 1e3);
  j["backward_tflops"] = bwd_flop / 1e12 / (ours.bwd.median / 1e3);
  j["dense_sdpa"] = {{"median_ms", dense.total.median}, {"mad_ms", dense.total.mad},
                     {"forward_ms", dense.fwd.median}, {"backward_ms", dense.bwd.median},
                     {"samples_ms", dense.total.ms}};
  j["speedup_vs_dense"] = dense.total.median / ours.total.median;
  return j;
}

/// Shapes of the drafter_step case: the engine's real step at batch 1.
bench_shapes drafter_step_shapes(const std::string& size, int64_t block) {
  auto s = shapes_for(size, block);
  s.batch = 1;
  if (size == "tiny") {  // launch-bound: many small kernels
    s.target.vocab_size = 4096;
    s.seq = 512;
  }
  return s;
}

/// A random-weight target folder with only what drafter_engine reads:
/// config.json, embedding and lm-head (no decoder layer).  Removed on
/// destruction.
struct temp_target {
  std::filesystem::path dir;

  temp_target(const qwen3_config& c, const at::Device& dev, at::ScalarType dtype) {
    dir = std::filesystem::temp_directory_path()
          / ("tandem-bench-target-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    nlohmann::json j = {{"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "qwen3"},
                        {"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                        {"intermediate_size", c.intermediate_size},
                        {"num_hidden_layers", c.num_hidden_layers},
                        {"num_attention_heads", c.num_attention_heads},
                        {"num_key_value_heads", c.num_key_value_heads}, {"head_dim", c.head_dim},
                        {"rms_norm_eps", c.rms_norm_eps}, {"rope_theta", c.rope_theta},
                        {"max_position_embeddings", c.max_position_embeddings},
                        {"hidden_act", "silu"}, {"tie_word_embeddings", false},
                        {"attention_bias", false}};
    std::ofstream(dir / "config.json") << j.dump(2);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
#ifdef TANDEM_HAVE_CUDA
    if (dev.is_cuda())
      gen = at::cuda::detail::createCUDAGenerator(dev.index());
#endif
    gen.set_current_seed(4);
    auto opts = at::TensorOptions().dtype(dtype).device(dev);
    std::map<std::string, at::Tensor> t;
    t["model.embed_tokens.weight"] = at::empty({c.vocab_size, c.hidden_size}, opts).normal_(0, 0.02, gen);
    t["lm_head.weight"] = at::empty({c.vocab_size, c.hidden_size}, opts).normal_(0, 0.02, gen);
    save_safetensors(dir / "model.safetensors", t);
  }
  ~temp_target() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  temp_target(const temp_target&) = delete;
  temp_target& operator=(const temp_target&) = delete;
};

/// Runs `argv` (no shell) and returns its exit status and stdout + stderr.
std::pair<int, std::string> run_capture(const std::vector<std::string>& argv) {
  std::string cmd;
  for (const auto& a : argv) {
    std::string q = "'";
    for (char ch : a)
      q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    cmd += q + "' ";
  }
  cmd += "2>&1";
  std::fflush(stdout);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr)
    return {-1, "cannot start " + argv.at(0)};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
    out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

#ifdef TANDEM_HAVE_CUDA
/// Kernel class of a CUDA activity, by name (docs/bench.md, "kernel_ms").
std::string kernel_class(const std::string& name) {
  auto has = [&](const char* x) { return name.find(x) != std::string::npos; };
  if (has("Memcpy") || has("memcpy"))
    return "memcpy";
  if (has("Memset") || has("memset"))
    return "memset";
  if (has("nccl"))
    return "nccl";
  // By argument type, so that other kernels named fwd/bwd (norms, SwiGLU) stay out;
  // FlashAttention (the target's) before "gemm", whose names its cutlass types match.
  if (has("dflash_attention_") || has("flash_fwd") || has("flash_bwd") || has("fmha"))
    return "attention";
  if (has("ce_grad") || has("ce_scale"))
    return "ce_grad";
  if (has("gemv"))  // Tandem's decode GEMV and cuBLAS's gemv kernels
    return "gemv";
  if (has("rms_norm") || has("rope_kernel"))  // also the target's qk_norm_rope
    return "norm_rope";
  if (has("swiglu"))
    return "swiglu";
  if (has("adamw") || has("sumsq") || has("fused_adam") || has("multi_tensor"))
    return "optimizer";
  if (has("gemm") || has("nvjet") || has("cutlass") || has("xmma") || has("sm90_") || has("Kernel2"))
    return "gemm";
  if (has("reduce_kernel") || has("Reduce"))
    return "reduce";
  if (has("elementwise") || has("Elementwise") || has("block_rows"))  // block_rows: Tandem's row copies
    return "elementwise";
  if (has("index") || has("gather") || has("scatter") || has("Index"))
    return "index";
  if (has("sort") || has("Sort") || has("cub::") || has("random") || has("distribution"))
    return "sort_random";
  return "other";
}
#endif

/// Runs `step` `steps` times under the Kineto profiler and sums the GPU time
/// of every kernel, copy and memset per step by kernel_class (ms); the
/// Chrome trace goes to `trace` when it is not empty.  {} on the CPU.
nlohmann::json profile_kernels(const at::Device& dev, int steps, const std::string& trace,
                               const std::function<void()>& step) {
  nlohmann::json out = nlohmann::json::object();
#ifdef TANDEM_HAVE_CUDA
  if (!dev.is_cuda() || steps <= 0)
    return out;
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  c10::cuda::getCurrentCUDAStream(dev.index()).synchronize();
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  const std::set<ActivityType> activities{ActivityType::CPU, ActivityType::CUDA};
  prof::prepareProfiler(config, activities);  // as torch.profiler does before enabling
  prof::enableProfiler(config, activities);
  for (int i = 0; i < steps; ++i)
    step();
  c10::cuda::getCurrentCUDAStream(dev.index()).synchronize();
  auto result = prof::disableProfiler();
  std::map<std::string, double> ms;
  std::map<std::string, int64_t> launches;
  double total = 0;
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // [start, end) ns of every device event
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA)
      continue;
    const double t = static_cast<double>(e.durationNs()) / 1e6 / steps;
    const auto c = kernel_class(e.name());
    ms[c] += t;
    ++launches[c];
    total += t;
    spans.emplace_back(e.startNs(), e.startNs() + e.durationNs());
  }
  for (auto& [c, t] : ms)
    out[c] = {{"ms", t}, {"launches", launches[c] / steps}};
  out["total_ms"] = total;
  // busy_ms: the time at least one event ran (overlaps counted once);
  // span_ms: first start to last end over the profiled steps, so span − busy
  // is the device idle between and inside steps (launch gaps, host work).
  if (!spans.empty()) {
    std::sort(spans.begin(), spans.end());
    uint64_t busy = 0, lo = spans.front().first, hi = spans.front().second;
    for (const auto& [a, b] : spans) {
      if (a > hi) {
        busy += hi - lo;
        lo = a;
      }
      hi = std::max(hi, b);
    }
    busy += hi - lo;  // hi: the last event's end
    out["busy_ms"] = static_cast<double>(busy) / 1e6 / steps;
    out["span_ms"] = static_cast<double>(hi - spans.front().first) / 1e6 / steps;
  }
  if (!trace.empty()) {
    std::filesystem::create_directories(std::filesystem::path(trace).parent_path());
    result->save(trace);
  }
#else
  (void)dev, (void)steps, (void)trace, (void)step;
#endif
  return out;
}

/// The engine's real training step (drafter_engine::train_step: anchors,
/// layout, forward, chunked CE, backward, clip, fused AdamW on fp32
/// masters), eager and graphed, on one published batch and random taps;
/// then, with --reference, the PyTorch reference.  Emits one line a variant.
void bench_drafter_engine_step(const bench_options& o, const at::Device& dev,
                               const std::string& size, at::ScalarType dtype,
                               const std::function<void(const std::string&)>& emit) {
  const auto s = drafter_step_shapes(size, o.block);
  const int64_t batch = 1;
  const auto d = s.target.hidden_size;
  const auto taps = default_tap_ids(s.target.num_hidden_layers, 5);
  const auto n_taps = static_cast<int64_t>(taps.size());
  temp_target target(s.target, dev, dtype);

  // Inputs, published as the target and the prefetcher would: one document
  // a row, loss on every token.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
#ifdef TANDEM_HAVE_CUDA
  if (dev.is_cuda())
    gen = at::cuda::detail::createCUDAGenerator(dev.index());
#endif
  gen.set_current_seed(5);
  auto lopts = at::TensorOptions().dtype(at::kLong).device(dev);
  transport::payload bp;
  bp.tensors = {at::randint(s.target.vocab_size, {batch, s.seq}, gen, lopts),
                at::ones({batch, s.seq}, lopts.dtype(at::kByte)), at::full({batch, 1}, s.seq, lopts)};
  transport::payload fp;
  fp.tensors = {at::empty({batch, s.seq, n_taps * d}, at::TensorOptions().dtype(dtype).device(dev))
                  .normal_(0, 1, gen)};
#ifdef TANDEM_HAVE_CUDA
  if (dev.is_cuda())  // published without a ready event: valid on every stream from here on
    c10::cuda::getCurrentCUDAStream(dev.index()).synchronize();
#endif
  const auto batch_h = transport::publish(std::move(bp));
  const auto features_h = transport::publish(std::move(fp));
  struct releaser {
    transport::handle a, b;
    ~releaser() {
      transport::release(a);
      transport::release(b);
    }
  } release_inputs{batch_h, features_h};

  // Useful FLOPs as drafter_step_eager counts them, nothing for clip and
  // AdamW; the engine's anchors are private, so Σ anchor_j is its expected
  // value N·(S − Bs)/2 (uniform over the candidates 0..S−Bs).
  const double flop =
    expected_drafter_step_flops(dims_of(s.target), s.draft_layers, n_taps, batch, s.seq, s.anchors, s.block);
  const double tokens = batch * s.anchors * s.block;
  const auto attention = dflash_attention_path(at::TensorOptions().dtype(dtype).device(dev),
                                               s.target.num_attention_heads,
                                               s.target.num_key_value_heads, s.target.head_dim,
                                               s.block);
  const nlohmann::json shapes = {
    {"batch", batch}, {"seq", s.seq}, {"anchors", s.anchors}, {"block", s.block},
    {"hidden", d}, {"intermediate", s.target.intermediate_size},
    {"heads", s.target.num_attention_heads}, {"kv_heads", s.target.num_key_value_heads},
    {"head_dim", s.target.head_dim}, {"layers", s.draft_layers}, {"vocab", s.target.vocab_size},
    {"taps", taps}, {"chunk_rows", 2048}, {"attention", attention},
    {"optimizer", "clip + fused AdamW, fp32 masters"}, {"dtype", c10::toString(dtype)},
    {"engine", "fused"}};  // the engine's one layout (flat buffers, in-place weight gradients)

  auto run_mode = [&](bool graphs) {
    drafter_engine_options eo;
    eo.target_dir = target.dir;
    eo.device = dev.is_cuda() ? dev.index() : -1;
    eo.layers = s.draft_layers;
    eo.block_size = s.block;
    eo.mask_token_id = s.target.vocab_size - 1;
    eo.anchors = s.anchors;
    eo.chunk_rows = 2048;
    eo.tap_ids = taps;
    eo.capture_graphs = graphs;
    eo.seed = 6;
    drafter_engine engine(eo);
    // Graphed: step 1 runs eagerly (the capture's warm-up), step 2 captures.
    const int warmup = graphs ? std::max(o.warmup, 2) : o.warmup;
    reset_peak(dev);
    at::AutoGradMode grad(true);
    step_result last;
    for (int i = 0; i < warmup; ++i)
      last = engine.train_step(batch_h, features_h);
    std::vector<double> ms;
    for (int i = 0; i < o.iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      last = engine.train_step(batch_h, features_h);  // ends with the metrics' read-back
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    auto t = summarise(ms);
    nlohmann::json kernels;
    if (o.profile_steps > 0)  // graphed: the same kernels, replayed (busy_ms, span_ms tell the gaps)
      kernels = profile_kernels(dev, o.profile_steps,
                                o.trace_dir.empty() ? ""
                                                    : o.trace_dir + "/drafter_step_" + size
                                                        + (graphs ? "_graphed" : "") + ".json",
                                [&] { last = engine.train_step(batch_h, features_h); });
    auto j = base_line("drafter_step", o, dev, size);
    j["warmup"] = warmup;
    j["mode"] = graphs ? "graphed" : "eager";
    j["captured"] = graphs && dev.is_cuda();  // the engine ignores capture_graphs on the CPU
    j["shapes"] = shapes;
    j["parameters"] = engine.info().parameters;
    finish_line(j, t, flop, tokens, peak_gib(dev));
    j["last_step"] = {{"loss", last.loss}, {"grad_norm", last.grad_norm}, {"finite", last.finite},
                      {"step", last.step}};
    if (!kernels.empty())
      j["kernel_ms"] = kernels;  // per step, profiled after the timed runs
    return j;
  };
  auto eager = run_mode(false);
  emit(eager.dump());
#ifdef TANDEM_HAVE_CUDA
  if (dev.is_cuda())
    c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  // The CPU has no graphs: its "graphed" line would repeat the eager one,
  // and Tandem's figure there is the eager step.
  nlohmann::json graphed = eager;
  if (dev.is_cuda()) {
    graphed = run_mode(true);
    graphed["speedup_vs_eager"] = eager["median_ms"].get<double>() / graphed["median_ms"].get<double>();
    emit(graphed.dump());
  }
  if (!o.reference)
    return;
#ifdef TANDEM_HAVE_CUDA
  if (dev.is_cuda())
    c10::cuda::CUDACachingAllocator::emptyCache();  // leave the GPU's memory to the reference
#endif

  // The PyTorch reference, in its own process (bench/reference_step.py).
  auto ref_line = [&] {
    auto j = base_line("drafter_step_reference", o, dev, size);
    j["shapes"] = shapes;  // the reference's own attention, CE and optimizer are top-level fields
    j["shapes"].erase("attention");
    j["shapes"].erase("optimizer");
    j["shapes"].erase("chunk_rows");
    return j;
  };
  const std::string device_arg = dev.is_cuda() ? "cuda:" + std::to_string(dev.index()) : "cpu";
  std::vector<std::string> argv{o.python.empty() ? "python3" : o.python, o.reference_script,
                                "--size", size, "--device", device_arg,
                                "--warmup", std::to_string(std::max(o.warmup, 2)),
                                "--iters", std::to_string(o.iters)};
  if (o.block > 0) {
    argv.emplace_back("--block-size");
    argv.emplace_back(std::to_string(o.block));
  }
  if (o.reference_script.empty() || !std::filesystem::exists(o.reference_script)) {
    auto j = ref_line();
    j["error"] = "reference script not found: '" + o.reference_script + "'";
    emit(j.dump());
    return;
  }
  auto [rc, out] = run_capture(argv);
  int lines = 0;
  std::string other;  // non-JSON output, for the error line
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    auto r = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!r.is_object() || !r.contains("variant")) {
      other += line + "\n";
      continue;
    }
    ++lines;
    auto j = ref_line();
    for (auto& [k, v] : r.items())
      if (k != "samples_ms" && k != "median_ms" && k != "mad_ms" && k != "peak_mem_gib")
        j[k] = v;
    if (r.contains("error") || !r.contains("samples_ms") || r["samples_ms"].empty()) {
      emit(j.dump());
      continue;
    }
    auto t = summarise(r["samples_ms"].get<std::vector<double>>());
    finish_line(j, t, flop, tokens, r.value("peak_mem_gib", 0.0));
    j["tandem_speedup"] = t.median / graphed["median_ms"].get<double>();
    emit(j.dump());
  }
  if (rc != 0 || lines == 0) {
    auto j = ref_line();
    if (other.size() > 4000)
      other = "..." + other.substr(other.size() - 4000);
    j["error"] = "reference exited with status " + std::to_string(rc) + ": " + other;
    j["command"] = argv;
    emit(j.dump());
  }
}

/// Decoding with the KV cache (gpu/decode/), random weights at the size's
/// shapes: per batch (1 and 64 on a GPU), one decode step of every row at a
/// context of `ctx` positions (timed: forward of one token per row, then the
/// rows cropped back), and, at batch 1, one speculative cycle (the drafter's
/// block forward + the target's verification of the block).  The HBM bound
/// (docs/bench.md): bytes a decode step must read, every weight once
/// (embedding rows aside) plus each row's K and V, over 4.8 TB/s.
void bench_target_decode(const bench_options& o, const at::Device& dev, const std::string& size,
                         at::ScalarType dtype, const std::function<void(const std::string&)>& emit) {
  auto s = shapes_for(size, o.block);
  const auto& c = s.target;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
#ifdef TANDEM_HAVE_CUDA
  if (dev.is_cuda())
    gen = at::cuda::detail::createCUDAGenerator(dev.index());
#endif
  gen.set_current_seed(1);
  const layer_dims d{c.hidden_size, c.intermediate_size, c.num_attention_heads,
                     c.num_key_value_heads, c.head_dim, c.rms_norm_eps};
  auto opts = at::TensorOptions().dtype(dtype).device(dev);
  qwen3_weights w;
  w.embed = at::empty({c.vocab_size, c.hidden_size}, opts).normal_(0, 0.02, gen);
  w.lm_head = at::empty({c.vocab_size, c.hidden_size}, opts).normal_(0, 0.02, gen);
  w.final_norm = at::ones({c.hidden_size}, opts);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    w.layers.push_back(random_decoder_layer(d, dtype, dev, gen, 0.02));
  const auto taps = default_tap_ids(c.num_hidden_layers, 5);
  qwen3_target target(c, std::move(w), taps);
  const int64_t ctx = dev.is_cuda() ? 1024 : 128;
  const auto per_layer_weights = 2 * c.hidden_size
                                 + c.hidden_size * (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
                                 + c.num_attention_heads * c.head_dim * c.hidden_size + 2 * c.head_dim
                                 + 3 * c.hidden_size * c.intermediate_size;
  const double weight_bytes = (static_cast<double>(per_layer_weights) * c.num_hidden_layers
                               + static_cast<double>(c.vocab_size) * c.hidden_size + c.hidden_size)
                              * at::elementSize(dtype);
  const double hbm = 4.8e12;
  const auto ids_opts = at::TensorOptions().dtype(at::kLong).device(dev);
  for (int64_t batch : dev.is_cuda() ? std::vector<int64_t>{1, 64} : std::vector<int64_t>{1, 4}) {
    target_decoder td(target, batch, ctx + s.block + 1);
    (void)td.forward(at::randint(c.vocab_size, {batch, ctx}, gen, ids_opts), false);
    for (int64_t r = 0; r < batch; ++r)
      td.set_length(r, ctx);
    auto one = at::randint(c.vocab_size, {batch, 1}, gen, ids_opts);
    reset_peak(dev);
    auto t = time_runs(dev, o.warmup, o.iters, [&] { (void)td.forward(one, false); });
    const double kv_bytes = 2.0 * batch * c.num_hidden_layers * c.num_key_value_heads * c.head_dim
                            * (ctx + 1) * at::elementSize(dtype);
    const double bound_ms = (weight_bytes + kv_bytes) / hbm * 1e3;
    auto j = base_line("target_decode", o, dev, size);
    j["shapes"] = {{"batch", batch}, {"context", ctx}, {"hidden", c.hidden_size},
                   {"layers", c.num_hidden_layers}, {"vocab", c.vocab_size},
                   {"dtype", c10::toString(dtype)}, {"graphed", td.replays() > 0}};
    // TANDEM_DECODE (decoder.hpp): graphs (default), eager (the kernel), sdpa.
    j["decode_mode"] = !dev.is_cuda() ? std::string("sdpa (the CPU: TANDEM_DECODE not read)") : td.mode();
    finish_line(j, t, 2.0 * weight_bytes / at::elementSize(dtype) * batch, static_cast<double>(batch),
                peak_gib(dev));
    j["bytes_read"] = weight_bytes + kv_bytes;
    j["hbm_bound_ms"] = bound_ms;
    j["fraction_of_hbm_bound"] = bound_ms / t.median;
    // TANDEM_DECODE_GEMV=0: the projections on cuBLAS at batch 1 too (A/B);
    // TANDEM_PDL=0: the decode GEMV launched plainly (gpu/kernels/pdl.cuh).
    j["decode_gemv"] = td.gemv();
    j["pdl"] = td.pdl();
    const auto kernels = profile_kernels(dev, o.profile_steps,
                                         o.trace_dir.empty() ? ""
                                                             : o.trace_dir + "/target_decode_" + size + "_b"
                                                                 + std::to_string(batch) + ".json",
                                         [&] { (void)td.forward(one, false); });
    if (!kernels.empty())
      j["kernel_ms"] = kernels;  // per step, profiled after the timed runs
    emit(j.dump());
    if (batch != 1) {
      // Regeneration (`tandem prepare --regenerate`'s decoding): target_generate
      // on `batch` prompts of lengths spread over [ctx/4, ctx/2], greedy, no
      // stop token, max_new new tokens each; one warm-up and 3 timed runs
      // (a run is ~max_new decode steps).
      const int64_t max_new = dev.is_cuda() ? 128 : 16;
      std::vector<std::vector<int64_t>> prompts;
      for (int64_t r = 0; r < batch; ++r) {
        const int64_t len = ctx / 4 + (ctx / 4) * r / std::max<int64_t>(batch - 1, 1);
        auto p = at::randint(c.vocab_size, {len}, gen, ids_opts).cpu();
        prompts.emplace_back(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + len);
      }
      speculative_options so;
      so.max_new_tokens = max_new;
      so.block_size = 1;
      int64_t produced = 0;
      auto tg = time_runs(dev, 1, 3, [&] {
        auto out = target_generate(td, prompts, so, gen);
        produced = 0;
        for (const auto& g : out)
          produced += static_cast<int64_t>(g.tokens.size());
      });
      auto jr = base_line("regenerate", o, dev, size);
      jr["shapes"] = {{"batch", batch}, {"prompt_min", prompts.front().size()},
                      {"prompt_max", prompts.back().size()}, {"max_new_tokens", max_new},
                      {"dtype", c10::toString(dtype)}, {"graphed", td.replays() > 0}};
      jr["decode_mode"] = j["decode_mode"];
      jr["new_tokens"] = produced;
      finish_line(jr, tg, 0.0, static_cast<double>(produced), peak_gib(dev));
      emit(jr.dump());
      continue;
    }
    // One speculative cycle at batch 1: drafter block forward + verification.
    dflash_config dc;
    dc.layer = c;
    dc.layer.num_hidden_layers = s.draft_layers;
    dc.block_size = s.block;
    dc.num_target_layers = c.num_hidden_layers;
    dc.mask_token_id = c.vocab_size - 1;
    dc.target_layer_ids = taps;
    dflash_weights dw;
    dw.fc = at::empty({c.hidden_size, static_cast<int64_t>(taps.size()) * c.hidden_size}, opts).normal_(0, 0.02, gen);
    dw.hidden_norm = at::ones({c.hidden_size}, opts);
    dw.norm = at::ones({c.hidden_size}, opts);
    for (int64_t i = 0; i < s.draft_layers; ++i)
      dw.layers.push_back(random_decoder_layer(d, dtype, dev, gen, 0.02));
    drafter_decoder dd(dc, dw, target.embedding(), target.lm_head(), 1, ctx + s.block + 1);
    auto ctx_taps = at::empty({1, ctx, static_cast<int64_t>(taps.size()) * c.hidden_size}, opts).normal_(0, 1, gen);
    dd.extend_context(ctx_taps, {ctx});
    auto block = at::randint(c.vocab_size, {1, s.block}, gen, ids_opts);
    auto cycle = [&] {
      auto drafts = dd.draft(block).argmax(-1);
      (void)td.forward(at::cat({block.narrow(1, 0, 1), drafts}, 1), true);
    };
    auto tc = time_runs(dev, o.warmup, o.iters, cycle);
    const auto cycle_kernels = profile_kernels(
      dev, o.profile_steps, o.trace_dir.empty() ? "" : o.trace_dir + "/speculative_cycle_" + size + ".json", cycle);
    auto jc = base_line("speculative_cycle", o, dev, size);
    jc["shapes"] = {{"batch", 1}, {"context", ctx}, {"block", s.block}, {"draft_layers", s.draft_layers},
                    {"dtype", c10::toString(dtype)}, {"graphed", td.replays() > 0}};  // the target's verify; the drafter is eager
    jc["decode_mode"] = j["decode_mode"];
    finish_line(jc, tc, 0.0, static_cast<double>(s.block), peak_gib(dev));
    if (!cycle_kernels.empty())
      jc["kernel_ms"] = cycle_kernels;
    emit(jc.dump());
  }
}

} // namespace

std::vector<std::string> bench_case_names() {
  return {"target_forward", "drafter_step_eager", "drafter_step", "dflash_attention",
          "prefetch_pack", "target_decode"};
}

void run_bench(const bench_options& o, const std::function<void(const std::string&)>& emit) {
  at::NoGradGuard no_grad_outside;  // the drafter case turns grad on itself
  int32_t index = o.device;
  if (index == -2)
    index = torch::cuda::is_available() ? 0 : -1;
  const at::Device dev = index < 0 ? at::Device(at::kCPU) : at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
  if (dev.is_cuda() && index >= static_cast<int32_t>(torch::cuda::device_count()))
    throw error(errc::device_unavailable, "--device cuda:" + std::to_string(index) + ": this host has "
                                            + std::to_string(torch::cuda::device_count()) + " CUDA device(s)"
                                            + (torch::cuda::device_count() == 0 ? " (use --device cpu)" : ""));
  const auto size = o.size == "auto" ? (dev.is_cuda() ? "8b" : "tiny") : o.size;
  (void)shapes_for(size, o.block);  // validates
  const auto dtype = dev.is_cuda() ? at::kBFloat16 : at::kFloat;
  auto cases = o.cases.empty() ? bench_case_names() : o.cases;
  for (const auto& c : cases) {
    auto known = bench_case_names();
    if (std::find(known.begin(), known.end(), c) == known.end())
      throw error(errc::bad_input, "unknown bench case '" + c + "'");
  }
#ifdef TANDEM_HAVE_CUDA
  std::optional<c10::cuda::CUDAGuard> guard;
  if (dev.is_cuda())
    guard.emplace(dev.index());
#endif
  for (const auto& c : cases) {
    nlohmann::json j;
    if (c == "prefetch_pack") {
      // The packer runs on the CPU (pinned staging when CUDA is present);
      // rows × seq_len of the drafter's bucket at this size.
      const auto s = shapes_for(size);
      j = nlohmann::json::parse(data::bench_prefetch_json(o.dataset, 1, s.seq, o.seconds));
      j["git_commit"] = o.git_commit;
      j["device"] = "cpu (1 thread)";
      j["size"] = size;
      j["dataset"] = o.dataset.empty() ? "synthetic" : o.dataset;
    } else if (c == "target_forward") {
      bench_target_forward(o, dev, size, dtype, emit);  // emits its own lines
    } else if (c == "drafter_step") {
      bench_drafter_engine_step(o, dev, size, dtype, emit);  // emits its own lines
    } else if (c == "target_decode") {
      bench_target_decode(o, dev, size, dtype, emit);  // emits its own lines
    } else if (c == "dflash_attention") {
      at::AutoGradMode grad(true);
      j = bench_dflash_attention(o, dev, size, dtype);
    } else {
      at::AutoGradMode grad(true);
      j = bench_drafter_step(o, dev, size, dtype);
    }
    if (!j.is_null())
      emit(j.dump());
#ifdef TANDEM_HAVE_CUDA
    if (dev.is_cuda())
      c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  }
}

} // namespace tandem::gpu
