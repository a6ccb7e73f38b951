#include "gpu/decode/eval.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <optional>

#include <nlohmann/json.hpp>

#include "gpu/decode/speculative.hpp"
#include "gpu/device/error.hpp"
#include "gpu/engine/checkpoint.hpp"
#include "gpu/engine/checkpoint_io.hpp"
#include "gpu/engine/engine_common.hpp"
#include "gpu/io/hf_config.hpp"
#include "gpu/io/safetensors.hpp"

namespace tandem::gpu {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

[[noreturn]] void fail(const std::string& what) {
  throw error(errc::bad_input, what);
}

json read_json(const fs::path& file) {
  std::ifstream f(file);
  if (!f)
    fail("cannot read " + file.string());
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    fail(file.string() + " is not JSON: " + e.what());
  }
}

/// A checkpoint folder's location: its step and the target it recorded.
drafter_location checkpoint_location(const fs::path& dir) {
  const auto s = read_json(dir / "state.json");
  drafter_location loc{"checkpoint", dir, {}, -1};
  if (s.contains("step") && s["step"].is_number_integer())
    loc.step = s["step"].get<int64_t>();
  if (s.contains("options") && s["options"].is_object() && s["options"].contains("target_dir")
      && s["options"]["target_dir"].is_string())
    loc.target_dir = s["options"]["target_dir"].get<std::string>();
  return loc;
}

int64_t shape_field(const json& d, const char* name, const std::string& where) {
  if (!d.contains(name) || !d[name].is_number_integer())
    fail(where + ": field 'drafter." + std::string(name) + "' is missing or not an integer");
  return d[name].get<int64_t>();
}

/// Says what differs between the drafter and the target, or nothing.
void check_fits(const dflash_config& c, const qwen3_config& t, const std::string& drafter,
                const fs::path& target_dir) {
  auto differ = [&](const std::string& what, int64_t mine, int64_t theirs) {
    if (mine != theirs)
      fail("the drafter " + drafter + " was trained against a target with " + what + " "
           + std::to_string(mine) + ", but " + (target_dir / "config.json").string() + " has "
           + std::to_string(theirs) + " (pass the target it was trained against)");
  };
  differ("hidden_size", c.layer.hidden_size, t.hidden_size);
  differ("num_hidden_layers", c.num_target_layers, t.num_hidden_layers);
  differ("vocab_size", c.layer.vocab_size, t.vocab_size);
  for (auto id : c.target_layer_ids)
    if (id < 0 || id >= t.num_hidden_layers)
      fail("the drafter " + drafter + " taps target layer " + std::to_string(id) + ", outside "
           + (target_dir / "config.json").string() + "'s " + std::to_string(t.num_hidden_layers)
           + " layers");
}

/// A checkpoint's (or snapshot's) drafter: its shape from `state`
/// (state.json's "drafter"), its weights by name, on `device` in `dtype`,
/// checked against the target.  `where` names the source in errors.
std::pair<dflash_config, dflash_weights> drafter_from_state(const json& state,
                                                            const std::vector<std::string>& names,
                                                            const std::vector<at::Tensor>& weights,
                                                            const std::string& where,
                                                            const qwen3_config& target,
                                                            const fs::path& target_dir, at::Device device,
                                                            at::ScalarType dtype) {
  if (!state.contains("drafter") || !state["drafter"].is_object())
    fail(where + ": field 'drafter' is missing or not an object");
  const auto& d = state["drafter"];
  dflash_config cfg;
  cfg.layer = target;  // the drafter's layers take the target's shape and RoPE (drafter_engine)
  cfg.layer.num_hidden_layers = shape_field(d, "num_hidden_layers", where);
  cfg.layer.hidden_size = shape_field(d, "hidden_size", where);
  cfg.layer.intermediate_size = shape_field(d, "intermediate_size", where);
  cfg.layer.num_attention_heads = shape_field(d, "num_attention_heads", where);
  cfg.layer.num_key_value_heads = shape_field(d, "num_key_value_heads", where);
  cfg.layer.head_dim = shape_field(d, "head_dim", where);
  cfg.layer.vocab_size = shape_field(d, "vocab_size", where);
  cfg.block_size = shape_field(d, "block_size", where);
  cfg.num_target_layers = shape_field(d, "num_target_layers", where);
  cfg.mask_token_id = shape_field(d, "mask_token_id", where);
  if (!d.contains("target_layer_ids") || !d["target_layer_ids"].is_array())
    fail(where + ": field 'drafter.target_layer_ids' is missing or not an array");
  cfg.target_layer_ids = d["target_layer_ids"].get<std::vector<int64_t>>();
  check_fits(cfg, target, where, target_dir);
  std::map<std::string, at::Tensor> tensors;
  for (size_t i = 0; i < names.size() && i < weights.size(); ++i)
    tensors[names[i]] = weights[i];
  auto w = dflash_weights_from(tensors, cfg, dtype, where);
  for (auto& [name, p] : dflash_parameters(w))
    *p = p->to(device);
  return {std::move(cfg), std::move(w)};
}

