#include "gpu/pch.hpp"

#include "gpu/io/hf_config.hpp"
#include "gpu/io/model_tokens.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "gpu/device/error.hpp"

namespace tandem::gpu {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

/// A parsed config.json and the name to blame in errors.
struct config_file {
  fs::path file;
  json root;

  [[noreturn]] void fail(const std::string& what) const {
    throw error(errc::bad_input, file.string() + ": " + what);
  }

  const json* find(const std::string& key) const {
    auto it = root.find(key);
    return it == root.end() || it->is_null() ? nullptr : &*it;
  }
};

config_file read_config(const fs::path& path) {
  std::error_code ec;
  config_file c;
  c.file = fs::is_directory(path, ec) ? path / "config.json" : path;
  std::ifstream in(c.file, std::ios::binary);
  if (!in) {
    if (!fs::exists(c.file, ec))
      c.fail("no such file");
    c.fail(std::string("cannot open: ") + std::strerror(errno));
  }
  std::stringstream text;
  text << in.rdbuf();
  try {
    c.root = json::parse(text.str());
  } catch (const json::exception& ex) {
    c.fail(std::string("not valid JSON: ") + ex.what());
  }
  if (!c.root.is_object())
    c.fail("must be a JSON object");
  return c;
}

/// `field` names the value in messages ("dflash_config.mask_token_id").
int64_t as_int(const config_file& c, const std::string& field, const json& v) {
  if (!v.is_number_integer())
    c.fail("field '" + field + "' must be an integer, got " + v.dump());
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
    c.fail("field '" + field + "' is out of range: " + v.dump());
  return v.get<int64_t>();
}

double as_double(const config_file& c, const std::string& field, const json& v) {
  if (!v.is_number())
    c.fail("field '" + field + "' must be a number, got " + v.dump());
  return v.get<double>();
}

bool as_bool(const config_file& c, const std::string& field, const json& v) {
  if (!v.is_boolean())
    c.fail("field '" + field + "' must be true or false, got " + v.dump());
  return v.get<bool>();
}

int64_t required_positive(const config_file& c, const std::string& field) {
  const json* v = c.find(field);
  if (v == nullptr)
    c.fail("missing field '" + field + "'");
  auto x = as_int(c, field, *v);
  if (x <= 0)
    c.fail("field '" + field + "' must be > 0, got " + std::to_string(x));
  return x;
}

int64_t optional_positive(const config_file& c, const std::string& field, int64_t fallback) {
  const json* v = c.find(field);
  if (v == nullptr)
    return fallback;
  auto x = as_int(c, field, *v);
  if (x <= 0)
    c.fail("field '" + field + "' must be > 0, got " + std::to_string(x));
  return x;
}

bool has_architecture(const config_file& c, const std::string& arch) {
  const json* a = c.find("architectures");
  if (a == nullptr)
    return false;
  if (!a->is_array())
    c.fail("field 'architectures' must be a list of class names, got " + a->dump());
  for (const auto& x : *a)
    if (x.is_string() && x.get<std::string>() == arch)
      return true;
  return false;
}

std::string architecture_text(const config_file& c) {
  if (const json* a = c.find("architectures"); a != nullptr && a->is_array() && !a->empty())
    return a->size() == 1 && (*a)[0].is_string() ? (*a)[0].get<std::string>() : a->dump();
  if (const json* m = c.find("model_type"); m != nullptr && m->is_string())
    return "(model_type " + m->get<std::string>() + ")";
  return "(none given)";
}

/// RoPE: theta from the top level and/or rope_parameters / rope_scaling;
/// only the default (unscaled) rotation is supported.
double read_rope_theta(const config_file& c) {
  std::optional<double> theta;
  std::string theta_field;
  auto take = [&](const std::string& field, const json& v) {
    double x = as_double(c, field, v);
    if (!(x > 0))
      c.fail("field '" + field + "' must be > 0, got " + v.dump());
    if (theta && *theta != x)
      c.fail("field '" + field + "' (" + v.dump() + ") disagrees with '" + theta_field + "' ("
             + json(*theta).dump() + ")");
    theta = x;
    theta_field = field;
  };
  if (const json* v = c.find("rope_theta"))
    take("rope_theta", *v);
  for (const std::string key : {"rope_parameters", "rope_scaling"}) {
    const json* r = c.find(key);
    if (r == nullptr)
      continue;
    if (!r->is_object())
      c.fail("field '" + key + "' must be an object, got " + r->dump());
    for (const std::string type_key : {"rope_type", "type"}) {
      auto t = r->find(type_key);
      if (t == r->end() || t->is_null())
        continue;
      if (!t->is_string() || t->get<std::string>() != "default")
        c.fail("field '" + key + "." + type_key + "' is " + t->dump()
               + "; Tandem supports only the default RoPE (no scaling)");
    }
    if (auto v = r->find("rope_theta"); v != r->end() && !v->is_null())
      take(key + ".rope_theta", *v);
  }
  return theta.value_or(10000.0);
}

/// The Qwen3 fields of `c`, validated; the architecture is the caller's check.
qwen3_config parse_qwen3(const config_file& c) {
  qwen3_config q;
  q.vocab_size = required_positive(c, "vocab_size");
  q.hidden_size = required_positive(c, "hidden_size");
  q.intermediate_size = required_positive(c, "intermediate_size");
  q.num_hidden_layers = required_positive(c, "num_hidden_layers");
  q.num_attention_heads = required_positive(c, "num_attention_heads");
  q.num_key_value_heads = optional_positive(c, "num_key_value_heads", q.num_attention_heads);
  if (q.num_attention_heads % q.num_key_value_heads != 0)
    c.fail("field 'num_attention_heads' (" + std::to_string(q.num_attention_heads)
           + ") must be a multiple of field 'num_key_value_heads' ("
           + std::to_string(q.num_key_value_heads) + ")");
  if (c.find("head_dim") == nullptr && q.hidden_size % q.num_attention_heads != 0)
    c.fail("missing field 'head_dim', and field 'hidden_size' (" + std::to_string(q.hidden_size)
           + ") is not a multiple of field 'num_attention_heads' ("
           + std::to_string(q.num_attention_heads) + ")");
  q.head_dim = optional_positive(c, "head_dim", q.hidden_size / q.num_attention_heads);
  q.max_position_embeddings = optional_positive(c, "max_position_embeddings", 32768);
  if (const json* v = c.find("rms_norm_eps")) {
    q.rms_norm_eps = as_double(c, "rms_norm_eps", *v);
    if (!(q.rms_norm_eps > 0))
      c.fail("field 'rms_norm_eps' must be > 0, got " + v->dump());
  }
  q.rope_theta = read_rope_theta(c);
  if (const json* v = c.find("tie_word_embeddings"))
    q.tie_word_embeddings = as_bool(c, "tie_word_embeddings", *v);
  if (const json* v = c.find("attention_bias"))
    q.attention_bias = as_bool(c, "attention_bias", *v);
  if (q.attention_bias)
    c.fail("field 'attention_bias' is true; Tandem's Qwen3 has no attention biases (Qwen3's own checkpoints "
           "have none: this is another architecture)");
  if (const json* v = c.find("hidden_act"); v != nullptr && *v != "silu")
    c.fail("field 'hidden_act' is " + v->dump() + "; Tandem supports only \"silu\"");
  if (const json* v = c.find("use_sliding_window"); v != nullptr && as_bool(c, "use_sliding_window", *v))
    c.fail("field 'use_sliding_window' is true; Tandem supports only full attention");
  return q;
}

} // namespace

