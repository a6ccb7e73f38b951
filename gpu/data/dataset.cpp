#include "gpu/pch.hpp"

#include "gpu/data/dataset.hpp"

#include <algorithm>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "gpu/data/sha256.hpp"
#include "gpu/device/error.hpp"
#include "gpu/io/safetensors.hpp"

namespace tandem::gpu::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* dataset_format = "tandem.dataset.v1";
constexpr const char* shard_format = "tandem.shard.v1";

[[noreturn]] void fail(const fs::path& file, const std::string& what) {
  throw error(errc::bad_input, file.string() + ": " + what);
}

/// `where` is a field path for messages ("shards[2].num_tokens").
int64_t require_count(const fs::path& file, const json& parent, const std::string& key,
                      const std::string& where) {
  if (!parent.contains(key))
    fail(file, "missing field '" + where + "'");
  const auto& j = parent[key];
  if (!j.is_number_unsigned()
      || j.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    fail(file, "field '" + where + "' must be a non-negative integer, got " + j.dump());
  return static_cast<int64_t>(j.get<uint64_t>());
}

std::string require_string(const fs::path& file, const json& parent, const std::string& key,
                           const std::string& where) {
  if (!parent.contains(key))
    fail(file, "missing field '" + where + "'");
  const auto& j = parent[key];
  if (!j.is_string())
    fail(file, "field '" + where + "' must be a string, got " + j.dump());
  return j.get<std::string>();
}

std::string optional_string(const fs::path& file, const json& parent, const std::string& key,
                            const std::string& where) {
  if (!parent.contains(key) || parent[key].is_null())
    return {};
  return require_string(file, parent, key, where);
}

const json& require_object(const fs::path& file, const json& parent, const std::string& key,
                           const std::string& where) {
  if (!parent.contains(key))
    fail(file, "missing field '" + where + "'");
  const auto& j = parent[key];
  if (!j.is_object())
    fail(file, "field '" + where + "' must be an object, got " + j.dump());
  return j;
}

json read_json_file(const fs::path& file) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))
    fail(file, "no such file (a dataset folder holds manifest.json and its shards)");
  std::ifstream in(file, std::ios::binary);
  if (!in)
    fail(file, "cannot open");
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad())
    fail(file, "cannot read");
  try {
    return json::parse(text.str());
  } catch (const json::exception& ex) {
    fail(file, std::string("not valid JSON: ") + ex.what());
  }
}

/// A `__metadata__` count ("1000"): decimal digits only.
int64_t metadata_count(const fs::path& file, const std::map<std::string, std::string>& meta,
                       const std::string& key) {
  auto it = meta.find(key);
  if (it == meta.end())
    fail(file, "__metadata__." + key + " is missing");
  const auto& s = it->second;
  bool ok = !s.empty() && s.size() <= 18
            && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!ok)
    fail(file, "__metadata__." + key + " = '" + s + "' is not a non-negative integer");
  return std::stoll(s);
}

} // namespace

/// One mapped shard; the tensors keep the mapping alive.
struct shard_data {
  at::Tensor tokens_t, loss_mask_t, offsets_t;
  const int32_t* tokens = nullptr;
  const uint8_t* loss_mask = nullptr;
  const int64_t* offsets = nullptr;  ///< [num_samples + 1]
  int64_t num_samples = 0;
  int64_t first_sample = 0;
  /// The file as it was mapped (check_unchanged): same inode, size, mtime.
  uint64_t dev = 0, ino = 0;
  int64_t size = -1, mtime_ns = 0;
};

struct dataset::impl {
  fs::path dir;
  manifest_info manifest;
  std::vector<shard_data> shards;
  std::vector<int64_t> first_samples;  ///< shards[i].first_sample, for locate()
  int64_t num_samples = 0;
  int64_t max_length = 0;
};