/// The drafter's config and weights (on `device`, in `dtype`), checked against the target.
std::pair<dflash_config, dflash_weights> load_drafter(const drafter_location& loc,
                                                      const qwen3_config& target,
                                                      const fs::path& target_dir,
                                                      at::Device device, at::ScalarType dtype) {
  if (loc.kind == "export") {
    auto [cfg, w] = load_dflash(loc.dir, device, dtype);
    check_fits(cfg, target, loc.dir.string(), target_dir);
    return {std::move(cfg), std::move(w)};
  }
  const auto ck = read_checkpoint(loc.dir);
  return drafter_from_state(ck.state, ck.names, ck.weights, (loc.dir / "state.json").string(), target,
                            target_dir, device, dtype);
}

fs::path resolve_target(const fs::path& given, const drafter_location& loc, const char* who) {
  if (!given.empty())
    return given;
  if (!loc.target_dir.empty())
    return loc.target_dir;
  fail(std::string(who) + ": " + loc.dir.string()
       + " is an export, which does not record its target: pass --target DIR");
}

/// A drafter of `cfg`'s shape as the drafter engine initialises one
/// (normal 0.02, norms 1): the untrained reference.
dflash_weights untrained_weights(const dflash_config& cfg, at::Device device, at::ScalarType dtype,
                                 uint64_t seed) {
  auto g = detail::private_generator(at::kCPU, seed);
  const auto& l = cfg.layer;
  const auto d = l.hidden_size;
  const auto taps = static_cast<int64_t>(cfg.target_layer_ids.size());
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  dflash_weights w;
  w.fc = at::empty({d, taps * d}, f32).normal_(0.0, 0.02, g);
  w.hidden_norm = at::ones({d}, f32);
  w.norm = at::ones({d}, f32);
  const layer_dims dims{d, l.intermediate_size, l.num_attention_heads, l.num_key_value_heads,
                        l.head_dim, l.rms_norm_eps};
  for (int64_t i = 0; i < l.num_hidden_layers; ++i)
    w.layers.push_back(random_decoder_layer(dims, at::kFloat, at::kCPU, g, 0.02));
  for (auto& [name, p] : dflash_parameters(w))
    *p = p->to(device, dtype);
  return w;
}