qwen3_config load_qwen3_config(const fs::path& path) {
  auto c = read_config(path);
  const bool ok = c.find("architectures") != nullptr
                    ? has_architecture(c, "Qwen3ForCausalLM")
                    : c.find("model_type") != nullptr && *c.find("model_type") == "qwen3";
  if (!ok)
    throw error(errc::bad_input, "unknown architecture " + architecture_text(c) + " in "
                                     + c.file.string() + " (Tandem supports Qwen3ForCausalLM)");
  return parse_qwen3(c);
}

model_tokens load_model_tokens(const fs::path& path) {
  auto c = read_config(path);
  model_tokens t;
  t.file = c.file;
  t.vocab_size = required_positive(c, "vocab_size");
  // As stated, not range-checked: the model does not use them, and a
  // config with an odd one must still load; identity.hpp compares them.
  if (const json* v = c.find("eos_token_id")) {
    if (v->is_array()) {
      for (size_t i = 0; i < v->size(); ++i)
        t.eos_token_ids.push_back(as_int(c, "eos_token_id[" + std::to_string(i) + "]", (*v)[i]));
    } else {
      t.eos_token_ids.push_back(as_int(c, "eos_token_id", *v));
    }
  }
  if (const json* v = c.find("bos_token_id"))
    t.bos_token_id = as_int(c, "bos_token_id", *v);
  if (const json* v = c.find("pad_token_id"))
    t.pad_token_id = as_int(c, "pad_token_id", *v);
  return t;
}