namespace {

/// Parses and checks manifest.json by itself (no shard opened yet).
manifest_info parse_manifest(const fs::path& file) {
  const json m = read_json_file(file);
  if (!m.is_object())
    fail(file, "must be a JSON object, got a " + std::string(m.type_name()));
  manifest_info out;
  out.format = require_string(file, m, "format", "format");
  if (out.format != dataset_format)
    fail(file, "format = '" + out.format + "', expected '" + dataset_format + "'");
  out.created_by = optional_string(file, m, "created_by", "created_by");

  const auto& tok = require_object(file, m, "tokenizer", "tokenizer");
  out.vocab_size = require_count(file, tok, "vocab_size", "tokenizer.vocab_size");
  if (out.vocab_size < 1 || out.vocab_size > (int64_t{1} << 31))
    fail(file, "tokenizer.vocab_size = " + std::to_string(out.vocab_size)
                   + " is out of range (1 .. 2^31: token ids are int32)");
  out.tokenizer_source = optional_string(file, tok, "source", "tokenizer.source");
  out.tokenizer_sha256 = optional_string(file, tok, "sha256", "tokenizer.sha256");
  out.chat_template_sha256 =
    optional_string(file, tok, "chat_template_sha256", "tokenizer.chat_template_sha256");
  // Special token ids (written by `prepare` since issue 19): null = none.
  using special = std::pair<const char*, int64_t*>;
  for (auto [key, dst] : {special{"eos_token_id", &out.eos_token_id},
                          special{"bos_token_id", &out.bos_token_id},
                          special{"pad_token_id", &out.pad_token_id}}) {
    if (!tok.contains(key))
      continue;
    out.special_tokens_recorded = true;
    if (tok[key].is_null())
      continue;
    *dst = require_count(file, tok, key, std::string("tokenizer.") + key);
    if (*dst >= out.vocab_size)
      fail(file, std::string("tokenizer.") + key + " = " + std::to_string(*dst)
                     + " is not below tokenizer.vocab_size = " + std::to_string(out.vocab_size));
  }
  out.options_json = m.contains("options") ? m["options"].dump() : "{}";
  out.report_json = m.contains("report") ? m["report"].dump() : "{}";
  out.content_hash = optional_string(file, m, "content_hash", "content_hash");

  if (!m.contains("shards"))
    fail(file, "missing field 'shards'");
  if (!m["shards"].is_array())
    fail(file, "field 'shards' must be an array, got " + m["shards"].dump());
  std::set<std::string> names;
  int64_t samples = 0, tokens = 0, supervised = 0;
  for (size_t i = 0; i < m["shards"].size(); ++i) {
    const auto& s = m["shards"][i];
    const std::string where = "shards[" + std::to_string(i) + "]";
    if (!s.is_object())
      fail(file, "field '" + where + "' must be an object, got " + s.dump());
    shard_info info;
    info.file = require_string(file, s, "file", where + ".file");
    if (info.file.empty() || info.file.find('/') != std::string::npos || info.file == "."
        || info.file == "..")
      fail(file, where + ".file = '" + info.file
                     + "' must be a plain file name inside the dataset folder");
    if (!names.insert(info.file).second)
      fail(file, where + ".file = '" + info.file + "' is listed twice");
    info.num_samples = require_count(file, s, "num_samples", where + ".num_samples");
    info.num_tokens = require_count(file, s, "num_tokens", where + ".num_tokens");
    info.num_supervised = require_count(file, s, "num_supervised", where + ".num_supervised");
    info.sha256 = require_string(file, s, "sha256", where + ".sha256");
    if (info.num_supervised > info.num_tokens)
      fail(file, where + ".num_supervised = " + std::to_string(info.num_supervised)
                     + " exceeds " + where + ".num_tokens = " + std::to_string(info.num_tokens));
    info.first_sample = samples;
    if (__builtin_add_overflow(samples, info.num_samples, &samples)
        || __builtin_add_overflow(tokens, info.num_tokens, &tokens)
        || __builtin_add_overflow(supervised, info.num_supervised, &supervised))
      fail(file, where + ": the counts overflow int64");
    out.shards.push_back(std::move(info));
  }

  const auto& totals = require_object(file, m, "totals", "totals");
  out.total_samples = require_count(file, totals, "samples", "totals.samples");
  out.total_tokens = require_count(file, totals, "tokens", "totals.tokens");
  out.total_supervised = require_count(file, totals, "supervised", "totals.supervised");
  auto check_total = [&](const char* field, int64_t total, const char* per_shard, int64_t sum) {
    if (total != sum)
      fail(file, std::string("totals.") + field + " = " + std::to_string(total)
                     + " but the shards' " + per_shard + " sum to " + std::to_string(sum));
  };
  check_total("samples", out.total_samples, "num_samples", samples);
  check_total("tokens", out.total_tokens, "num_tokens", tokens);
  check_total("supervised", out.total_supervised, "num_supervised", supervised);
  return out;
}

/// "manifest.json shards[2]": a shard's entry, for messages.
std::string entry_name(const fs::path& manifest_file, size_t index) {
  return manifest_file.filename().string() + " shards[" + std::to_string(index) + "]";
}

/// Every token id below `limit` (named `limit_name` in messages), every
/// loss-mask value 0 or 1, and the ones counted against the manifest.
void check_shard_values(const fs::path& file, const std::string& entry, const shard_data& s,
                        const shard_info& info, int64_t limit, const std::string& limit_name,
                        int64_t forbidden = -1, const std::string& forbidden_name = {}) {
  const int64_t t = info.num_tokens, n = s.num_samples;
  const int64_t* off = s.offsets;
  // Which sample a flat token index belongs to, for messages.
  auto sample_of = [&](int64_t k) {
    const auto i = std::upper_bound(off, off + n + 1, k) - off - 1;
    return " (sample " + std::to_string(i) + " of the shard, global id "
           + std::to_string(info.first_sample + i) + ", position "
           + std::to_string(k - off[i]) + " in it)";
  };
  // Chunked so that the common all-good case is one vectorisable pass.
  constexpr int64_t chunk = 1 << 16;
  const auto bound = static_cast<uint32_t>(limit);
  // −1 becomes 2^32 − 1, above any id the bound lets through.
  const auto banned = static_cast<uint32_t>(forbidden);
  int64_t ones = 0;
  for (int64_t b = 0; b < t; b += chunk) {
    const int64_t e = std::min(t, b + chunk);
    uint32_t max_token = 0;
    uint8_t high_bits = 0;
    uint32_t chunk_ones = 0, chunk_banned = 0;
    for (int64_t k = b; k < e; ++k) {
      max_token = std::max(max_token, static_cast<uint32_t>(s.tokens[k]));
      high_bits |= s.loss_mask[k] & 0xFE;
      chunk_ones += s.loss_mask[k];
      chunk_banned += static_cast<uint32_t>(s.tokens[k]) == banned;
    }
    if (chunk_banned != 0 && forbidden >= 0) {
      for (int64_t k = b; k < e; ++k)
        if (static_cast<uint32_t>(s.tokens[k]) == banned)
          fail(file, "tokens[" + std::to_string(k) + "] = " + std::to_string(s.tokens[k]) + " is "
                         + forbidden_name + ": the drafter's mask token must never occur in the data (it "
                         "could not tell a masked position from this token; pick an id the tokenizer never "
                         "produces, such as an unused row of the embedding)" + sample_of(k));
    }
    if (max_token >= bound) {
      for (int64_t k = b; k < e; ++k)
        if (static_cast<uint32_t>(s.tokens[k]) >= bound)
          fail(file, "tokens[" + std::to_string(k) + "] = " + std::to_string(s.tokens[k])
                         + " is not in [0, " + limit_name + " = " + std::to_string(limit) + ")"
                         + sample_of(k));
    }
    if (high_bits != 0) {
      for (int64_t k = b; k < e; ++k)
        if (s.loss_mask[k] > 1)
          fail(file, "loss_mask[" + std::to_string(k) + "] = " + std::to_string(s.loss_mask[k])
                         + ", expected 0 or 1" + sample_of(k));
    }
    ones += chunk_ones;
  }
  if (ones != info.num_supervised)
    fail(file, "loss_mask holds " + std::to_string(ones) + " ones but " + entry
                   + ".num_supervised = " + std::to_string(info.num_supervised));
}

/// The file's sha256 against its manifest entry.
void check_sha256(const fs::path& file, const std::string& entry, const shard_info& info) {
  const auto actual = sha256_file_hex(file);
  if (actual != info.sha256)
    fail(file, "sha256 is " + actual + " but " + entry + ".sha256 = '" + info.sha256
                   + "' (the file changed after `tandem prepare`, or is corrupt)");
}

/// Maps one shard and checks it against its manifest entry.
shard_data open_shard(const fs::path& manifest_file, const fs::path& file, const shard_info& info,
                      size_t index, int64_t vocab_size, const dataset_options& opts) {
  const std::string entry = entry_name(manifest_file, index);
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))
    fail(manifest_file, "shards[" + std::to_string(index) + "].file = '" + info.file
                            + "': no such file (" + file.string() + ")");
  if (opts.verify_hashes)
    check_sha256(file, entry, info);

  struct stat before {};
  const bool stated = ::stat(file.c_str(), &before) == 0;
  auto st = read_safetensors(file);
  const auto& meta = st.metadata;
  auto fmt = meta.find("format");
  if (fmt == meta.end())
    fail(file, "__metadata__.format is missing (expected '" + std::string(shard_format) + "')");
  if (fmt->second != shard_format)
    fail(file, "__metadata__.format = '" + fmt->second + "', expected '" + shard_format + "'");
  const int64_t n = metadata_count(file, meta, "num_samples");
  const int64_t t = metadata_count(file, meta, "num_tokens");
  if (n != info.num_samples)
    fail(file, "__metadata__.num_samples = " + std::to_string(n) + " but " + entry
                   + ".num_samples = " + std::to_string(info.num_samples));
  if (t != info.num_tokens)
    fail(file, "__metadata__.num_tokens = " + std::to_string(t) + " but " + entry
                   + ".num_tokens = " + std::to_string(info.num_tokens));

  shard_data s;
  const std::string name = file.string();
  s.tokens_t = require_tensor(st.tensors, "tokens", {t}, at::kInt, name);
  s.loss_mask_t = require_tensor(st.tensors, "loss_mask", {t}, at::kByte, name);
  s.offsets_t = require_tensor(st.tensors, "offsets", {n + 1}, at::kLong, name);
  s.tokens = s.tokens_t.const_data_ptr<int32_t>();
  s.loss_mask = s.loss_mask_t.const_data_ptr<uint8_t>();
  s.offsets = s.offsets_t.const_data_ptr<int64_t>();
  s.num_samples = n;
  s.first_sample = info.first_sample;

  const int64_t* off = s.offsets;
  if (off[0] != 0)
    fail(file, "offsets[0] = " + std::to_string(off[0]) + ", expected 0");
  for (int64_t i = 0; i < n; ++i)
    if (off[i + 1] < off[i])
      fail(file, "offsets[" + std::to_string(i + 1) + "] = " + std::to_string(off[i + 1])
                     + " < offsets[" + std::to_string(i) + "] = " + std::to_string(off[i])
                     + " (offsets must be non-decreasing)");
  if (off[n] != t)
    fail(file, "offsets[" + std::to_string(n) + "] = " + std::to_string(off[n])
                   + ", expected num_tokens = " + std::to_string(t));

  if (opts.check_values)
    check_shard_values(file, entry, s, info, vocab_size, "tokenizer.vocab_size");
  if (stated) {
    s.dev = static_cast<uint64_t>(before.st_dev);
    s.ino = static_cast<uint64_t>(before.st_ino);
    s.size = static_cast<int64_t>(before.st_size);
    s.mtime_ns = static_cast<int64_t>(before.st_mtim.tv_sec) * 1000000000 + before.st_mtim.tv_nsec;
  }
  return s;
}

} // namespace