/// τ (mean over cycles) and decode tokens/s of `drafter` (null: prompt
/// lookup) over every prompt.
std::pair<double, double> reference_tau(target_decoder& td, drafter_decoder* dd,
                                        const std::vector<std::vector<int64_t>>& prompts,
                                        const speculative_options& so, at::Generator& gen) {
  int64_t produced = 0, cycles = 0, decoded = 0;
  double seconds = 0;
  for (const auto& p : prompts) {
    auto g = speculative_generate(td, dd, p, so, gen);
    for (auto k : g.produced)
      produced += k;
    cycles += static_cast<int64_t>(g.produced.size());
    decoded += static_cast<int64_t>(g.tokens.size()) - 1;
    seconds += g.decode_s;
  }
  return {cycles ? static_cast<double>(produced) / static_cast<double>(cycles) : 0.0,
          seconds > 0 ? static_cast<double>(decoded) / seconds : 0.0};
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

/// The report's speculative figures, prompt by prompt (run_eval and
/// eval_engine alike: the dflash package's definitions).
struct report_builder {
  std::vector<double> spec_tpot, taus;
  double spec_time = 0;
  int64_t spec_decoded = 0;

  /// Prompt p's speculative generation `g`: into p and the report's histogram and counts.
  void add(eval_report& r, eval_prompt& p, const generation& g) {
    p.tokens = g.tokens;
    p.produced = g.produced;
    p.prefill_s = g.prefill_s;
    p.decode_s = g.decode_s;
    if (!g.produced.empty()) {
      p.tau = std::accumulate(g.produced.begin(), g.produced.end(), 0.0)
              / static_cast<double>(g.produced.size());
      taus.push_back(p.tau);
    }
    for (auto k : g.produced)
      ++r.histogram.at(static_cast<size_t>(k));
    r.cycles += static_cast<int64_t>(g.produced.size());
    r.new_tokens += static_cast<int64_t>(g.tokens.size());
    spec_tpot.push_back(g.decode_s / static_cast<double>(g.tokens.size()));
    spec_time += g.decode_s;
    spec_decoded += static_cast<int64_t>(g.tokens.size()) - 1;
  }

  /// τ (over cycles and over prompts) and the decode rate.
  void finish(eval_report& r) const {
    int64_t produced_sum = 0;
    for (size_t k = 0; k < r.histogram.size(); ++k)
      produced_sum += static_cast<int64_t>(k) * r.histogram[k];
    r.tau = r.cycles ? static_cast<double>(produced_sum) / static_cast<double>(r.cycles) : 0.0;
    r.tau_prompt_mean = mean(taus);
    r.spec_tokens_per_s = spec_time > 0 ? static_cast<double>(spec_decoded) / spec_time : 0.0;
  }
};

/// Prompt `i` is non-empty, inside the vocabulary, and with max_new_tokens
/// inside the target's context (max_position_embeddings): a decode past it
/// would read RoPE positions the target never saw, and a huge max_new_tokens
/// would size the caches past any memory.
void check_prompt(size_t i, const std::vector<int64_t>& prompt, const qwen3_config& target,
                  int64_t max_new_tokens, const char* who) {
  if (prompt.empty())
    fail(std::string(who) + ": prompt " + std::to_string(i) + " is empty");
  for (auto id : prompt)
    if (id < 0 || id >= target.vocab_size)
      fail(std::string(who) + ": prompt " + std::to_string(i) + " holds token " + std::to_string(id)
           + ", outside the target's vocabulary of " + std::to_string(target.vocab_size));
  const int64_t context = target.max_position_embeddings;
  const auto len = static_cast<int64_t>(prompt.size());
  if (context > 0 && (len > context || max_new_tokens > context - len))
    fail(std::string(who) + ": prompt " + std::to_string(i) + " has " + std::to_string(len)
         + " tokens; with max_new_tokens " + std::to_string(max_new_tokens)
         + " it would run past the target's context (max_position_embeddings = " + std::to_string(context)
         + "): lower --max-new-tokens (at most " + std::to_string(std::max<int64_t>(0, context - len))
         + " for this prompt) or leave the prompt out");
}

/// Every prompt passes check_prompt; returns the longest's length.
size_t check_prompts(const std::vector<std::vector<int64_t>>& prompts, const qwen3_config& target,
                     int64_t max_new_tokens, const char* who) {
  if (prompts.empty())
    fail(std::string(who) + ": no prompts");
  size_t longest = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    check_prompt(i, prompts[i], target, max_new_tokens, who);
    longest = std::max(longest, prompts[i].size());
  }
  return longest;
}

} // namespace