dflash_config load_dflash_config(const fs::path& path) {
  auto c = read_config(path);
  if (!has_architecture(c, "DFlashDraftModel"))
    throw error(errc::bad_input, "unknown architecture " + architecture_text(c) + " in "
                                     + c.file.string() + " (expected DFlashDraftModel)");
  dflash_config d;
  d.layer = parse_qwen3(c);

  const json* nested = c.find("dflash_config");
  if (nested != nullptr && !nested->is_object())
    c.fail("field 'dflash_config' must be an object, got " + nested->dump());
  // Each DFlash field: dflash_config.<name> first, then the top level.
  auto field = [&](const std::string& name) -> std::pair<const json*, std::string> {
    if (nested != nullptr)
      if (auto it = nested->find(name); it != nested->end() && !it->is_null())
        return {&*it, "dflash_config." + name};
    return {c.find(name), name};
  };

  if (auto [v, name] = field("mask_token_id"); v == nullptr) {
    c.fail("missing field 'dflash_config.mask_token_id'");
  } else {
    d.mask_token_id = as_int(c, name, *v);
    if (d.mask_token_id < 0 || d.mask_token_id >= d.layer.vocab_size)
      c.fail("field '" + name + "' (" + std::to_string(d.mask_token_id)
             + ") must be a row of the embedding: 0 <= id < vocab_size ("
             + std::to_string(d.layer.vocab_size) + ")");
  }
  if (auto [v, name] = field("block_size"); v != nullptr) {
    d.block_size = as_int(c, name, *v);
    if (d.block_size < 2)
      c.fail("field '" + name + "' must be >= 2, got " + std::to_string(d.block_size));
  }
  d.num_target_layers = required_positive(c, "num_target_layers");
  if (auto [v, name] = field("target_layer_ids"); v != nullptr) {
    if (!v->is_array() || v->empty())
      c.fail("field '" + name + "' must be a non-empty list of layer ids, got " + v->dump());
    for (size_t i = 0; i < v->size(); ++i) {
      auto id = as_int(c, name + "[" + std::to_string(i) + "]", (*v)[i]);
      if (id < 0 || id >= d.num_target_layers)
        c.fail("field '" + name + "[" + std::to_string(i) + "]' (" + std::to_string(id)
               + ") must be a target layer: 0 <= id < num_target_layers ("
               + std::to_string(d.num_target_layers) + ")");
      d.target_layer_ids.push_back(id);
    }
  } else {
    try {
      d.target_layer_ids = default_tap_ids(d.num_target_layers, d.layer.num_hidden_layers);
    } catch (const error& ex) {
      c.fail(std::string("no field 'dflash_config.target_layer_ids', and the default fails: ")
             + ex.what());
    }
  }
  return d;
}