namespace {

/// The data set's folder, given the folder or its manifest.json.
fs::path folder_of(const fs::path& dir_or_manifest) {
  std::error_code ec;
  if (dir_or_manifest.filename() == "manifest.json" && fs::is_regular_file(dir_or_manifest, ec))
    return dir_or_manifest.parent_path();
  return dir_or_manifest;
}

} // namespace

manifest_info read_manifest(const fs::path& path) {
  return parse_manifest(folder_of(path) / "manifest.json");
}

dataset::dataset(const fs::path& dir_or_manifest, const dataset_options& opts) {
  auto d = std::make_shared<impl>();
  d->dir = folder_of(dir_or_manifest);
  const fs::path manifest_file = d->dir / "manifest.json";
  d->manifest = parse_manifest(manifest_file);

  sha256 content;
  for (size_t i = 0; i < d->manifest.shards.size(); ++i) {
    const auto& info = d->manifest.shards[i];
    d->shards.push_back(open_shard(manifest_file, d->dir / info.file, info, i,
                                   d->manifest.vocab_size, opts));
    d->first_samples.push_back(info.first_sample);
    const auto& s = d->shards.back();
    for (int64_t k = 0; k < s.num_samples; ++k)
      d->max_length = std::max(d->max_length, s.offsets[k + 1] - s.offsets[k]);
    content.update(info.sha256.data(), info.sha256.size());
  }
  // content_hash: sha256 of the shards' sha256 hex strings, concatenated in order.
  if (opts.verify_hashes && !d->manifest.content_hash.empty()) {
    const auto actual = to_hex(content.finish());
    if (actual != d->manifest.content_hash)
      fail(manifest_file, "content_hash = '" + d->manifest.content_hash
                              + "' but the sha256 of the shards' sha256 values is " + actual);
  }
  d->num_samples = d->manifest.total_samples;
  impl_ = std::move(d);
}