void check_sampling(double temperature, double top_p, int64_t top_k, const char* who) {
  if (!std::isfinite(temperature) || temperature < 0)
    fail(std::string(who) + ": temperature must be a finite number >= 0 (0: greedy), got "
         + std::to_string(temperature));
  if (!(top_p > 0 && top_p <= 1))
    fail(std::string(who) + ": top_p must be in (0, 1] (1: off), got " + std::to_string(top_p));
  if (top_k < 0)
    fail(std::string(who) + ": top_k must be >= 0 (0: off), got " + std::to_string(top_k));
}

drafter_location locate_drafter(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec))
    fail("drafter " + path.string() + " is not a folder (an export, a checkpoint or a run folder)");
  if (fs::exists(path / "state.json", ec))
    return checkpoint_location(path);
  if (fs::exists(path / "config.json", ec)) {
    load_dflash_config(path);  // throws, naming the field, when it is no DFlash drafter
    return {"export", path, {}, -1};
  }
  const auto root = path / "checkpoints";
  if (fs::is_directory(root, ec)) {
    std::string skipped;
    // A checkpoint that vanished while it was verified was rotated away by
    // the run training there: its newer ones are listed again.
    for (int attempt = 1; attempt <= 3; ++attempt) {
      skipped.clear();
      bool vanished = false;
      for (const auto& dir : list_checkpoints(root)) {
        try {
          verify_checkpoint(dir);
          auto loc = checkpoint_location(dir);
          loc.skipped = skipped.empty() ? skipped : skipped.substr(2);  // without the leading "; "
          return loc;
        } catch (const error& e) {
          if (!fs::exists(dir, ec)) {
            vanished = true;
            continue;
          }
          skipped += std::string("; skipped ") + e.what();
        }
      }
      if (!vanished)
        break;
    }
    fail("run folder " + path.string() + " has no complete checkpoint under " + root.string()
         + skipped);
  }
  fail("drafter " + path.string() + " is neither an export (config.json), a checkpoint "
       "(state.json) nor a run folder (checkpoints/)");
}

/// The drafter at `path` (locate_drafter), loaded with its target.  A run
/// folder's newest checkpoint that the run still training there rotates
/// away between the lookup and the load is looked up again (a few times).
struct located_drafter {
  drafter_location loc;
  fs::path target_dir;
  qwen3_config target;
  dflash_config cfg;
  dflash_weights w;
};
located_drafter locate_and_load(const fs::path& path, const fs::path& given_target, at::Device device,
                                at::ScalarType dtype, const char* who) {
  for (int attempt = 1;; ++attempt) {
    located_drafter d;
    d.loc = locate_drafter(path);
    d.target_dir = resolve_target(given_target, d.loc, who);
    d.target = load_qwen3_config(d.target_dir);
    try {
      std::tie(d.cfg, d.w) = load_drafter(d.loc, d.target, d.target_dir, device, dtype);
      return d;
    } catch (const error&) {
      std::error_code ec;
      const bool rotated = d.loc.dir != path && !fs::exists(d.loc.dir, ec);
      if (!rotated || attempt == 3)
        throw;
      std::fprintf(stderr, "%s: %s was removed while it was read (the run training there keeps its newest "
                           "checkpoints): taking the newest again\n",
                   who, d.loc.dir.c_str());
    }
  }
}