std::string to_json(const dflash_config& c, const std::string& dtype) {
  if (dtype != "bfloat16" && dtype != "float16" && dtype != "float32")
    throw error(errc::bad_input,
                "dflash config: dtype '" + dtype + "' must be bfloat16, float16 or float32");
  const auto& l = c.layer;
  json j;  // keys come out sorted, as transformers writes them
  j["architectures"] = {"DFlashDraftModel"};
  j["attention_bias"] = l.attention_bias;
  j["block_size"] = c.block_size;
  j["dflash_config"] = {{"mask_token_id", c.mask_token_id},
                        {"target_layer_ids", c.target_layer_ids}};
  j["dtype"] = dtype;
  j["head_dim"] = l.head_dim;
  j["hidden_act"] = "silu";
  j["hidden_size"] = l.hidden_size;
  j["intermediate_size"] = l.intermediate_size;
  j["max_position_embeddings"] = l.max_position_embeddings;
  j["model_type"] = "qwen3";
  j["num_attention_heads"] = l.num_attention_heads;
  j["num_hidden_layers"] = l.num_hidden_layers;
  j["num_key_value_heads"] = l.num_key_value_heads;
  j["num_target_layers"] = c.num_target_layers;
  j["rms_norm_eps"] = l.rms_norm_eps;
  j["rope_theta"] = l.rope_theta;
  j["tie_word_embeddings"] = l.tie_word_embeddings;
  j["vocab_size"] = l.vocab_size;
  return j.dump(2);
}

std::vector<int64_t> training_tap_ids(int64_t num_target_layers) {
  constexpr int64_t taps = 5;
  if (num_target_layers >= 8) {
    auto ids = default_tap_ids(num_target_layers, taps);
    if (std::adjacent_find(ids.begin(), ids.end(), [](int64_t a, int64_t b) { return a >= b; }) == ids.end())
      return ids;
  }
  const int64_t n = std::min(taps, std::max<int64_t>(num_target_layers, 1));
  if (n == 1)
    return {num_target_layers / 2};
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i)  // distinct: the step (L−1)/(n−1) is at least 1
    ids.push_back(static_cast<int64_t>(std::llround(static_cast<double>(i * (num_target_layers - 1))
                                                    / static_cast<double>(n - 1))));
  return ids;
}

std::vector<int64_t> default_tap_ids(int64_t num_target_layers, int64_t num_taps) {
  if (num_target_layers < 1 || num_taps < 1)
    throw error(errc::bad_input, "default tap ids: need num_target_layers >= 1 and num_taps >= 1, got "
                                     + std::to_string(num_target_layers) + " and "
                                     + std::to_string(num_taps));
  if (num_taps == 1)
    return {num_target_layers / 2};
  const int64_t start = 1;
  const int64_t span = (num_target_layers - 3) - start;
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < num_taps; ++i) {
    // Python: round(start + (i * span) / (n - 1)): true division in double,
    // then round half to even (x - floor(x) is exact at these magnitudes).
    const double x = static_cast<double>(start)
                     + static_cast<double>(i * span) / static_cast<double>(num_taps - 1);
    const double lo = std::floor(x);
    const double frac = x - lo;
    auto id = static_cast<int64_t>(lo);
    if (frac > 0.5 || (frac == 0.5 && id % 2 != 0))
      ++id;
    if (id < 0 || id >= num_target_layers)
      throw error(errc::bad_input, "default tap ids: " + std::to_string(num_target_layers)
                                       + " target layers are too few for "
                                       + std::to_string(num_taps) + " taps");
    ids.push_back(id);
  }
  return ids;
}

} // namespace tandem::gpu