const fs::path& dataset::dir() const {
  return impl_->dir;
}

const manifest_info& dataset::manifest() const {
  return impl_->manifest;
}

int64_t dataset::num_samples() const {
  return impl_->num_samples;
}

int64_t dataset::num_tokens() const {
  return impl_->manifest.total_tokens;
}

int64_t dataset::vocab_size() const {
  return impl_->manifest.vocab_size;
}

int64_t dataset::max_sample_length() const {
  return impl_->max_length;
}

std::pair<size_t, int64_t> dataset::locate(int64_t id) const {
  if (id < 0 || id >= impl_->num_samples)
    throw error(errc::bad_input, impl_->dir.string() + ": sample id " + std::to_string(id)
                                     + " is out of range [0, "
                                     + std::to_string(impl_->num_samples) + ")");
  const auto& firsts = impl_->first_samples;
  // The last shard starting at or before `id` (empty shards share their
  // successor's start and are skipped this way).
  const auto shard = static_cast<size_t>(std::upper_bound(firsts.begin(), firsts.end(), id)
                                         - firsts.begin() - 1);
  return {shard, id - firsts[shard]};
}

sample_view dataset::sample(int64_t id) const {
  const auto [shard, i] = locate(id);
  const auto& s = impl_->shards[shard];
  sample_view v;
  v.id = id;
  v.length = s.offsets[i + 1] - s.offsets[i];
  v.tokens = s.tokens + s.offsets[i];
  v.loss_mask = s.loss_mask + s.offsets[i];
  return v;
}