eval_report run_eval(const eval_options& o, const std::function<void(size_t, size_t)>& progress) {
  const auto device = detail::engine_device(o.device, "tandem eval");
  const auto dtype = detail::engine_dtype(o.dtype, device, "tandem eval");
  detail::device_scope scope(device);
  if (o.max_new_tokens < 1)
    fail("tandem eval: --max-new-tokens must be at least 1");
  check_sampling(o.temperature, o.top_p, o.top_k, "tandem eval");
  auto located = locate_and_load(o.drafter, o.target_dir, device, dtype, "tandem eval");
  const auto& loc = located.loc;
  const auto& target_dir = located.target_dir;
  const auto& tcfg = located.target;
  auto& cfg = located.cfg;
  auto& w = located.w;
  const auto target = qwen3_target::load(target_dir, device, dtype, cfg.target_layer_ids, true);
  const auto bs = o.block_size > 0 ? o.block_size : cfg.block_size;
  if (bs > cfg.block_size)
    fail("tandem eval: block size " + std::to_string(bs) + " exceeds the drafter's "
         + std::to_string(cfg.block_size));
  if (bs < 2)
    fail("tandem eval: block size " + std::to_string(bs) + ": a draft block is the last token and at least "
         "one masked position (2 or more; the target alone is the baseline)");
  const auto longest = check_prompts(o.prompts, tcfg, o.max_new_tokens, "tandem eval");
  const auto capacity = static_cast<int64_t>(longest) + o.max_new_tokens + 1;
  target_decoder td(target, 1, capacity);
  drafter_decoder dd(cfg, w, target.embedding(), target.lm_head(), 1, capacity);
  auto gen = detail::private_generator(device, o.seed);

  speculative_options so;
  so.max_new_tokens = o.max_new_tokens;
  so.stop_ids = o.stop_ids;
  so.sampling = {o.temperature, o.top_p, o.top_k};
  so.block_size = bs;
  so.bug = planted_bug_from_env();
  auto base_opts = so;
  base_opts.block_size = 1;

  eval_report r;
  r.target = target_dir.string();
  r.drafter = loc.dir.string();
  r.drafter_kind = loc.kind;
  r.drafter_step = loc.step;
  r.device = device.str();
  r.dtype = detail::dtype_name(dtype);
  r.block_size = bs;
  r.max_new_tokens = o.max_new_tokens;
  r.temperature = o.temperature;
  r.top_p = o.top_p;
  r.top_k = o.top_k;
  r.histogram.assign(bs + 1, 0);
  // bfloat16 logits of a block and of one token differ by rounding; a gap
  // this small may flip the argmax (tolerances: docs/bench.md).  float32: none.
  r.near_tie_margin = dtype == at::kFloat ? 0.0 : 0.25;
  report_builder built;
  std::vector<double> base_tpot;
  double base_time = 0;
  int64_t base_decoded = 0;
  for (size_t i = 0; i < o.prompts.size(); ++i) {
    eval_prompt p;
    p.prompt_tokens = static_cast<int64_t>(o.prompts[i].size());
    auto g = speculative_generate(td, &dd, o.prompts[i], so, gen);
    built.add(r, p, g);
    if (o.baseline) {
      auto b = speculative_generate(td, nullptr, o.prompts[i], base_opts, gen);
      p.baseline_decode_s = b.decode_s;
      p.baseline_tokens = static_cast<int64_t>(b.tokens.size());
      base_tpot.push_back(b.decode_s / static_cast<double>(b.tokens.size()));
      base_time += b.decode_s;
      base_decoded += static_cast<int64_t>(b.tokens.size()) - 1;
      if (o.temperature <= 0) {
        const auto n = std::min(b.tokens.size(), g.tokens.size());
        for (size_t k = 0; k < n && p.first_difference < 0; ++k)
          if (b.tokens[k] != g.tokens[k])
            p.first_difference = static_cast<int64_t>(k);
        if (p.first_difference < 0 && b.tokens.size() != g.tokens.size())
          p.first_difference = static_cast<int64_t>(n);
        r.differing_prompts += p.first_difference >= 0;
        if (p.first_difference >= 0 && static_cast<size_t>(p.first_difference) < n) {
          // The target's own view of that position, one prefill: how close
          // the two tokens were.
          auto seq = o.prompts[i];
          seq.insert(seq.end(), b.tokens.begin(), b.tokens.begin() + p.first_difference);
          td.reset();
          const auto len = static_cast<int64_t>(seq.size());
          auto out = td.forward(at::tensor(seq, at::TensorOptions().dtype(at::kLong)).to(device).unsqueeze(0),
                                false, at::full({1}, len - 1, at::TensorOptions().dtype(at::kLong).device(device)));
          auto logits = out.logits[0][0];
          p.difference_margin = std::abs(logits[b.tokens[p.first_difference]].item<double>()
                                         - logits[g.tokens[p.first_difference]].item<double>());
          r.near_tie_differences += p.difference_margin <= r.near_tie_margin;
        }
      }
    }
    r.prompts.push_back(std::move(p));
    if (progress)
      progress(i + 1, o.prompts.size());
  }
  built.finish(r);
  r.baseline_tokens_per_s = base_time > 0 ? static_cast<double>(base_decoded) / base_time : 0.0;
  r.baseline = o.baseline;
  if (o.baseline && mean(built.spec_tpot) > 0)
    r.speedup = mean(base_tpot) / mean(built.spec_tpot);
  if (o.reference_drafters) {
    const auto untrained = untrained_weights(cfg, device, dtype, o.seed + 1);
    drafter_decoder ud(cfg, untrained, target.embedding(), target.lm_head(), 1, capacity);
    auto ref = so;
    ref.bug = planted_bug::none;
    std::tie(r.untrained_tau, r.untrained_tokens_per_s) = reference_tau(td, &ud, o.prompts, ref, gen);
    ref.lookup_ngram = o.lookup_ngram;
    std::tie(r.lookup_tau, r.lookup_tokens_per_s) = reference_tau(td, nullptr, o.prompts, ref, gen);
    r.lookup_ngram = o.lookup_ngram;
  }
  return r;
}

