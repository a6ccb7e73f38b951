// The run configuration: schema, TOML reading with located errors,
// command-line overrides, to_toml, placement.
//
// One table, `fields`, drives everything: which keys exist (unknown-key
// errors and their suggestions), how each is read and validated, how it is
// written back, and its comment in to_toml.  [[faults.inject]] is the one
// array of tables and is handled beside it.
#include "launch/run_config.hpp"
#include "launch/options.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <optional>
#include <sstream>
#include <tuple>

#include <unistd.h>

#include <nlohmann/json.hpp>

#if __has_include(<toml++/toml.hpp>)
#include <toml++/toml.hpp>
#else
#include <toml++/toml.h>
#endif

namespace tandem {
namespace {

namespace fs = std::filesystem;

// ------------------------------------------------------------ formatting --

/// TOML basic string, escaped.
std::string quote(std::string_view s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (ch < 0x20 || ch == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", ch);
          out += buf;
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  return out + "\"";
}

/// The shortest text that reads back as exactly `x`, always a TOML float
/// ("1.0", "0.0006", "1e-8").
std::string format_double(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string s = buf;
  auto e = s.find('e');
  if (e != std::string::npos) {
    int exponent = std::atoi(s.c_str() + e + 1);
    if (exponent >= 0 && exponent < 16) {  // "1.2e+02" → "120.0"
      int digits = static_cast<int>(std::count_if(s.begin(), s.begin() + e, ::isdigit));
      std::snprintf(buf, sizeof buf, "%.*f", std::max(0, digits - 1 - exponent), x);
      s = buf;
      if (s.find('.') == std::string::npos) s += ".0";
      return s;
    }
  }
  if (e != std::string::npos) {  // "1e-08" → "1e-8", "1e+20" → "1e20"
    std::string mantissa = s.substr(0, e), exponent = s.substr(e + 1);
    bool negative = !exponent.empty() && exponent[0] == '-';
    if (!exponent.empty() && (exponent[0] == '-' || exponent[0] == '+')) exponent.erase(0, 1);
    exponent.erase(0, std::min(exponent.find_first_not_of('0'), exponent.size() - 1));
    return mantissa + "e" + (negative ? "-" : "") + exponent;
  }
  if (s.find('.') == std::string::npos) s += ".0";
  return s;
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? std::string(sep) : "") + items[i];
  return out;
}

/// A value as an error message shows it after "got".
std::string describe(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return quote(n.as_string()->get());
    case toml::node_type::integer: return std::to_string(n.as_integer()->get());
    case toml::node_type::floating_point: return format_double(n.as_floating_point()->get());
    case toml::node_type::boolean: return n.as_boolean()->get() ? "true" : "false";
    case toml::node_type::array: {  // short arrays of scalars in full: [9, 1]
      auto& a = *n.as_array();
      std::vector<std::string> items;
      for (auto& e : a) {
        if (e.is_array() || e.is_table() || items.size() == 16) return "an array";
        items.push_back(describe(e));
      }
      return "[" + join(items, ", ") + "]";
    }
    case toml::node_type::table: return "a table";
    default: return "a date or time";
  }
}

std::string locate(const std::string& file, const toml::source_region& r) {
  if (r.begin.line == 0) return file;
  return file + ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
}

// ------------------------------------------------------------ suggestions --

/// Optimal string alignment distance (a transposition counts as one edit).
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

/// "learning_rate" → "lr"; "" for a single word.
std::string initials(std::string_view key) {
  if (key.find('_') == std::string_view::npos) return {};
  std::string out;
  bool start = true;
  for (char ch : key) {
    if (ch == '_') start = true;
    else if (start) out += ch, start = false;
  }
  return out;
}

/// Close within the same section, closest first: one edit (0, 1); one is
/// the other's initials ("learning_rate" ↔ "lr", "wd" ↔ "weight_decay": 2);
/// two edits (3), unless a word is so short that two edits make anything of
/// it ("wd" is not "lr").
std::optional<int> closeness(std::string_view typed, std::string_view known) {
  size_t d = edit_distance(typed, known);
  if (d <= 1) return static_cast<int>(d);
  if (initials(typed) == known || initials(known) == typed) return 2;
  if (d == 2 && std::min(typed.size(), known.size()) >= 4) return 3;
  return std::nullopt;
}

// ---------------------------------------------------------------- reading --

/// One value being read, with what error messages need: the field's name
/// and where the value came from.
class value_reader {
public:
  value_reader(const toml::node& node, std::string name, const std::string& file,
               std::string cli, fs::path base)
    : node_(node), name_(std::move(name)), file_(file), cli_(std::move(cli)),
      base_(std::move(base)) {}

  const toml::node& node() const { return node_; }
  const std::string& name() const { return name_; }

  /// "FILE:LINE:COL" of the value, or the command-line argument.
  std::string where() const { return cli_.empty() ? locate(file_, node_.source()) : cli_; }

  [[noreturn]] void fail(std::string_view expected) const {
    throw config_error(where() + ": '" + name_ + "' must be " + std::string(expected) +
                       ", got " + describe(node_));
  }

  value_reader element(size_t i, const toml::node& n) const {
    return value_reader(n, name_ + "[" + std::to_string(i) + "]", file_, cli_, base_);
  }

  int64_t integer(int64_t min, std::string_view expected) const {
    return integer(min, std::numeric_limits<int64_t>::max(), expected);
  }
  int64_t integer(int64_t min, int64_t max, std::string_view expected) const {
    auto v = node_.as_integer();
    if (!v || v->get() < min || v->get() > max) fail(expected);
    return v->get();
  }
  int64_t positive() const { return integer(1, "a positive integer"); }
  int64_t non_negative() const { return integer(0, "a non-negative integer"); }

  /// A finite number (an integer is taken as one) in [lo, hi], each end
  /// open when asked.
  double number(double lo, bool lo_open, double hi, bool hi_open,
                std::string_view expected) const {
    double x;
    if (auto f = node_.as_floating_point()) x = f->get();
    else if (auto i = node_.as_integer()) x = static_cast<double>(i->get());
    else fail(expected);
    bool ok = std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
    if (!ok) fail(expected);
    return x;
  }
  double positive_number() const {
    return number(0, true, std::numeric_limits<double>::infinity(), false, "a positive number");
  }
  /// A timer's duration: more than 0, at most a day.
  double seconds_up_to_a_day() const {
    return number(0, true, 86400, false, "a number of seconds, more than 0 and at most 86400 (a day)");
  }
  double non_negative_number() const {
    return number(0, false, std::numeric_limits<double>::infinity(), false,
                  "a non-negative number");
  }

  bool boolean() const {
    auto b = node_.as_boolean();
    if (!b) fail("true or false");
    return b->get();
  }

  std::string string(bool allow_empty = false) const {
    auto s = node_.as_string();
    if (!s || (!allow_empty && s->get().empty()))
      fail(allow_empty ? "a string" : "a non-empty string");
    return s->get();
  }

  std::string choice(const std::vector<std::string>& allowed) const {
    auto s = node_.as_string();
    if (!s || std::find(allowed.begin(), allowed.end(), s->get()) == allowed.end()) {
      std::vector<std::string> quoted;
      for (auto& a : allowed) quoted.push_back(quote(a));
      fail("one of " + join(quoted, ", "));
    }
    return s->get();
  }

  /// A path, absolute: taken from the config file's folder, or from the
  /// working directory when it came from the command line.  "" stays "".
  fs::path path(bool allow_empty) const {
    auto s = string(allow_empty);
    if (s.empty()) return {};
    fs::path p(s);
    if (p.is_relative()) p = cli_.empty() ? base_ / p : fs::absolute(p);
    return p.lexically_normal();
  }

  /// A path kept as written (relative ones are relative to run.output_dir).
  fs::path relative_path(bool allow_empty) const { return fs::path(string(allow_empty)); }