int64_t dataset::sample_length(int64_t id) const {
  const auto [shard, i] = locate(id);
  const auto& s = impl_->shards[shard];
  return s.offsets[i + 1] - s.offsets[i];
}

void dataset::check_unchanged(size_t index) const {
  const auto& s = impl_->shards.at(index);
  if (s.size < 0)
    return;
  const auto file = shard_path(index);
  struct stat now {};
  if (::stat(file.c_str(), &now) != 0 || static_cast<uint64_t>(now.st_dev) != s.dev
      || static_cast<uint64_t>(now.st_ino) != s.ino)
    return;  // removed or replaced: the mapping still holds the bytes that were checked
  const int64_t mtime = static_cast<int64_t>(now.st_mtim.tv_sec) * 1000000000 + now.st_mtim.tv_nsec;
  if (static_cast<int64_t>(now.st_size) == s.size && mtime == s.mtime_ns)
    return;
  fail(file, "was modified in place while training read it (" + std::to_string(s.size) + " bytes then, "
                 + std::to_string(now.st_size) + " now; modification time changed): the samples read from it "
                 "are no longer the ones its manifest entry vouches for. Put the data set back as it was "
                 "prepared (a changed data set is prepared into a new folder) and continue with tandem run "
                 "--resume from the newest checkpoint");
}

size_t dataset::num_shards() const {
  return impl_->shards.size();
}

fs::path dataset::shard_path(size_t index) const {
  if (index >= impl_->shards.size())
    throw error(errc::bad_input, impl_->dir.string() + ": no shard " + std::to_string(index)
                                     + " (the manifest lists "
                                     + std::to_string(impl_->shards.size()) + ")");
  return impl_->dir / impl_->manifest.shards[index].file;
}

void dataset::verify_shard(size_t index, const shard_check& check) const {
  const auto file = shard_path(index);
  const auto& info = impl_->manifest.shards[index];
  const auto entry = entry_name(impl_->dir / "manifest.json", index);
  // The hash first: a flipped bit is then reported as what it is (the file
  // changed), not as whatever value it happened to produce.
  if (check.sha256 && !info.sha256.empty())  // "" = none recorded (the reader warns)
    check_sha256(file, entry, info);
  int64_t limit = impl_->manifest.vocab_size;
  std::string limit_name = "tokenizer.vocab_size";
  if (check.vocab_size > 0 && check.vocab_size < limit) {
    limit = check.vocab_size;
    limit_name = check.vocab_source.empty() ? std::string("the target's vocab_size")
                                            : check.vocab_source;
  }
  check_shard_values(file, entry, impl_->shards[index], info, limit, limit_name, check.forbidden_token,
                     check.forbidden_source);
}

std::string shard_file_name(int64_t index) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%05lld.safetensors", static_cast<long long>(index));
  return buf;
}

} // namespace tandem::gpu::data