struct eval_engine::impl {
  eval_engine_options o;
  at::Device device{at::kCPU};
  at::ScalarType dtype = at::kFloat;
  qwen3_config tcfg;
  int64_t capacity = 0;
  std::optional<qwen3_target> target;
  std::vector<int64_t> taps;  ///< the target's, as loaded
  dflash_config cfg;
  dflash_weights w;
  std::unique_ptr<target_decoder> td;
  std::unique_ptr<drafter_decoder> dd;
  std::optional<at::Generator> gen;
  speculative_options so;
  eval_report r;
  report_builder built;
  size_t next_prompt = 0;
};

eval_engine::eval_engine(eval_engine_options o) : impl_(std::make_unique<impl>()) {
  auto& m = *impl_;
  m.device = detail::engine_device(o.device, "eval");
  m.dtype = detail::engine_dtype(o.dtype, m.device, "eval");
  if (o.max_new_tokens < 1)
    fail("eval: max_new_tokens must be at least 1");
  check_sampling(o.temperature, o.top_p, o.top_k, "eval");
  m.tcfg = load_qwen3_config(o.target_dir);
  const auto longest = check_prompts(o.prompts, m.tcfg, o.max_new_tokens, "eval");
  m.capacity = static_cast<int64_t>(longest) + o.max_new_tokens + 1;
  m.so.max_new_tokens = o.max_new_tokens;
  m.so.stop_ids = o.stop_ids;
  m.so.sampling = {o.temperature, o.top_p, o.top_k};
  m.o = std::move(o);
}

eval_engine::~eval_engine() = default;

void eval_engine::begin(transport::handle snap) {
  auto& m = *impl_;
  detail::device_scope scope(m.device);
  const auto s = read_snapshot_weights(snap);
  const auto where = "the drafter snapshot of step " + std::to_string(s.step);
  m.dd.reset();
  std::tie(m.cfg, m.w) = drafter_from_state(s.state, s.names, s.weights, where, m.tcfg, m.o.target_dir,
                                            m.device, m.dtype);
  for (auto& [name, p] : dflash_parameters(m.w))
    if (p->device() == s.weights.front().device())
      *p = p->clone();  // never a view of the snapshot, which its owner releases
  if (!m.target || m.taps != m.cfg.target_layer_ids) {
    m.td.reset();
    m.target.reset();
    m.target.emplace(qwen3_target::load(m.o.target_dir, m.device, m.dtype, m.cfg.target_layer_ids, true));
    m.taps = m.cfg.target_layer_ids;
    // SDPA, no graphs: inside a training run a captured decode graph on a
    // GPU the training shares was seen to fail the target actor once
    // ("invalid argument", H200, 12-epoch default): not understood yet.
    m.td = std::make_unique<target_decoder>(*m.target, 1, m.capacity, "sdpa");
    m.gen.emplace(detail::private_generator(m.device, m.o.seed));
  }
  m.dd = std::make_unique<drafter_decoder>(m.cfg, m.w, m.target->embedding(), m.target->lm_head(), 1, m.capacity);
  m.so.block_size = m.cfg.block_size;
  m.r = eval_report{};
  m.r.target = m.o.target_dir.string();
  m.r.drafter = where;
  m.r.drafter_kind = "snapshot";
  m.r.drafter_step = s.step;
  m.r.device = m.device.str();
  m.r.dtype = detail::dtype_name(m.dtype);
  m.r.block_size = m.cfg.block_size;
  m.r.max_new_tokens = m.o.max_new_tokens;
  m.r.temperature = m.o.temperature;
  m.r.top_p = m.o.top_p;
  m.r.top_k = m.o.top_k;
  m.r.histogram.assign(static_cast<size_t>(m.cfg.block_size) + 1, 0);
  m.built = report_builder{};
  m.next_prompt = 0;
}