  const toml::array& array(std::string_view expected) const {
    auto a = node_.as_array();
    if (!a) fail(expected);
    return *a;
  }

private:
  const toml::node& node_;
  std::string name_;
  const std::string& file_;
  std::string cli_;
  fs::path base_;
};

// ---------------------------------------------------------------- devices --

struct device_ref {
  bool is_auto = false;
  int32_t device = -1;  ///< -1 = CPU
  std::string node;     ///< "NODE:" prefix ("" = none)
};

std::optional<device_ref> parse_device(std::string_view s) {
  if (s == "auto") return device_ref{true, -1, {}};
  if (s == "cpu") return device_ref{false, -1, {}};
  if (const auto colon = s.find(':'); colon != std::string_view::npos && s.substr(0, colon) != "cuda") {
    // "NODE:cpu" or "NODE:cuda:N" (never "NODE:auto": auto means this host's GPUs)
    const std::string node(s.substr(0, colon));
    if (!valid_node_name(node)) return std::nullopt;
    auto rest = parse_device(s.substr(colon + 1));
    if (!rest || rest->is_auto || !rest->node.empty()) return std::nullopt;
    rest->node = node;
    return rest;
  }
  constexpr std::string_view cuda = "cuda:";
  if (s.substr(0, cuda.size()) != cuda) return std::nullopt;
  auto digits = s.substr(cuda.size());
  if (digits.empty() || digits.size() > 9 ||
      digits.find_first_not_of("0123456789") != std::string_view::npos)
    return std::nullopt;
  return device_ref{false, static_cast<int32_t>(std::stol(std::string(digits))), {}};
}

constexpr std::string_view device_expected =
  "an array of device strings (\"cpu\", \"cuda:N\", \"NODE:cpu\", \"NODE:cuda:N\", or \"auto\" alone)";

std::vector<std::string> read_devices(const value_reader& v, bool may_be_empty = false) {
  auto& arr = v.array(device_expected);
  if (arr.empty() && !may_be_empty) v.fail(device_expected);
  std::vector<std::string> out;
  for (size_t i = 0; i < arr.size(); ++i) {
    auto e = v.element(i, arr[i]);
    auto s = e.node().as_string();
    auto d = s ? parse_device(s->get()) : std::nullopt;
    if (!d) e.fail("\"cpu\", \"cuda:N\", \"NODE:cpu\", \"NODE:cuda:N\" or \"auto\" (NODE: a cluster member's "
                   "name, lowercase letters, digits and '-')");
    if (d->is_auto && arr.size() != 1) e.fail("alone when it is \"auto\" (auto means every GPU)");
    out.push_back(s->get());
  }
  return out;
}

// ----------------------------------------------------------------- schema --

enum class kind { integer, number, boolean, string, path, int_array, number_array, string_array,
                  path_array };

struct field_def {
  std::string_view section, key;
  kind type;
  bool required;
  void (*read)(run_config&, const value_reader&);
  std::string (*write)(const run_config&);
  std::string_view doc;  ///< the comment to_toml writes above it
};

std::string w_int(int64_t x) { return std::to_string(x); }
std::string w_uint(uint64_t x) { return std::to_string(x); }
std::string w_num(double x) { return format_double(x); }
std::string w_bool(bool x) { return x ? "true" : "false"; }
std::string w_str(const std::string& s) { return quote(s); }
std::string w_path(const fs::path& p) { return quote(p.string()); }
std::string w_ints(const std::vector<int64_t>& xs) {
  std::vector<std::string> parts;
  for (auto x : xs) parts.push_back(std::to_string(x));
  return "[" + join(parts, ", ") + "]";
}
std::string w_nums(const std::vector<double>& xs) {
  std::vector<std::string> parts;
  for (auto x : xs) parts.push_back(format_double(x));
  return "[" + join(parts, ", ") + "]";
}
std::string w_paths(const std::vector<fs::path>& xs) {
  std::vector<std::string> parts;
  for (auto& x : xs) parts.push_back(quote(x.string()));
  return "[" + join(parts, ", ") + "]";
}
std::string w_strs(const std::vector<std::string>& xs) {
  std::vector<std::string> parts;
  for (auto& x : xs) parts.push_back(quote(x));
  return "[" + join(parts, ", ") + "]";
}

using rc = run_config;
using vr = value_reader;

// clang-format off
const field_def fields[] = {
  // [model]
  {"model", "target", kind::path, true,
   [](rc& c, const vr& v) { c.model.target = v.path(false); },
   [](const rc& c) { return w_path(c.model.target); },
   "the frozen target: a Hugging Face Qwen3 folder (config.json + *.safetensors); required"},
  {"model", "tap_layers", kind::int_array, false,
   [](rc& c, const vr& v) {
     auto& arr = v.array("an array of layer indices");
     std::vector<int64_t> taps;
     for (size_t i = 0; i < arr.size(); ++i)
       taps.push_back(v.element(i, arr[i]).non_negative());
     for (size_t i = 1; i < taps.size(); ++i)
       if (taps[i] <= taps[i - 1]) v.fail("strictly increasing");
     c.model.tap_layers = taps;
   },
   [](const rc& c) { return w_ints(c.model.tap_layers); },
   "decoder layers (0-indexed outputs) whose hidden states feed the drafter, strictly\n"
   "increasing; [] = DFLASH.md's default: 5 taps round(1 + i*(L-4)/4), [1, 9, 17, 25, 33] for 36 layers;\n"
   "the last layer (L-1) is tapped after the final norm, as Hugging Face's hidden_states[L]"},
  {"model", "dtype", kind::string, false,
   [](rc& c, const vr& v) { c.model.dtype = v.choice({"auto", "float32", "bfloat16"}); },
   [](const rc& c) { return w_str(c.model.dtype); },
   "\"auto\" (bfloat16 on a GPU, float32 on the CPU), \"float32\" or \"bfloat16\""},
  // [drafter]
  {"drafter", "layers", kind::integer, false,
   [](rc& c, const vr& v) { c.drafter.layers = v.positive(); },
   [](const rc& c) { return w_int(c.drafter.layers); },
   "Qwen3 decoder layers in the drafter (5 for Qwen3-4B/8B, 8 for the 30B MoE)"},
  {"drafter", "block_size", kind::integer, false,
   [](rc& c, const vr& v) { c.drafter.block_size = v.integer(2, "an integer >= 2"); },
   [](const rc& c) { return w_int(c.drafter.block_size); },
   "Bs: tokens per draft block (anchor + Bs-1 masked positions)"},
  {"drafter", "mask_token_id", kind::integer, true,
   [](rc& c, const vr& v) { c.drafter.mask_token_id = v.non_negative(); },
   [](const rc& c) { return w_int(c.drafter.mask_token_id); },
   "token id of the block's masked positions; a row of the target's embedding (Qwen3: 151669); required"},
  {"drafter", "seed", kind::integer, false,
   [](rc& c, const vr& v) { c.drafter.seed = static_cast<uint64_t>(v.non_negative()); },
   [](const rc& c) { return w_uint(c.drafter.seed); },
   "seed of the drafter's weight initialisation"},
  {"drafter", "init_from", kind::path, false,
   [](rc& c, const vr& v) { c.drafter.init_from = v.path(true); },
   [](const rc& c) { return w_path(c.drafter.init_from); },
   "\"\" = fresh weights; else a Tandem checkpoint or z-lab DFlash export folder to start from"},
  // [data]
  {"data", "path", kind::path, false,
   [](rc& c, const vr& v) { c.data.path = v.path(false); },
   [](const rc& c) { return w_path(c.data.path); },
   "prepared data set: a `tandem prepare` output folder (manifest.json + shards); required\n"
   "unless data.sources is given (then default: run.output_dir/data)"},
  {"data", "sources", kind::path_array, false,
   [](rc& c, const vr& v) {
     auto& arr = v.array("an array of paths");
     std::vector<fs::path> paths;
     for (size_t i = 0; i < arr.size(); ++i)
       paths.push_back(v.element(i, arr[i]).path(false));
     c.data.sources = paths;
   },
   [](const rc& c) { return w_paths(c.data.sources); },
   "chat JSONL files (ShareGPT, OpenAI messages or tokenized) that `tandem run` prepares\n"
   "into data.path before training, with the target's tokenizer and chat template; a data.path\n"
   "already prepared from the same files, tokenizer and options is reused; the same file twice\n"
   "is an error; [] = data.path is prepared already"},
  {"data", "tokenizer", kind::path, false,
   [](rc& c, const vr& v) { c.data.tokenizer = v.path(true); },
   [](const rc& c) { return w_path(c.data.tokenizer); },
   "tokenizer folder (tokenizer.json + chat template) for data.sources; \"\" = model.target"},
  {"data", "seq_len", kind::integer, false,
   [](rc& c, const vr& v) { c.data.seq_len = v.positive(); },
   [](const rc& c) { return w_int(c.data.seq_len); },
   "S: tokens per packed row (at least drafter.block_size); longer samples are truncated\n"
   "(the run says at start how many, and the tokens lost)"},
  {"data", "rows", kind::integer, false,
   [](rc& c, const vr& v) { c.data.rows = v.positive(); },
   [](const rc& c) { return w_int(c.data.rows); },
   "B: rows per batch"},
  {"data", "anchors", kind::integer, false,
   [](rc& c, const vr& v) { c.data.anchors = v.positive(); },
   [](const rc& c) { return w_int(c.data.anchors); },
   "N: draft blocks (anchors) sampled per row each step"},
  {"data", "max_docs", kind::integer, false,
   [](rc& c, const vr& v) { c.data.max_docs = v.positive(); },
   [](const rc& c) { return w_int(c.data.max_docs); },
   "documents packed into one row at most (at most data.seq_len)"},
  {"data", "lookahead", kind::integer, false,
   [](rc& c, const vr& v) { c.data.lookahead = v.positive(); },
   [](const rc& c) { return w_int(c.data.lookahead); },
   "pending samples the first-fit packer chooses from"},
  {"data", "seed", kind::integer, false,
   [](rc& c, const vr& v) { c.data.seed = static_cast<uint64_t>(v.non_negative()); },
   [](const rc& c) { return w_uint(c.data.seed); },
   "seed of the epoch shuffle and the anchor sampling"},
  {"data", "epochs", kind::integer, false,
   [](rc& c, const vr& v) { c.data.epochs = v.positive(); },
   [](const rc& c) { return w_int(c.data.epochs); },
   "passes over the data set (DFLASH.md's recipe: 6)"},
  // [train]
  {"train", "lr", kind::number, false,
   [](rc& c, const vr& v) { c.train.lr = v.positive_number(); },
   [](const rc& c) { return w_num(c.train.lr); },
   "peak learning rate (AdamW, cosine decay after the warm-up)"},
  {"train", "warmup_ratio", kind::number, false,
   [](rc& c, const vr& v) { c.train.warmup_ratio = v.number(0, false, 1, false, "a number in [0, 1]"); },
   [](const rc& c) { return w_num(c.train.warmup_ratio); },
   "fraction of the steps spent in linear warm-up, in [0, 1]"},
  {"train", "weight_decay", kind::number, false,
   [](rc& c, const vr& v) { c.train.weight_decay = v.non_negative_number(); },
   [](const rc& c) { return w_num(c.train.weight_decay); },
   "AdamW decoupled weight decay"},
  {"train", "grad_clip", kind::number, false,
   [](rc& c, const vr& v) { c.train.grad_clip = v.non_negative_number(); },
   [](const rc& c) { return w_num(c.train.grad_clip); },
   "clip the global gradient norm to this; 0 = no clipping"},
  {"train", "beta1", kind::number, false,
   [](rc& c, const vr& v) { c.train.beta1 = v.number(0, false, 1, true, "a number in [0, 1)"); },
   [](const rc& c) { return w_num(c.train.beta1); },
   "AdamW beta1, in [0, 1)"},
  {"train", "beta2", kind::number, false,
   [](rc& c, const vr& v) { c.train.beta2 = v.number(0, false, 1, true, "a number in [0, 1)"); },
   [](const rc& c) { return w_num(c.train.beta2); },
   "AdamW beta2, in [0, 1)"},
  {"train", "eps", kind::number, false,
   [](rc& c, const vr& v) { c.train.eps = v.positive_number(); },
   [](const rc& c) { return w_num(c.train.eps); },
   "AdamW epsilon"},
  {"train", "max_steps", kind::integer, false,
   [](rc& c, const vr& v) { c.train.max_steps = v.non_negative(); },
   [](const rc& c) { return w_int(c.train.max_steps); },
   "stop after this many optimizer steps; 0 = run data.epochs"},
  {"train", "chunk_rows", kind::integer, false,
   [](rc& c, const vr& v) { c.train.chunk_rows = v.positive(); },
   [](const rc& c) { return w_int(c.train.chunk_rows); },
   "lm-head rows per chunk of the cross-entropy (never all N*Bs*V logits at once)"},
  {"train", "log_every", kind::integer, false,
   [](rc& c, const vr& v) { c.train.log_every = v.positive(); },
   [](const rc& c) { return w_int(c.train.log_every); },
   "optimizer steps between metric records"},
  // [placement]
  {"placement", "targets", kind::string_array, false,
   [](rc& c, const vr& v) { c.placement.targets = read_devices(v); },
   [](const rc& c) { return w_strs(c.placement.targets); },
   "one target actor per entry: \"cpu\", \"cuda:N\", or [\"auto\"] = every GPU in order\n"
   "(the CPU when there is none); devices may repeat and may be shared with drafters"},
  {"placement", "drafters", kind::string_array, false,
   [](rc& c, const vr& v) { c.placement.drafters = read_devices(v); },
   [](const rc& c) { return w_strs(c.placement.drafters); },
   "one drafter (a data-parallel replica) per entry, as for targets"},
  {"placement", "spares", kind::string_array, false,
   [](rc& c, const vr& v) { c.placement.spares = read_devices(v, true); },
   [](const rc& c) { return w_strs(c.placement.spares); },
   "member devices held in reserve (\"NODE:cuda:N\", \"NODE:cpu\"; a cluster only): a drafter whose node is\n"
   "lost is started again on the first free one whose node is up, from a peer or the newest checkpoint\n"
   "(which that node must be able to read: a shared checkpoint.dir), instead of waiting for its node;\n"
   "[] = wait for the node to join again"},
  {"placement", "prefetch", kind::string, false,
   [](rc& c, const vr& v) { c.placement.prefetch = v.choice({"per_target"}); },
   [](const rc& c) { return w_str(c.placement.prefetch); },
   "\"per_target\": one prefetch actor per target, on the target's device (the only layout so far)"},
  // [runtime]
  {"runtime", "credits", kind::integer, false,
   [](rc& c, const vr& v) {  // the coordinator counts them in an int32_t
     c.runtime.credits = v.integer(1, std::numeric_limits<int32_t>::max(), "an integer in [1, 2147483647]");
   },
   [](const rc& c) { return w_int(c.runtime.credits); },
   "batches in flight per target (prefetched, computed or waiting for a drafter)"},
  {"runtime", "heartbeat_s", kind::number, false,
   [](rc& c, const vr& v) { c.runtime.heartbeat_s = v.seconds_up_to_a_day(); },
   [](const rc& c) { return w_num(c.runtime.heartbeat_s); },
   "seconds: an idle drafter is asked for a heartbeat this often and must answer within it;\n"
   "a drafter inside a step is watched by step_timeout_s"},
  {"runtime", "group_timeout_s", kind::number, false,
   [](rc& c, const vr& v) { c.runtime.group_timeout_s = v.seconds_up_to_a_day(); },
   [](const rc& c) { return w_num(c.runtime.group_timeout_s); },
   "seconds: data-parallel drafters (more than one) must form their NCCL group, and finish each\n"
   "step's all-reduce, within this; a rank that does not is a failure and the others re-form"},
  {"runtime", "step_timeout_s", kind::number, false,
   [](rc& c, const vr& v) { c.runtime.step_timeout_s = v.seconds_up_to_a_day(); },
   [](const rc& c) { return w_num(c.runtime.step_timeout_s); },
   "seconds one drafter step may take before it counts as a failure"},
  {"runtime", "capture_graphs", kind::boolean, false,
   [](rc& c, const vr& v) { c.runtime.capture_graphs = v.boolean(); },
   [](const rc& c) { return w_bool(c.runtime.capture_graphs); },
   "capture each step as a CUDA graph (ignored on the CPU)"},
  {"runtime", "gpu_memory_fraction", kind::number, false,
   [](rc& c, const vr& v) { c.runtime.gpu_memory_fraction = v.number(0, true, 1, false, "a number in (0, 1]"); },
   [](const rc& c) { return w_num(c.runtime.gpu_memory_fraction); },
   "the share of each GPU's memory this run may allocate, in (0, 1]"},
  // [checkpoint]
  {"checkpoint", "dir", kind::path, false,
   [](rc& c, const vr& v) { c.checkpoint.dir = v.relative_path(false); },
   [](const rc& c) { return w_path(c.checkpoint.dir); },
   "snapshot folder, relative to run.output_dir"},
  {"checkpoint", "every_steps", kind::integer, false,
   [](rc& c, const vr& v) { c.checkpoint.every_steps = v.non_negative(); },
   [](const rc& c) { return w_int(c.checkpoint.every_steps); },
   "optimizer steps between snapshots; 0 = only at the end and on a signal"},
  {"checkpoint", "keep", kind::integer, false,
   [](rc& c, const vr& v) {  // the checkpointer counts them (and keep + 1) in an int
     c.checkpoint.keep = v.integer(1, std::numeric_limits<int>::max() - 1, "an integer in [1, 2147483646]");
   },
   [](const rc& c) { return w_int(c.checkpoint.keep); },
   "newest snapshots kept; older ones are deleted"},
  {"checkpoint", "memory_every", kind::integer, false,
   [](rc& c, const vr& v) { c.checkpoint.memory_every = v.non_negative(); },
   [](const rc& c) { return w_int(c.checkpoint.memory_every); },
   "steps between restore points in device memory (a single drafter's masters and moments "
   "copied on its device; a failure in this process restores them); 0 = none"},
  {"checkpoint", "host_every", kind::integer, false,
   [](rc& c, const vr& v) { c.checkpoint.host_every = v.non_negative(); },
   [](const rc& c) { return w_int(c.checkpoint.host_every); },
   "steps between restore points in shared memory (checkpoint.host_dir, written like a checkpoint "
   "from the drafter's page-locked snapshot): they outlive the worker process, so a sticky CUDA error "
   "or a killed worker resumes from them, not from the older checkpoint; 0 = none"},
  {"checkpoint", "host_dir", kind::path, false,
   [](rc& c, const vr& v) { c.checkpoint.host_dir = v.relative_path(true); },
   [](const rc& c) { return w_path(c.checkpoint.host_dir); },
   "folder of the restore points in shared memory; \"\" = /dev/shm/tandem-<uid>/<run.name>-<hash of "
   "run.output_dir>"},
  {"checkpoint", "on_signal", kind::boolean, false,
   [](rc& c, const vr& v) { c.checkpoint.on_signal = v.boolean(); },
   [](const rc& c) { return w_bool(c.checkpoint.on_signal); },
   "on SIGINT/SIGTERM, write a snapshot before exiting"},
  // [supervision]
  {"supervision", "restart_budget", kind::integer, false,
   [](rc& c, const vr& v) { c.supervision.restart_budget = v.non_negative(); },
   [](const rc& c) { return w_int(c.supervision.restart_budget); },
   "restarts allowed per drafter within window_s; one more failure stops the run"},
  {"supervision", "backoff_s", kind::number_array, false,
   [](rc& c, const vr& v) {
     auto& arr = v.array("an array of non-negative numbers");
     std::vector<double> out;
     for (size_t i = 0; i < arr.size(); ++i)
       out.push_back(v.element(i, arr[i]).number(0, false, 86400, false, "a number of seconds from 0 to 86400 (a day)"));
     c.supervision.backoff_s = out;
   },
   [](const rc& c) { return w_nums(c.supervision.backoff_s); },
   "seconds to wait before restart 1, 2, ... (the last value repeats; [] = at once)"},
  {"supervision", "window_s", kind::number, false,
   [](rc& c, const vr& v) { c.supervision.window_s = v.positive_number(); },
   [](const rc& c) { return w_num(c.supervision.window_s); },
   "failures older than this many seconds do not count against the budget"},
  {"supervision", "worker_restarts", kind::integer, false,
   [](rc& c, const vr& v) { c.supervision.worker_restarts = v.non_negative(); },
   [](const rc& c) { return w_int(c.supervision.worker_restarts); },
   "new worker processes `tandem run` starts after its worker died (a signal, or a lost CUDA context: "
   "exit status 75), each resuming from the newest restore point; 0 = the run ends with the worker"},
  // [eval]
  {"eval", "prompts", kind::path, false,
   [](rc& c, const vr& v) { c.eval.prompts = v.path(true); },
   [](const rc& c) { return w_path(c.eval.prompts); },
   "held-out conversations (JSONL in the formats `tandem prepare` reads; each up to its first\n"
   "assistant turn is a prompt, rendered with data.tokenizer's chat template) for real tau during\n"
   "training: an eval actor decodes them speculatively with snapshots of the drafter; \"\" = none"},
  {"eval", "count", kind::integer, false,
   [](rc& c, const vr& v) { c.eval.count = v.positive(); },
   [](const rc& c) { return w_int(c.eval.count); },
   "the first N prompts of eval.prompts"},
  {"eval", "max_new_tokens", kind::integer, false,
   [](rc& c, const vr& v) { c.eval.max_new_tokens = v.positive(); },
   [](const rc& c) { return w_int(c.eval.max_new_tokens); },
   "new tokens per prompt at most"},
  {"eval", "every_steps", kind::integer, false,
   [](rc& c, const vr& v) { c.eval.every_steps = v.non_negative(); },
   [](const rc& c) { return w_int(c.eval.every_steps); },
   "optimizer steps between evaluations (one due while another runs is skipped); 0 = not during training"},
  {"eval", "at_end", kind::boolean, false,
   [](rc& c, const vr& v) { c.eval.at_end = v.boolean(); },
   [](const rc& c) { return w_bool(c.eval.at_end); },
   "evaluate the final weights when the run finishes its steps or epochs (not on a signal)"},
  {"eval", "temperature", kind::number, false,
   [](rc& c, const vr& v) { c.eval.temperature = v.non_negative_number(); },
   [](const rc& c) { return w_num(c.eval.temperature); },
   "0 = greedy; > 0: speculative sampling (lossless in distribution)"},
  {"eval", "device", kind::string, false,
   [](rc& c, const vr& v) {
     auto s = v.node().as_string();
     auto d = s ? parse_device(s->get()) : std::nullopt;
     if (!d || !d->node.empty())
       v.fail("\"auto\", \"cpu\" or \"cuda:N\" (the eval actor runs on the leader)");
     c.eval.device = s->get();
   },
   [](const rc& c) { return w_str(c.eval.device); },
   "\"auto\" (a GPU no other actor uses, else the first drafter's device, with a second copy of the\n"
   "target there, else the CPU), \"cpu\" or \"cuda:N\""},
  // [control]
  {"control", "listen", kind::string, false,
   [](rc& c, const vr& v) {
     const auto* node = v.node().as_string();
     if (node == nullptr)
       v.fail("\"HOST:PORT\" (e.g. \"127.0.0.1:0\") or \"\"");
     const std::string text = node->get();
     if (!text.empty()) {
       if (!parse_listen(text))
         v.fail("\"HOST:PORT\" (e.g. \"127.0.0.1:0\"; HOST an IPv4 address, localhost or [::1]) or \"\"");
     }
     c.control.listen = text;
   },
   [](const rc& c) { return w_str(c.control.listen); },
   "the control endpoint's address, \"HOST:PORT\" (port 0: any free port; the address and a token are\n"
   "written to RUN_DIR/control.json); off loopback only with control.tls_cert and control.tls_key;\n"
   "`tandem shell RUN_DIR` connects to it; \"\" = none"},
  {"control", "tls_cert", kind::path, false,
   [](rc& c, const vr& v) { c.control.tls_cert = v.path(true); },
   [](const rc& c) { return w_path(c.control.tls_cert); },
   "PEM certificate chain of the endpoint (with control.tls_key: HTTPS on every connection; its\n"
   "subject alternative names must hold the address clients use); \"\" = plain HTTP (loopback only)"},
  {"control", "tls_key", kind::path, false,
   [](rc& c, const vr& v) { c.control.tls_key = v.path(true); },
   [](const rc& c) { return w_path(c.control.tls_key); },
   "PEM private key of control.tls_cert"},
  // [cluster]
  {"cluster", "listen", kind::string, false,
   [](rc& c, const vr& v) {
     const auto* node = v.node().as_string();
     if (node == nullptr || (!node->get().empty() && !parse_listen(node->get())))
       v.fail("\"HOST:PORT\" (e.g. \"127.0.0.1:7070\"; HOST an IPv4 address, localhost or [::1]) or \"\"");
     c.cluster.listen = node->get();
   },
   [](const rc& c) { return w_str(c.cluster.listen); },
   "the leader's address for its members (`tandem node --join HOST:PORT`; `tandem run --listen` sets it);\n"
   "off loopback only with cluster.certs (TLS between nodes); \"\" = no cluster (a placement naming nodes needs it)"},
  {"cluster", "name", kind::string, false,
   [](rc& c, const vr& v) {
     const auto n = v.string();
     if (!valid_node_name(n))
       v.fail("a node name (lowercase letters, digits and '-'; not cpu, cuda or auto)");
     c.cluster.name = n;
   },
   [](const rc& c) { return w_str(c.cluster.name); },
   "the leader's node name (`tandem run --name`); a placement entry \"NAME:cuda:N\" is the leader's own device"},
  {"cluster", "join_timeout_s", kind::number, false,
   [](rc& c, const vr& v) { c.cluster.join_timeout_s = v.seconds_up_to_a_day(); },
   [](const rc& c) { return w_num(c.cluster.join_timeout_s); },
   "how long the leader waits for the nodes its placement names (then fails, naming the missing ones)"},
  {"cluster", "heartbeat_s", kind::number, false,
   [](rc& c, const vr& v) { c.cluster.heartbeat_s = v.seconds_up_to_a_day(); },
   [](const rc& c) { return w_num(c.cluster.heartbeat_s); },
   "seconds between CAF middleman heartbeats on every connection between nodes"},
  {"cluster", "timeout_s", kind::number, false,
   [](rc& c, const vr& v) { c.cluster.timeout_s = v.seconds_up_to_a_day(); },
   [](const rc& c) { return w_num(c.cluster.timeout_s); },
   "a connection silent this long is dead (its node's actors are down); more than heartbeat_s"},
  {"cluster", "secret", kind::path, false,
   [](rc& c, const vr& v) { c.cluster.secret = v.path(true); },
   [](const rc& c) { return w_path(c.cluster.secret); },
   "the cluster secret (`tandem certs DIR` writes DIR/cluster.secret): a member must present its name's\n"
   "join token (DIR/NODE/join.token); \"\" = none checked (loopback only)"},
  {"cluster", "certs", kind::path, false,
   [](rc& c, const vr& v) { c.cluster.certs = v.path(true); },
   [](const rc& c) { return w_path(c.cluster.certs); },
   "the leader's folder from `tandem certs DIR --nodes ...` (DIR/NAME: cert.pem, key.pem, ca.pem): every\n"
   "connection between nodes is TLS, and a member must hold a certificate of the same CA; needed off\n"
   "loopback; \"\" = plain TCP"},
  {"cluster", "transport", kind::string, false,
   [](rc& c, const vr& v) { c.cluster.transport = v.choice({"auto", "nccl"}); },
   [](const rc& c) { return w_str(c.cluster.transport); },
   "how batches and features cross processes: \"auto\" = through shared memory (CPU) or CUDA IPC between\n"
   "processes of one host, pulled over NCCL between hosts (GPU placements; CPU members must share a\n"
   "host); \"nccl\" = over NCCL between any two processes, also on one host (GPU placements only)"},
  // [metrics]
  {"metrics", "jsonl", kind::path, false,
   [](rc& c, const vr& v) { c.metrics.jsonl = v.relative_path(true); },
   [](const rc& c) { return w_path(c.metrics.jsonl); },
   "JSON-lines metrics log, relative to run.output_dir; \"\" = none"},
  {"metrics", "progress", kind::boolean, false,
   [](rc& c, const vr& v) { c.metrics.progress = v.boolean(); },
   [](const rc& c) { return w_bool(c.metrics.progress); },
   "show a progress line on the terminal"},
  {"metrics", "every_s", kind::number, false,
   [](rc& c, const vr& v) { c.metrics.every_s = v.positive_number(); },
   [](const rc& c) { return w_num(c.metrics.every_s); },
   "seconds between progress-line updates"},
  {"metrics", "tensorboard", kind::path, false,
   [](rc& c, const vr& v) { c.metrics.tensorboard = v.relative_path(true); },
   [](const rc& c) { return w_path(c.metrics.tensorboard); },
   "folder of TensorBoard event files (the logged steps' scalars and the evaluations'),\n"
   "relative to run.output_dir; \"\" = none"},
  // [run]
  {"run", "output_dir", kind::path, false,
   [](rc& c, const vr& v) { c.run.output_dir = v.path(false); },
   [](const rc& c) { return w_path(c.run.output_dir); },
   "where checkpoints, metrics and the effective config go;\n"
   "default runs/<config file stem> in the working directory"},
  {"run", "name", kind::string, false,
   [](rc& c, const vr& v) { c.run.name = v.string(); },
   [](const rc& c) { return w_str(c.run.name); },
   "the run's name in metrics and logs; default the config file's stem"},
};
// clang-format on

struct section_def {
  std::string_view name, doc;
};

const section_def sections[] = {
  {"model", "the frozen target model"},
  {"drafter", "the DFlash drafter being trained"},
  {"data", "the prepared token shards and how they are packed"},
  {"train", "optimizer and schedule: AdamW, linear warm-up, cosine decay"},
  {"placement", "which device each actor owns"},
  {"runtime", "flow control and liveness"},
  {"checkpoint", "snapshots"},
  {"supervision", "restarting failed drafters"},
  {"eval", "real tau during training: held-out prompts decoded speculatively with drafter snapshots"},
  {"control", "the control endpoint: tandem shell, /metrics"},
  {"cluster", "a run spread over member nodes (tandem node): the leader's address and liveness"},
  {"faults", "injected failures, for tests: [[faults.inject]] tables"},
  {"metrics", "what is recorded and shown"},
  {"run", "where the run's outputs go"},
};

const char* const fault_keys[] = {"drafter", "target", "prefetch", "kind", "at_step"};
const char* const fault_roles[] = {"drafter", "target", "prefetch"};
constexpr std::string_view fault_usage =
  "drafter=N,kind=throw|nan|hang|slow_snapshot|throw_in_snapshot|cuda_error|cuda_sticky|abort,at_step=S, "
  "or target=N / prefetch=N with kind throw|abort (at_step: its at_step-th batch)";

/// Exactly one role key; a target's or prefetch's fault is "throw" or "abort".
void check_fault_role(fault_spec& f, const std::vector<std::string>& roles_given, const std::string& where) {
  if (roles_given.size() != 1)
    throw config_error(where + ": name one actor: drafter=N, target=N or prefetch=N (got "
                       + std::to_string(roles_given.size()) + ")");
  f.role = roles_given.front();
  if (f.role != "drafter" && f.kind != "throw" && f.kind != "abort")
    throw config_error(where + ": kind '" + f.kind + "' applies to drafters only; a " + f.role
                       + " fault is throw or abort");
  if (f.role == "drafter" && f.at_step == 0)
    throw config_error(where + ": 'at_step' must be at least 1 (a drafter's steps count from 1; at 0 the "
                               "fault would never fire)");
}

const field_def* find_field(std::string_view section, std::string_view key) {
  for (auto& f : fields)
    if (f.section == section && f.key == key) return &f;
  return nullptr;
}

bool known_section(std::string_view name) {
  return std::any_of(std::begin(sections), std::end(sections),
                     [&](auto& s) { return s.name == name; });
}

/// Every (section, key) pair the schema knows, faults included.
std::vector<std::pair<std::string, std::string>> known_keys() {
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& s : sections) {
    if (s.name == "faults") {
      out.emplace_back("faults", "inject");
      for (auto k : fault_keys) out.emplace_back("faults.inject", k);
    }
    for (auto& f : fields)
      if (f.section == s.name) out.emplace_back(std::string(f.section), std::string(f.key));
  }
  return out;
}

