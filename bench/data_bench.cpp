#include "gpu/pch.hpp"

#include "bench/data_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "gpu/data/dataset.hpp"
#include "gpu/data/order.hpp"
#include "gpu/data/packer.hpp"
#include "gpu/data/sha256.hpp"
#include "gpu/device/error.hpp"
#include "gpu/io/safetensors.hpp"

namespace tandem::gpu::data {

namespace fs = std::filesystem;

namespace {

constexpr int schema_version = 1;

using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

/// Median and median absolute deviation.
std::pair<double, double> median_mad(std::vector<double> v) {
  if (v.empty())
    return {0.0, 0.0};
  std::sort(v.begin(), v.end());
  const double med = v[v.size() / 2];
  for (auto& x : v)
    x = std::abs(x - med);
  std::sort(v.begin(), v.end());
  return {med, v[v.size() / 2]};
}

/// Removes what write_synthetic_dataset wrote, then the folder (files one
/// by one: no recursive removal through libtorch's std::filesystem copies).
void remove_synthetic(const fs::path& dir, int64_t shards) {
  std::error_code ec;
  fs::remove(dir / "manifest.json", ec);
  for (int64_t s = 0; s < shards; ++s)
    fs::remove(dir / shard_file_name(s), ec);
  fs::remove(dir, ec);
}

} // namespace

void write_synthetic_dataset(const fs::path& dir, const synthetic_spec& spec) {
  if (spec.samples < 0 || spec.shards < 1 || spec.min_length < 0
      || spec.max_length < spec.min_length || spec.vocab_size < 1)
    throw error(errc::bad_input, "write_synthetic_dataset: invalid spec");
  fs::create_directories(dir);
  rng gen(spec.seed);
  nlohmann::ordered_json shards = nlohmann::ordered_json::array();
  int64_t total_tokens = 0, total_supervised = 0;
  sha256 content;
  const int64_t per_shard = spec.samples / spec.shards;
  for (int64_t s = 0; s < spec.shards; ++s) {
    const int64_t n = s + 1 < spec.shards ? per_shard : spec.samples - per_shard * s;
    std::vector<int64_t> offsets(static_cast<size_t>(n) + 1, 0);
    const auto span = static_cast<uint64_t>(spec.max_length - spec.min_length + 1);
    for (int64_t i = 0; i < n; ++i)
      offsets[i + 1] = offsets[i] + spec.min_length + static_cast<int64_t>(gen.below(span));
    const int64_t t = offsets[n];
    auto tokens = at::empty({t}, at::kInt);
    auto mask = at::empty({t}, at::kByte);
    auto* tp = tokens.mutable_data_ptr<int32_t>();
    auto* mp = mask.mutable_data_ptr<uint8_t>();
    int64_t supervised = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = offsets[i], e = offsets[i + 1], prompt = (e - b) / 3;
      for (int64_t k = b; k < e; ++k) {
        tp[k] = static_cast<int32_t>(gen.below(static_cast<uint64_t>(spec.vocab_size)));
        mp[k] = k - b >= prompt ? 1 : 0;
      }
      supervised += e - b - prompt;
    }
    auto off = at::from_blob(offsets.data(), {n + 1}, at::kLong).clone();
    const auto file = shard_file_name(s);
    save_safetensors(dir / file, {{"tokens", tokens}, {"loss_mask", mask}, {"offsets", off}},
                     {{"format", "tandem.shard.v1"},
                      {"num_samples", std::to_string(n)},
                      {"num_tokens", std::to_string(t)}});
    const auto hash = sha256_file_hex(dir / file);
    content.update(hash.data(), hash.size());
    shards.push_back({{"file", file}, {"num_samples", n}, {"num_tokens", t},
                      {"num_supervised", supervised}, {"sha256", hash}});
    total_tokens += t;
    total_supervised += supervised;
  }
  nlohmann::ordered_json m = {
    {"format", "tandem.dataset.v1"},
    {"created_by", "tandem write_synthetic_dataset"},
    {"tokenizer", {{"source", "synthetic"}, {"vocab_size", spec.vocab_size},
                   {"sha256", ""}, {"chat_template_sha256", ""}}},
    {"options", {{"max_length", spec.max_length}}},
    {"shards", shards},
    {"totals", {{"samples", spec.samples}, {"tokens", total_tokens},
                {"supervised", total_supervised}}},
    {"report", nlohmann::ordered_json::object()},
    {"content_hash", to_hex(content.finish())},
  };
  // Written last, so a folder with a manifest is complete.
  const auto tmp = dir / "manifest.json.tmp";
  {
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (f == nullptr)
      throw error(errc::bad_input, tmp.string() + ": cannot create");
    const auto text = m.dump(2) + "\n";
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !ok)
      throw error(errc::bad_input, tmp.string() + ": cannot write");
  }
  fs::rename(tmp, dir / "manifest.json");
}