bool eval_engine::next() {
  auto& m = *impl_;
  if (!m.dd)
    fail("eval: next() before begin()");
  if (m.next_prompt >= m.o.prompts.size())
    return false;
  detail::device_scope scope(m.device);
  const auto& prompt = m.o.prompts[m.next_prompt++];
  eval_prompt p;
  p.prompt_tokens = static_cast<int64_t>(prompt.size());
  const auto g = speculative_generate(*m.td, m.dd.get(), prompt, m.so, *m.gen);
  m.built.add(m.r, p, g);
  m.r.prompts.push_back(std::move(p));
  m.built.finish(m.r);
  return m.next_prompt < m.o.prompts.size();
}

size_t eval_engine::done() const { return impl_->next_prompt; }
size_t eval_engine::total() const { return impl_->o.prompts.size(); }
eval_report eval_engine::report() const { return impl_->r; }

std::string eval_json(const eval_report& r) {
  json j{{"schema", "tandem.eval.v1"},
         {"target", r.target},
         {"drafter", r.drafter},
         {"drafter_kind", r.drafter_kind},
         {"drafter_step", r.drafter_step},
         {"device", r.device},
         {"dtype", r.dtype},
         {"block_size", r.block_size},
         {"max_new_tokens", r.max_new_tokens},
         {"temperature", r.temperature},
         {"top_p", r.top_p},
         {"top_k", r.top_k},
         {"num_prompts", r.prompts.size()},
         {"histogram", r.histogram},
         {"cycles", r.cycles},
         {"new_tokens", r.new_tokens}};
  // What was not measured is null, never 0: τ needs a cycle (the first token
  // comes from the prefill), the speedup and the lossless check the baseline
  // (and greedy decoding, for the check), rates some decoding time.
  const bool cycles = r.cycles > 0, greedy = r.temperature == 0;
  j["tau"] = cycles ? json(r.tau) : json(nullptr);
  j["tau_prompt_mean"] = cycles ? json(r.tau_prompt_mean) : json(nullptr);
  j["spec_tokens_per_s"] = r.spec_tokens_per_s > 0 ? json(r.spec_tokens_per_s) : json(nullptr);
  j["baseline_tokens_per_s"] = r.baseline && r.baseline_tokens_per_s > 0 ? json(r.baseline_tokens_per_s) : json(nullptr);
  j["speedup"] = r.baseline && cycles && r.speedup > 0 ? json(r.speedup) : json(nullptr);
  j["differing_prompts"] = r.baseline && greedy ? json(r.differing_prompts) : json(nullptr);
  j["near_tie_differences"] = r.baseline && greedy ? json(r.near_tie_differences) : json(nullptr);
  j["near_tie_margin"] = r.near_tie_margin;
  if (r.lookup_tau >= 0)
    j["references"] = {{"untrained_tau", r.untrained_tau},
                       {"untrained_tokens_per_s", r.untrained_tokens_per_s},
                       {"lookup_tau", r.lookup_tau},
                       {"lookup_ngram", r.lookup_ngram},
                       {"lookup_tokens_per_s", r.lookup_tokens_per_s}};
  auto& prompts = j["prompts"] = json::array();
  for (const auto& p : r.prompts)
    prompts.push_back({{"prompt_tokens", p.prompt_tokens},
                       {"tokens", p.tokens},
                       {"acceptance_lengths", p.produced},
                       {"tau", p.tau},
                       {"prefill_s", p.prefill_s},
                       {"decode_s", p.decode_s},
                       {"baseline_decode_s", p.baseline_decode_s},
                       {"baseline_tokens", p.baseline_tokens},
                       {"first_difference", p.first_difference},
                       {"difference_margin", p.difference_margin}});
  return j.dump();
}