/// The closest known "section.key" to an unknown one, if any is close:
/// same section first (edit distance ≤ 2 or initials), then the same key
/// in another section (or within one edit of it).
std::optional<std::string> suggest_key(std::string_view section, std::string_view key) {
  std::optional<std::string> best;
  int best_score = std::numeric_limits<int>::max();
  for (auto& [s, k] : known_keys()) {
    std::optional<int> score;
    if (s == section) {
      score = closeness(key, k);
    } else {
      size_t d = edit_distance(key, k);
      if (d <= 1) score = 4 + static_cast<int>(d);
    }
    if (score && *score < best_score) best_score = *score, best = s + "." + k;
  }
  return best;
}

std::optional<std::string> suggest_section(std::string_view name) {
  std::optional<std::string> best;
  size_t best_d = 3;
  for (auto& s : sections) {
    size_t d = edit_distance(name, s.name);
    if (d < best_d) best_d = d, best = std::string(s.name);
  }
  return best;
}

std::string unknown(std::string_view what, const std::string& name,
                    const std::optional<std::string>& suggestion) {
  std::string msg = "unknown " + std::string(what) + " '" + name + "'";
  if (suggestion) msg += " (did you mean '" + *suggestion + "'?)";
  return msg;
}

/// Unknown sections and keys, every one of them, in file order.
void check_keys(const toml::table& root, const std::string& file) {
  std::vector<std::pair<toml::source_position, std::string>> problems;
  auto add = [&](const toml::key& k, std::string msg) {
    problems.emplace_back(k.source().begin, locate(file, k.source()) + ": " + msg);
  };
  for (auto&& [k, v] : root) {
    std::string name(k.str());
    if (!known_section(name)) {
      if (v.is_table()) add(k, unknown("section", name, suggest_section(name)));
      else add(k, unknown("key", name, suggest_key("", name)));
      continue;
    }
    auto section = v.as_table();
    if (!section) {
      problems.emplace_back(v.source().begin, locate(file, v.source()) + ": '" + name +
                                                  "' must be a table ([" + name + "]), got " +
                                                  describe(v));
      continue;
    }
    for (auto&& [k2, v2] : *section) {
      std::string key(k2.str());
      bool known = name == "faults" ? key == "inject" : find_field(name, key) != nullptr;
      if (!known) add(k2, unknown("key", name + "." + key, suggest_key(name, key)));
    }
    if (name != "faults") continue;
    auto inject = (*section)["inject"].as_array();
    if (!inject) continue;  // a type error, reported when read
    for (auto& entry : *inject) {
      auto t = entry.as_table();
      if (!t) continue;
      for (auto&& [k3, v3] : *t) {
        std::string key(k3.str());
        if (std::find(std::begin(fault_keys), std::end(fault_keys), key) == std::end(fault_keys))
          add(k3, unknown("key", "faults.inject." + key, suggest_key("faults.inject", key)));
      }
    }
  }
  if (problems.empty()) return;
  std::stable_sort(problems.begin(), problems.end(), [](auto& a, auto& b) {
    return std::tie(a.first.line, a.first.column) < std::tie(b.first.line, b.first.column);
  });
  std::vector<std::string> lines;
  for (auto& p : problems) lines.push_back(p.second);
  throw config_error(join(lines, "\n"));
}