std::string bench_prefetch_json(const fs::path& dataset_dir, int64_t rows, int64_t seq_len,
                                double seconds) {
  fs::path dir = dataset_dir;
  const bool synthetic = dataset_dir.empty();
  synthetic_spec spec;
  if (synthetic) {
    dir = fs::temp_directory_path() / ("tandem_bench_prefetch_" + std::to_string(::getpid()));
    remove_synthetic(dir, spec.shards);
  }
  nlohmann::ordered_json j;
  try {
    double write_ms = 0;
    if (synthetic) {
      const auto t0 = clock_type::now();
      write_synthetic_dataset(dir, spec);
      write_ms = ms_since(t0);
    }
    auto t0 = clock_type::now();
    const dataset ds(dir);
    const double open_ms = ms_since(t0);

    packer_options opts;
    opts.rows = rows;
    opts.seq_len = seq_len;
    opts.pinned = true;  // falls back to pageable memory without CUDA
    const bool pinned = at::hasCUDA();

    std::vector<double> batch_ms;
    packing_stats total;
    int64_t epochs = 0;
    const auto start = clock_type::now();
    double elapsed_ms = 0;
    for (int64_t epoch = 0; elapsed_ms < seconds * 1e3; ++epoch) {
      auto p = make_epoch_packer(ds, /*seed=*/1234, /*rank=*/0, /*world=*/1, opts, {epoch, 0, {}});
      for (;;) {
        const auto tb = clock_type::now();
        auto b = p.next();
        if (!b)
          break;
        batch_ms.push_back(ms_since(tb));
        elapsed_ms = ms_since(start);
        if (elapsed_ms >= seconds * 1e3)
          break;
      }
      const auto& s = p.stats();
      total.batches += s.batches;
      total.samples += s.samples;
      total.real_tokens += s.real_tokens;
      total.padding_tokens += s.padding_tokens;
      total.truncated_samples += s.truncated_samples;
      total.truncated_tokens += s.truncated_tokens;
      ++epochs;
      elapsed_ms = ms_since(start);
      if (ds.num_samples() == 0)
        break;
    }
    const double secs = elapsed_ms / 1e3;

    // SHA-256 speed (the cost of --verify per byte), on 64 MiB in memory.
    std::vector<uint8_t> buf(size_t{64} << 20);
    for (size_t i = 0; i < buf.size(); ++i)
      buf[i] = static_cast<uint8_t>(i * 131 + (i >> 12));
    t0 = clock_type::now();
    (void)sha256_hex(buf.data(), buf.size());
    const double sha_ms = ms_since(t0);

    const auto [med, mad] = median_mad(batch_ms);
    j = {
      {"schema", schema_version},
      {"case", "prefetch_pack"},
      {"rows", rows},
      {"seq_len", seq_len},
      {"max_docs", opts.max_docs},
      {"lookahead", opts.lookahead},
      {"pinned", pinned},
      {"threads", 1},
      {"dataset", synthetic ? std::string("synthetic") : dir.string()},
      {"dataset_samples", ds.num_samples()},
      {"dataset_tokens", ds.num_tokens()},
      {"write_ms", write_ms},
      {"open_ms", open_ms},
      {"seconds", secs},
      {"epochs", epochs},
      {"batches", total.batches},
      {"samples", total.samples},
      {"samples_per_s", static_cast<double>(total.samples) / secs},
      {"tokens_per_s", static_cast<double>(total.real_tokens) / secs},
      {"slot_tokens_per_s", static_cast<double>(total.real_tokens + total.padding_tokens) / secs},
      {"padding_waste", total.padding_waste()},
      {"truncated_samples", total.truncated_samples},
      {"median_ms", med},
      {"mad_ms", mad},
      {"sha256_mb_per_s", 64.0 * 1.048576 / (sha_ms / 1e3)},
      {"sha256_hardware", sha256::hardware_available()},
    };
  } catch (...) {
    if (synthetic)
      remove_synthetic(dir, spec.shards);
    throw;
  }
  if (synthetic)
    remove_synthetic(dir, spec.shards);
  return j.dump();
}

} // namespace tandem::gpu::data