double generate(const generate_options& o,
                const std::function<void(size_t, const std::vector<int64_t>&, bool)>& done,
                const std::function<bool(size_t)>& skip) {
  const auto device = detail::engine_device(o.device, "generate");
  const auto dtype = detail::engine_dtype(o.dtype, device, "generate");
  detail::device_scope scope(device);
  if (o.batch < 1 || o.max_new_tokens < 1)
    fail("generate: batch and max_new_tokens must be at least 1");
  check_sampling(o.temperature, o.top_p, o.top_k, "generate");
  const auto target = qwen3_target::load(o.target_dir, device, dtype, {}, true);
  std::vector<size_t> order;
  int64_t longest = 0;
  for (size_t i = 0; i < o.prompts.size(); ++i) {
    if (skip && skip(i))
      continue;
    check_prompt(i, o.prompts[i], target.config(), o.max_new_tokens, "generate");
    order.push_back(i);
    longest = std::max<int64_t>(longest, static_cast<int64_t>(o.prompts[i].size()));
  }
  if (order.empty())
    return 0.0;
  // Similar lengths together: less padding in the prefill, rows end closer together.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return o.prompts[a].size() < o.prompts[b].size();
  });
  const auto batch = std::min<int64_t>(o.batch, static_cast<int64_t>(order.size()));
  target_decoder td(target, batch, longest + o.max_new_tokens);
  auto gen = detail::private_generator(device, o.seed);
  speculative_options so;
  so.max_new_tokens = o.max_new_tokens;
  so.stop_ids = o.stop_ids;
  so.sampling = {o.temperature, o.top_p, o.top_k};
  double seconds = 0;
  for (size_t at = 0; at < order.size(); at += batch) {
    std::vector<std::vector<int64_t>> prompts;
    for (size_t k = at; k < std::min(order.size(), at + batch); ++k)
      prompts.push_back(o.prompts[order[k]]);
    auto out = target_generate(td, prompts, so, gen);
    seconds += out.front().prefill_s + out.front().decode_s;
    for (size_t k = 0; k < out.size(); ++k) {
      const auto& t = out[k].tokens;
      const bool stopped = std::find(o.stop_ids.begin(), o.stop_ids.end(), t.back()) != o.stop_ids.end();
      done(order[at + k], t, !stopped);
    }
  }
  return seconds;
}

export_result export_drafter(const export_options& o) {
  if (o.out.empty())
    fail("tandem export: --out DIR is required");
  at::ScalarType dt;
  if (o.dtype == "bfloat16")
    dt = at::kBFloat16;
  else if (o.dtype == "float16")
    dt = at::kHalf;
  else if (o.dtype == "float32")
    dt = at::kFloat;
  else
    fail("tandem export: --dtype '" + o.dtype + "' is not one of bfloat16, float16, float32");
  auto located = locate_and_load(o.source, o.target, at::kCPU, at::kFloat, "tandem export");
  const auto& loc = located.loc;
  const auto& target_dir = located.target_dir;
  const auto& cfg = located.cfg;
  auto& w = located.w;
  export_dflash(o.out, cfg, w, dt);
  export_result r;
  r.from = loc;
  r.target_dir = target_dir;
  for (auto& [name, p] : dflash_parameters(w))
    r.parameters += p->numel();
  r.block_size = cfg.block_size;
  r.layers = cfg.layer.num_hidden_layers;
  r.target_layer_ids = cfg.target_layer_ids;
  r.mask_token_id = cfg.mask_token_id;
  return r;
}

} // namespace tandem::gpu