std::string trim(std::string_view s) {
  auto b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  auto e = s.find_last_not_of(" \t");
  return std::string(s.substr(b, e - b + 1));
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    auto pos = s.find(sep, start);
    out.push_back(trim(s.substr(start, pos == std::string_view::npos ? pos : pos - start)));
    if (pos == std::string_view::npos) return out;
    start = pos + 1;
  }
}

/// TOML value text → its node, or nothing when it does not parse as one value.
std::optional<toml::table> parse_value(const std::string& text) {
  try {
    auto t = toml::parse("v = " + text + "\n", std::string_view("<--set>"));
    if (t.size() == 1 && t.contains("v")) return t;
  } catch (const toml::parse_error&) {
  }
  return std::nullopt;
}

/// The flags of `tandem run` that set one field each ("--listen=X" is
/// "cluster.listen=X"), so that an error names the flag that was typed.
constexpr std::pair<std::string_view, std::string_view> flag_fields[] = {
  {"--listen", "cluster.listen"}, {"--name", "cluster.name"}};

/// Puts `--set section.key=value` (or a flag of flag_fields, "--flag=value")
/// into `root`; returns the field's name.
std::string apply_override(toml::table& root, const std::string& given,
                           std::map<std::string, std::string>& from_cli) {
  std::string arg = given, where = "--set " + given;
  for (auto [flag, field] : flag_fields)
    if (given.rfind(std::string(flag) + "=", 0) == 0) {
      std::string value = given.substr(flag.size() + 1);
      arg = std::string(field) + "=" + value;
      where = std::string(flag) + " '" + value + "'";
    }
  auto eq = arg.find('=');
  if (eq == std::string::npos)
    throw config_error(where + ": expected SECTION.KEY=VALUE (e.g. --set train.lr=3e-4)");
  std::string name = trim(std::string_view(arg).substr(0, eq));
  std::string text = trim(std::string_view(arg).substr(eq + 1));
  auto dot = name.rfind('.');
  std::string section = dot == std::string::npos ? "" : name.substr(0, dot);
  std::string key = dot == std::string::npos ? name : name.substr(dot + 1);
  if (section == "faults" || section.rfind("faults.", 0) == 0)
    throw config_error(where + ": faults cannot be set with --set; use --fault " +
                       std::string(fault_usage));
  const field_def* f = find_field(section, key);
  if (!f)
    throw config_error(where + ": " +
                       unknown("key", name,
                               known_section(section) || section.empty()
                                 ? suggest_key(section, key)
                                 : suggest_key(suggest_section(section).value_or(section), key)));

  bool stringy = f->type == kind::string || f->type == kind::path;
  bool array = f->type == kind::int_array || f->type == kind::number_array ||
               f->type == kind::string_array || f->type == kind::path_array;
  auto* sec = root[f->section].as_table();
  if (!sec) {
    root.insert_or_assign(f->section, toml::table{});
    sec = root[f->section].as_table();
  }
  auto put = [&](const toml::node& n) { n.visit([&](auto&& x) { sec->insert_or_assign(key, x); }); };

  auto parsed = parse_value(text);
  const toml::node* node = parsed ? (*parsed)["v"].node() : nullptr;
  if (stringy && (!node || !node->is_string())) {
    sec->insert_or_assign(key, text);  // a bare word: the text itself
  } else if (array && !(node && node->is_array())) {
    if (node) {  // one value: an array of one
      toml::array a;
      node->visit([&](auto&& x) { a.push_back(x); });
      sec->insert_or_assign(key, std::move(a));
    } else if (auto list = parse_value("[" + text + "]")) {  // 1,9,17
      put(*(*list)["v"].node());
    } else if (f->type == kind::string_array || f->type == kind::path_array) {  // cuda:0,cuda:1
      toml::array a;
      for (auto& item : split(text, ',')) a.push_back(item);
      sec->insert_or_assign(key, std::move(a));
    } else {
      sec->insert_or_assign(key, text);  // fails when read, showing the text
    }
  } else if (node) {
    put(*node);
  } else {
    sec->insert_or_assign(key, text);  // fails when read, showing the text
  }
  from_cli[name] = where;
  return name;
}

/// Reads one [[faults.inject]] table.
fault_spec read_fault(const toml::table& t, size_t index, const std::string& file) {
  std::string prefix = "faults.inject[" + std::to_string(index) + "]";
  fault_spec f;
  std::vector<std::string> roles;
  for (auto key : fault_keys) {
    auto n = t.get(key);
    const bool role = std::find(std::begin(fault_roles), std::end(fault_roles), std::string_view(key))
                      != std::end(fault_roles);
    if (!n && role)
      continue;
    if (!n)
      throw config_error(locate(file, t.source()) + ": " + prefix + " is missing '" + key +
                         "' (a fault is " + std::string(fault_usage) + ")");
    value_reader v(*n, prefix + "." + key, file, "", {});
    if (role) {
      f.drafter = v.non_negative();
      roles.emplace_back(key);
    } else if (std::string_view(key) == "kind") {
      f.kind = v.choice(fault_kinds());
    } else {
      f.at_step = v.non_negative();
    }
  }
  check_fault_role(f, roles, locate(file, t.source()) + ": " + prefix);
  return f;
}

run_config read_config(toml::table& root, const fs::path& source,
                       const std::vector<std::string>& overrides) {
  const std::string file = source.string();
  const fs::path base = fs::absolute(source).parent_path();
  std::map<std::string, std::string> from_cli;  // field → its --set argument
  check_keys(root, file);
  for (auto& arg : overrides) apply_override(root, arg, from_cli);

  run_config c;
  c.source = source;
  auto& where = c.origin;  // field → where its value came from
  for (auto& f : fields) {
    std::string name = std::string(f.section) + "." + std::string(f.key);
    auto sec = root[f.section].as_table();
    auto node = sec ? sec->get(f.key) : nullptr;
    if (!node) {
      if (f.required) {
        std::string at = sec ? locate(file, sec->source()) : file;
        throw config_error(at + ": missing required key '" + name + "' (" +
                           std::string(f.doc.substr(0, f.doc.find(';'))) + ")");
      }
      continue;
    }
    auto cli = from_cli.find(name);
    value_reader v(*node, name, file, cli == from_cli.end() ? "" : cli->second, base);
    f.read(c, v);
    where[name] = v.where();
  }

  if (auto faults = root["faults"].as_table()) {
    auto inject_node = faults->get("inject");
    if (inject_node) {
      value_reader v(*inject_node, "faults.inject", file, "", base);
      auto& arr = v.array("an array of tables ([[faults.inject]])");
      for (size_t i = 0; i < arr.size(); ++i) {
        auto t = arr[i].as_table();
        if (!t) v.element(i, arr[i]).fail("a table {drafter, kind, at_step}");
        c.faults.push_back(read_fault(*t, i, file));
      }
    }
  }

  // Defaults that depend on the file, and checks across fields.
  if (c.run.output_dir.empty())
    c.run.output_dir = (fs::absolute("runs") / source.stem()).lexically_normal();
  if (c.run.name.empty()) c.run.name = source.stem().string();
  if (c.data.path.empty()) {
    if (c.data.sources.empty()) {
      auto sec = root["data"].as_table();
      std::string at = sec ? locate(file, sec->source()) : file;
      throw config_error(at + ": missing required key 'data.path' (a `tandem prepare` output "
                         "folder; or give data.sources to prepare one)");
    }
    c.data.path = c.run.output_dir / "data";
  }
  if (c.data.tokenizer.empty()) c.data.tokenizer = c.model.target;
  if (c.control.tls_cert.empty() != c.control.tls_key.empty()) {
    const char* k = c.control.tls_cert.empty() ? "control.tls_key" : "control.tls_cert";
    throw config_error(c.at(k) + "'" + k
                       + "' needs its partner (control.tls_cert and control.tls_key go together)");
  }
  if (!c.control.listen.empty() && c.control.tls_cert.empty() && !parse_listen(c.control.listen)->loopback())
    throw config_error(c.at("control.listen") + "'control.listen' ("
                       + c.control.listen + ") is not a loopback address: off loopback the endpoint serves only "
                       "TLS; set control.tls_cert and control.tls_key (PEM files), or listen on 127.0.0.1 and reach "
                       "it through an SSH tunnel (ssh -L PORT:127.0.0.1:PORT host)");
  if (!c.cluster.listen.empty() && c.cluster.certs.empty() && !parse_listen(c.cluster.listen)->loopback())
    throw config_error(c.at("cluster.listen") + "'cluster.listen' ("
                       + c.cluster.listen + ") is not a loopback address: between hosts the nodes speak TLS only; "
                       "set cluster.certs to the leader's folder of `tandem certs DIR --nodes ...` (and give each "
                       "member --certs), or listen on 127.0.0.1 (members on this host)");
  if (!c.cluster.listen.empty() && !c.cluster.certs.empty() && c.cluster.secret.empty())
    throw config_error(c.at("cluster.certs") + "'cluster.certs' needs 'cluster.secret' too: CAF's TLS checks that "
                       "a member's certificate "
                       "is the cluster CA's, not whose it is; the join token binds its name (tandem certs writes "
                       "DIR/cluster.secret)");
  if (c.cluster.transport == "nccl")
    for (const auto* list : {&c.placement.targets, &c.placement.drafters, &c.placement.spares})
      for (const auto& text : *list)
        if (auto d = parse_device(text); d && !d->is_auto && d->device < 0)
          throw config_error(c.at("cluster.transport")
                             + "'cluster.transport' is \"nccl\" but the placement puts an actor on the CPU ('"
                             + text + "'): NCCL moves GPU memory; CPU processes exchange payloads through "
                             "shared memory, on one host (transport = \"auto\")");
  if (c.cluster.timeout_s <= c.cluster.heartbeat_s)
    throw config_error(c.at("cluster.timeout_s") + "'cluster.timeout_s' (" + w_num(c.cluster.timeout_s)
                       + ") must be more than 'cluster.heartbeat_s' (" + w_num(c.cluster.heartbeat_s) + ")");
  if (c.data.seq_len < c.drafter.block_size) {
    // Both named where they were set: the file's line, or the --set that
    // changed one of them.
    auto at = [&](const char* name) { return where.count(name) ? where[name] : std::string("its default"); };
    throw config_error(c.at("data.seq_len") + "'data.seq_len' ("
                       + std::to_string(c.data.seq_len) + ", " + at("data.seq_len")
                       + ") must be at least 'drafter.block_size' (" + std::to_string(c.drafter.block_size) + ", "
                       + at("drafter.block_size") + ")");
  }
  if (c.data.max_docs > c.data.seq_len) {
    // A document is one token at least; the prefetch allocates rows x max_docs
    // per batch.  The default follows a shorter row; a value given is refused.
    if (!where.count("data.max_docs")) {
      c.data.max_docs = c.data.seq_len;
    } else {
      throw config_error(where["data.max_docs"] + ": 'data.max_docs' (" + std::to_string(c.data.max_docs)
                         + ") must be at most data.seq_len = " + std::to_string(c.data.seq_len)
                         + ": a document is one token at least");
    }
  }
  if (c.data.anchors > c.data.seq_len - c.drafter.block_size + 1) {
    // Anchors are distinct positions a <= seq_len - block_size (dflash_objective.hpp):
    // more slots than that are padding that costs a block each.  The default
    // follows a shorter row; a value given is refused.
    if (!where.count("data.anchors")) {
      c.data.anchors = c.data.seq_len - c.drafter.block_size + 1;
      return c;
    }
    auto at = where["data.anchors"];
    throw config_error(at + ": 'data.anchors' (" + std::to_string(c.data.anchors)
                       + ") must be at most data.seq_len - drafter.block_size + 1 = "
                       + std::to_string(c.data.seq_len - c.drafter.block_size + 1)
                       + ": a draft block starts at a distinct position of a row");
  }
  return c;
}

} // namespace

const std::vector<std::string>& fault_kinds() {
  static const std::vector<std::string> kinds{"throw", "nan", "hang", "slow_snapshot", "throw_in_snapshot",
                                              "cuda_error", "cuda_sticky", "abort"};
  return kinds;
}

// ------------------------------------------------------------------ public --

std::string fault_spec::to_string() const {
  return role + "=" + std::to_string(drafter) + ",kind=" + kind +
         ",at_step=" + std::to_string(at_step);
}

run_config parse_run_config(std::string_view toml_text, const fs::path& source,
                            const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(toml_text, std::string_view(source.string()));
  } catch (const toml::parse_error& e) {
    throw config_error(locate(source.string(), e.source()) +
                       ": TOML syntax error: " + std::string(e.description()));
  }
  return read_config(root, source, overrides);
}

run_config load_run_config(const fs::path& toml_file, const std::vector<std::string>& overrides) {
  std::error_code ec;
  std::ifstream in(toml_file, std::ios::binary);
  if (!in || fs::is_directory(toml_file, ec)) {  // a folder opens, and reads as an empty file
    std::string why = !fs::exists(toml_file, ec) ? "no such file"
                      : fs::is_directory(toml_file, ec) ? "a folder, not a file"
                                                        : "cannot be read";
    throw config_error(toml_file.string() + ": " + why);
  }
  std::ostringstream text;
  text << in.rdbuf();
  return parse_run_config(text.str(), toml_file, overrides);
}

fault_spec parse_fault(const std::string& spec) {
  std::string where = "--fault " + spec;
  auto usage = " (a fault is " + std::string(fault_usage) + ")";
  std::map<std::string, std::string> values;
  for (auto& item : split(spec, ',')) {
    auto eq = item.find('=');
    if (item.empty() || eq == std::string::npos)
      throw config_error(where + ": expected KEY=VALUE, got '" + item + "'" + usage);
    std::string key = trim(std::string_view(item).substr(0, eq));
    std::string value = trim(std::string_view(item).substr(eq + 1));
    if (std::find(std::begin(fault_keys), std::end(fault_keys), key) == std::end(fault_keys)) {
      std::optional<std::string> near;
      for (auto k : fault_keys)
        if (closeness(key, k)) { near = k; break; }
      throw config_error(where + ": " + unknown("key", key, near) + usage);
    }
    if (!values.emplace(key, value).second)
      throw config_error(where + ": '" + key + "' given twice");
  }
  auto integer = [&](const std::string& key) -> int64_t {
    const std::string& s = values[key];
    int64_t x = -1;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
    if (s.empty() || ec != std::errc{} || end != s.data() + s.size() || x < 0)
      throw config_error(where + ": '" + key + "' must be a non-negative integer, got " +
                         quote(s));
    return x;
  };
  for (auto key : {"kind", "at_step"})
    if (!values.count(key))
      throw config_error(where + ": missing '" + std::string(key) + "'" + usage);
  fault_spec f;
  std::vector<std::string> roles;
  for (auto role : fault_roles)
    if (values.count(role)) {
      roles.emplace_back(role);
      f.drafter = integer(role);
    }
  f.at_step = integer("at_step");
  f.kind = values["kind"];
  if (std::find(fault_kinds().begin(), fault_kinds().end(), f.kind) == fault_kinds().end()) {
    std::string list;
    for (const auto& k : fault_kinds())
      list += (list.empty() ? "" : ", ") + quote(k);
    throw config_error(where + ": 'kind' must be one of " + list + ", got " + quote(f.kind));
  }
  check_fault_role(f, roles, where);
  return f;
}

namespace {

/// A positive integer field of the target's config.json (the loader,
/// gpu/io/hf_config.hpp, checks the rest when the target loads).
int64_t target_count(const nlohmann::json& j, const fs::path& json_file, const char* key,
                     const std::string& file) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() <= 0)
    throw config_error(file + ": 'model.target': " + json_file.string() + ": field '" + key +
                       "' must be a positive integer" +
                       (it == j.end() ? std::string(", and it is missing")
                                      : ", got " + it->dump()));
  return it->get<int64_t>();
}

/// The drafter's settings that index into the target: drafter.mask_token_id
/// must be a row of its embedding and every model.tap_layers entry one of
/// its layers.  Read from the target's config.json before any actor starts
/// (the engines check the same again when they load, too late for a clear
/// config error: a drafter that fails there is a failed worker).
void check_against_target(const run_config& c, const std::string& file) {
  const auto json_file = c.model.target / "config.json";
  nlohmann::json j;
  {
    std::ifstream in(json_file, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    try {
      j = nlohmann::json::parse(text.str());
    } catch (const nlohmann::json::exception& e) {
      throw config_error(file + ": 'model.target': " + json_file.string() +
                         " is not valid JSON: " + e.what());
    }
  }
  if (!j.is_object())
    throw config_error(file + ": 'model.target': " + json_file.string() +
                       " must hold a JSON object");
  const auto vocab = target_count(j, json_file, "vocab_size", file);
  const auto layers = target_count(j, json_file, "num_hidden_layers", file);
  if (c.drafter.mask_token_id < 0 || c.drafter.mask_token_id >= vocab)
    throw config_error(file + ": 'drafter.mask_token_id' = " +
                       std::to_string(c.drafter.mask_token_id) +
                       " is not a row of the target's embedding: " + json_file.string() +
                       " has vocab_size = " + std::to_string(vocab) + " (ids 0 .. " +
                       std::to_string(vocab - 1) + "; Qwen3 uses 151669)");
  for (size_t i = 0; i < c.model.tap_layers.size(); ++i) {
    const auto id = c.model.tap_layers[i];
    if (id < 0 || id >= layers)
      throw config_error(file + ": 'model.tap_layers[" + std::to_string(i) + "]' = " +
                         std::to_string(id) + " is not a layer of the target: " +
                         json_file.string() + " has num_hidden_layers = " +
                         std::to_string(layers) + " (layers 0 .. " +
                         std::to_string(layers - 1) + ")");
  }
}

} // namespace

void check_paths(const run_config& c, bool need_data) {
  const std::string file = c.source.empty() ? std::string("config") : c.source.string();
  auto fail = [&](std::string_view field, const fs::path& p, const std::string& why) {
    throw config_error(file + ": '" + std::string(field) + "' = " + quote(p.string()) + ": " + why);
  };
  std::error_code ec;
  auto folder_with = [&](std::string_view field, const fs::path& dir, const std::string& what,
                         auto&& has) {
    if (!fs::exists(dir, ec)) fail(field, dir, "no such folder");
    if (!fs::is_directory(dir, ec)) fail(field, dir, "not a folder");
    if (::access(dir.c_str(), R_OK | X_OK) != 0)
      fail(field, dir, std::string("cannot read it: ") + std::strerror(errno));
    if (!has(dir)) fail(field, dir, "no " + what + " there");
  };
  auto has_file = [&](const char* name) {
    return [name, &ec](const fs::path& d) { return fs::is_regular_file(d / name, ec); };
  };
  folder_with("model.target", c.model.target, "config.json (a Hugging Face model folder)",
              has_file("config.json"));
  folder_with("model.target", c.model.target, "*.safetensors weights", [&](const fs::path& d) {
    for (auto& e : fs::directory_iterator(d, ec))
      if (e.path().extension() == ".safetensors") return true;
    return false;
  });
  check_against_target(c, file);
  if (!c.cluster.listen.empty()) {
    // The leader's secret and TLS folder, before the run folder is touched
    // (the leader read them once it had written its lock and config.toml).
    if (!c.cluster.secret.empty()) {
      if (!fs::is_regular_file(c.cluster.secret, ec))
        fail("cluster.secret", c.cluster.secret,
             fs::exists(c.cluster.secret, ec) ? "not a file" : "no such file (tandem certs DIR writes DIR/cluster.secret)");
      if (::access(c.cluster.secret.c_str(), R_OK) != 0)
        fail("cluster.secret", c.cluster.secret, std::string("cannot read it: ") + std::strerror(errno));
    }
    if (!c.cluster.certs.empty()) {
      if (!fs::is_directory(c.cluster.certs, ec))
        fail("cluster.certs", c.cluster.certs, fs::exists(c.cluster.certs, ec) ? "not a folder" : "no such folder");
      for (const char* f : {"cert.pem", "key.pem", "ca.pem"})
        if (!fs::is_regular_file(c.cluster.certs / f, ec))
          fail("cluster.certs", c.cluster.certs,
               std::string("no ") + f + " there (give the leader's folder of `tandem certs DIR --nodes ...`)");
    }
  }
  if (!c.drafter.init_from.empty()) {
    // What the drafter's warm start reads (gpu/engine/drafter_engine.cpp,
    // warm_start), checked before anything is written.
    const auto& from = c.drafter.init_from;
    if (!fs::exists(from, ec)) fail("drafter.init_from", from, "no such folder");
    if (!fs::is_directory(from, ec))
      fail("drafter.init_from", from, "not a folder (a Tandem checkpoint folder, or a z-lab DFlash export folder)");
    if (!fs::is_regular_file(from / "weights.safetensors", ec)
        && !(fs::is_regular_file(from / "config.json", ec) && fs::is_regular_file(from / "model.safetensors", ec)))
      fail("drafter.init_from", from, "neither a Tandem checkpoint (weights.safetensors) nor a z-lab DFlash export "
                                      "(config.json + model.safetensors)");
  }
  for (size_t i = 0; i < c.data.sources.size(); ++i) {
    const auto& p = c.data.sources[i];
    std::string field = "data.sources[" + std::to_string(i) + "]";
    if (!fs::exists(p, ec)) fail(field, p, "no such file");
    if (!fs::is_regular_file(p, ec)) fail(field, p, "not a file");
    // The same file twice (by another spelling, a link): its samples would be
    // trained on twice (`tandem prepare` refuses it too, but with its own usage text).
    for (size_t j = 0; j < i; ++j)
      if (fs::equivalent(c.data.sources[j], p, ec))
        fail(field, p, "the same file as 'data.sources[" + std::to_string(j) + "]' = " +
                         quote(c.data.sources[j].string()) + " (its samples would be trained on twice)");
  }
  // Used to prepare data.sources and to render eval.prompts; set, it is
  // checked even where neither is given (a typo there is still a typo).
  // (Not set, it is model.target, which need not hold a tokenizer then.)
  if (!c.data.sources.empty() || (c.data.tokenizer != c.model.target && c.eval.prompts.empty()))
    folder_with("data.tokenizer", c.data.tokenizer, "tokenizer.json (a Hugging Face tokenizer folder)",
                has_file("tokenizer.json"));
  if (need_data)
    folder_with("data.path", c.data.path,
                "manifest.json (prepare the data with `tandem prepare`, or give data.sources)",
                has_file("manifest.json"));
  if (!c.eval.prompts.empty()) {
    if (!fs::exists(c.eval.prompts, ec)) fail("eval.prompts", c.eval.prompts, "no such file");
    if (!fs::is_regular_file(c.eval.prompts, ec)) fail("eval.prompts", c.eval.prompts, "not a file");
    // The prompts are rendered with the data's tokenizer (the target's by default).
    if (c.data.tokenizer.empty())
      folder_with("model.target", c.model.target,
                  "tokenizer.json (eval.prompts are rendered with it; or set data.tokenizer)",
                  has_file("tokenizer.json"));
    else
      folder_with("data.tokenizer", c.data.tokenizer, "tokenizer.json (eval.prompts are rendered with it)",
                  has_file("tokenizer.json"));
  }
}

std::string to_toml(const run_config& c) {
  std::ostringstream out;
  out << "# Tandem run configuration: every field, as the run used it.\n"
      << "# Schema: config/README.md.  Paths are absolute, except checkpoint.dir and\n"
      << "# metrics.jsonl, which are relative to run.output_dir.\n";
  if (!c.source.empty()) out << "# Loaded from " << c.source.string() << ".\n";
  auto comment = [&](std::string_view doc) {
    size_t start = 0;
    while (start <= doc.size()) {
      auto nl = doc.find('\n', start);
      out << "# " << doc.substr(start, nl == std::string_view::npos ? nl : nl - start) << "\n";
      if (nl == std::string_view::npos) break;
      start = nl + 1;
    }
  };
  for (auto& s : sections) {
    out << "\n";
    if (s.name == "faults") {
      comment(std::string("[faults]: ") + std::string(s.doc) + ", one per failure:");
      comment("drafter (its index), kind (\"throw\", \"nan\", \"hang\", \"slow_snapshot\" or \"throw_in_snapshot\"), "
              "at_step (global step)");
      if (c.faults.empty()) out << "# (none)\n";
      for (auto& f : c.faults)
        out << "[[faults.inject]]\n" << f.role << " = " << f.drafter << "\nkind = " << quote(f.kind)
            << "\nat_step = " << f.at_step << "\n";
      continue;
    }
    out << "[" << s.name << "]  # " << s.doc << "\n";
    for (auto& f : fields) {
      if (f.section != s.name) continue;
      comment(f.doc);
      out << f.key << " = " << f.write(c) << "\n";
    }
  }
  return out.str();
}

std::vector<std::string> run_config_keys() {
  std::vector<std::string> out;
  for (auto& [s, k] : known_keys())
    if (!(s == "faults" && k == "inject")) out.push_back(s + "." + k);
  return out;
}

std::string device_string(int32_t device) {
  return device < 0 ? "cpu" : "cuda:" + std::to_string(device);
}

std::string placement_plan::describe() const {
  // The leader's devices first (cpu, then cuda:N), then each member's.
  std::map<std::pair<std::string, int32_t>, std::vector<std::string>> by_device;
  for (auto* role : {&targets, &prefetch, &drafters, &eval, &spares})
    for (auto& s : *role) by_device[{s.node, s.device}].push_back(s.role + " " + std::to_string(s.index));
  std::string out;
  for (auto& [where, actors] : by_device)
    out += (where.first.empty() ? "" : where.first + ":") + device_string(where.second) + ": " + join(actors, ", ")
           + "\n";
  return out;
}

std::vector<std::string> placement_plan::nodes() const {
  std::vector<std::string> out;
  for (auto* role : {&targets, &drafters, &spares})
    for (auto& s : *role)
      if (!s.node.empty() && std::find(out.begin(), out.end(), s.node) == out.end()) out.push_back(s.node);
  return out;
}

bool valid_node_name(const std::string& name) {
  if (name.empty() || name.size() > 63 || name == "cpu" || name == "cuda" || name == "auto" || name[0] == '-')
    return false;
  return name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") == std::string::npos;
}

std::vector<std::string> placement_nodes(const run_config& c) {
  std::vector<std::string> out;
  for (auto* list : {&c.placement.targets, &c.placement.drafters, &c.placement.spares})
    for (auto& text : *list)
      if (auto d = parse_device(text); d && !d->node.empty() && d->node != c.cluster.name &&
                                       std::find(out.begin(), out.end(), d->node) == out.end())
        out.push_back(d->node);
  return out;
}

bool placement_uses_leader(const run_config& c) {
  for (auto* list : {&c.placement.targets, &c.placement.drafters})
    for (auto& text : *list)
      if (auto d = parse_device(text); d && (d->node.empty() || d->node == c.cluster.name))
        return true;
  return false;
}

placement_plan resolve_placement(const run_config& c, int32_t gpus_available) {
  return resolve_placement(c, gpus_available, {});
}

placement_plan resolve_placement(const run_config& c, int32_t gpus_available,
                                 const std::vector<member_devices>& members) {
  std::string at = c.source.empty() ? "" : c.source.string() + ": ";
  // "WHERE: 'FIELD'": the field named where it was set (its line, or its --set).
  auto named = [&](const std::string& field) {
    return (c.source.empty() ? std::string() : c.at(field)) + "'" + field + "'";
  };
  // "WHERE: " of a rule between two fields: where the first was set, else the second.
  auto either = [&](const std::string& a, const std::string& b) {
    return c.source.empty() ? std::string() : c.at(c.origin.count(a) || !c.origin.count(b) ? a : b);
  };
  if (gpus_available < 0)
    throw config_error(at + "resolve_placement: gpus_available must be >= 0, got " +
                       std::to_string(gpus_available));
  struct placed {
    int32_t device;
    std::string node;  // "" = this process
  };
  auto expand = [&](const std::vector<std::string>& list, const std::string& field) {
    if (list.empty()) throw config_error(named(field) + " is empty");
    std::vector<placed> devices;
    for (auto& text : list) {
      auto d = parse_device(text);
      if (!d)
        throw config_error(named(field) + " must hold \"cpu\", \"cuda:N\", \"NODE:cpu\", \"NODE:cuda:N\" or "
                           "\"auto\", got " + quote(text));
      if (d->is_auto) {
        if (list.size() != 1)
          throw config_error(named(field) + ": \"auto\" must be the only entry");
        if (gpus_available == 0) devices.push_back({-1, ""});
        for (int32_t g = 0; g < gpus_available; ++g) devices.push_back({g, ""});
        continue;
      }
      std::string node = d->node == c.cluster.name ? "" : d->node;
      int32_t gpus = gpus_available;
      std::string host = "this host";
      if (!node.empty()) {
        if (c.cluster.listen.empty())
          throw config_error(named(field) + " names node '" + node + "' (" + text +
                             "), but cluster.listen is empty: a placement on member nodes needs a leader "
                             "address (tandem run --listen 127.0.0.1:PORT, or [cluster] listen)");
        auto m = std::find_if(members.begin(), members.end(), [&](const member_devices& x) { return x.name == node; });
        if (m == members.end()) {
          std::string known;
          for (const auto& x : members) known += (known.empty() ? "" : ", ") + x.name;
          throw config_error(named(field) + " names node '" + node + "', which has not joined (joined: " +
                             (known.empty() ? std::string("none") : known) + ")");
        }
        gpus = m->gpus;
        host = "node '" + node + "'";
      }
      if (d->device >= gpus) {
        std::string has = host + " has " + std::to_string(gpus) + (gpus == 1 ? " GPU" : " GPUs");
        if (gpus == 0)
          has += node.empty() ? "; use \"cpu\", or \"auto\" (the GPUs if any, else the CPU)" : "; use \"" + node + ":cpu\"";
        else if (gpus == 1)
          has += " (cuda:0)";
        else
          has += " (cuda:0 to cuda:" + std::to_string(gpus - 1) + ")";
        throw config_error(named(field) + " names " + text + ", but " + has);
      }
      devices.push_back({d->device, node});
    }
    return devices;
  };
  if (c.placement.prefetch != "per_target")
    throw config_error(named("placement.prefetch") + " must be \"per_target\", got " +
                       quote(c.placement.prefetch));

  placement_plan plan;
  auto targets = expand(c.placement.targets, "placement.targets");
  auto drafters = expand(c.placement.drafters, "placement.drafters");
  for (size_t i = 0; i < targets.size(); ++i) {
    plan.targets.push_back({"target", static_cast<int>(i), targets[i].device, targets[i].node});
    plan.prefetch.push_back({"prefetch", static_cast<int>(i), targets[i].device, targets[i].node});
  }
  for (size_t i = 0; i < drafters.size(); ++i)
    plan.drafters.push_back({"drafter", static_cast<int>(i), drafters[i].device, drafters[i].node});
  if (!c.placement.spares.empty()) {
    auto spares = expand(c.placement.spares, "placement.spares");
    std::set<std::pair<std::string, int32_t>> used;
    for (auto& d : drafters) used.insert({d.node, d.device});
    for (size_t i = 0; i < spares.size(); ++i) {
      const auto& sp = spares[i];
      const auto text = c.placement.spares[i];
      if (sp.node.empty())
        throw config_error(named("placement.spares") + " names " + quote(text) + ": a spare is a member's device "
                           "(\"NODE:cuda:N\"); the leader's own devices cannot take over from a lost node");
      if (!used.insert({sp.node, sp.device}).second)
        throw config_error(named("placement.spares") + " names " + quote(text) + ", which a drafter or another spare "
                           "already uses");
      if (drafters.size() > 1 && sp.device < 0)
        throw config_error(named("placement.spares") + " names " + quote(text) + ": data-parallel drafters need a "
                           "CUDA device each");
      plan.spares.push_back({"spare", static_cast<int>(i), sp.device, sp.node});
    }
  }
  if (drafters.size() > 1) {
    // Data-parallel drafters form one NCCL group: one rank per GPU.
    std::set<std::pair<std::string, int32_t>> seen;
    for (auto& d : drafters) {
      if (d.device < 0)
        throw config_error(named("placement.drafters") + ": " + std::to_string(drafters.size()) +
                           " data-parallel drafters need a CUDA device each (NCCL), got \"cpu\"; "
                           "use one drafter on the CPU");
      if (!seen.insert({d.node, d.device}).second)
        throw config_error(named("placement.drafters") + " names " + (d.node.empty() ? "" : d.node + ":") + "cuda:" +
                           std::to_string(d.device) +
                           " twice: data-parallel drafters need distinct GPUs (one NCCL rank each)");
    }
    if (c.runtime.group_timeout_s >= c.runtime.step_timeout_s)
      throw config_error(either("runtime.group_timeout_s", "runtime.step_timeout_s") + "'runtime.group_timeout_s' ("
                         + w_num(c.runtime.group_timeout_s) +
                         ") must be less than 'runtime.step_timeout_s' (" +
                         w_num(c.runtime.step_timeout_s) +
                         "): a drafter's peers must give up on a collective it never joins before "
                         "the watchdog judges the step, so the one that failed is told apart");
    if (!credits_cover_drafters(c.runtime.credits, static_cast<int64_t>(targets.size()),
                                static_cast<int64_t>(drafters.size())))
      throw config_error(either("runtime.credits", "placement.drafters") + "'runtime.credits' ("
                         + std::to_string(c.runtime.credits) + ") x " +
                         std::to_string(targets.size()) + " target(s) is less than the " +
                         std::to_string(drafters.size()) +
                         " data-parallel drafters: a group step needs one batch per drafter");
  }
  if (!c.eval.prompts.empty()) {
    for (auto& d : drafters)
      if (!d.node.empty())
        throw config_error(named("eval.prompts") + ": evaluation during training takes the drafter's snapshots in "
                           "its own process, and drafter(s) run on node '" + d.node +
                           "': not supported yet (run `tandem eval` on a checkpoint instead)");
    int32_t device = -1;
    if (c.eval.device == "auto") {
      // A GPU no other actor uses; else beside the first drafter (a second
      // copy of the target there); else the CPU.
      std::set<int32_t> used;
      for (auto& t : targets) used.insert(t.device);
      for (auto& d : drafters) used.insert(d.device);
      device = drafters.front().device;
      for (int32_t g = 0; g < gpus_available; ++g)
        if (!used.count(g)) {
          device = g;
          break;
        }
    } else {
      device = expand({c.eval.device}, "eval.device").front().device;
    }
    plan.eval.push_back({"eval", 0, device, ""});
  }
  for (auto& f : c.faults)
    if (f.drafter >= static_cast<int64_t>(drafters.size()))
      throw config_error(at + "fault '" + f.to_string() + "' names drafter " +
                         std::to_string(f.drafter) + ", but the placement has " +
                         std::to_string(drafters.size()) +
                         (drafters.size() == 1 ? " drafter (0)"
                                               : " drafters (0 to " +
                                                   std::to_string(drafters.size() - 1) + ")"));
  return plan;
}

bool listen_address::loopback() const {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

namespace {

/// ok(part) for each of the parts of `host` between dots (an empty one
/// included); false at the first it refuses.
template <class Ok>
bool each_dotted_part(const std::string& host, Ok&& ok) {
  size_t i = 0;
  while (i <= host.size()) {
    size_t j = host.find('.', i);
    if (j == std::string::npos)
      j = host.size();
    if (!ok(host.substr(i, j - i)))
      return false;
    i = j + 1;
  }
  return true;
}

} // namespace

std::optional<listen_address> parse_connect(const std::string& text) {
  if (auto a = parse_listen(text))
    return a;
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || text.find(':') != colon)
    return std::nullopt;
  const auto host = text.substr(0, colon);
  // A DNS name: labels of letters, digits and '-' (not at either end), dots
  // between them, not all digits (that is an IPv4 literal, and a bad one).
  if (host.size() > 253 || host.find_first_not_of("0123456789.") == std::string::npos)
    return std::nullopt;
  const bool labels_ok = each_dotted_part(host, [](const std::string& label) {
    return !label.empty() && label.size() <= 63 && label.front() != '-' && label.back() != '-'
           && label.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
                == std::string::npos;
  });
  if (!labels_ok)
    return std::nullopt;
  auto a = parse_listen("127.0.0.1" + text.substr(colon));  // the port, checked as parse_listen does
  if (!a)
    return std::nullopt;
  a->host = host;
  return a;
}

std::optional<listen_address> parse_listen(const std::string& text) {
  // "HOST:PORT", "[::1]:PORT"
  std::string host, port;
  if (!text.empty() && text[0] == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return std::nullopt;
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string::npos || text.find(':') != colon)
      return std::nullopt;
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (host.empty() || port.empty() || port.size() > 5)
    return std::nullopt;
  unsigned value = 0;
  for (char c : port) {
    if (c < '0' || c > '9')
      return std::nullopt;
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value > 65535)
    return std::nullopt;
  if (host != "localhost" && host != "::1") {
    // An IPv4 literal: four numbers 0-255.
    int parts = 0;
    const bool numbers_ok = each_dotted_part(host, [&parts](const std::string& part) {
      ++parts;
      return !part.empty() && part.size() <= 3 && part.find_first_not_of("0123456789") == std::string::npos
             && std::stoi(part) <= 255;
    });
    if (!numbers_ok || parts != 4)
      return std::nullopt;
  }
  return listen_address{host, static_cast<uint16_t>(value)};
}

} // namespace tandem
