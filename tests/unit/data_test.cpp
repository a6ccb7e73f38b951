// gpu/data: SHA-256 (known vectors, both code paths, Python's hashlib), the
// epoch order (a permutation, deterministic, equal to an independent Python
// reference, partitioned exactly by rank), the dataset reader (round trip and
// every malformed input, each message naming the file and the field), the
// packer (each sample exactly once, rows = concatenations of their samples,
// truncation, padding, resume from any cursor) and the bench case.
#include "gpu/pch.hpp"

#include <algorithm>
#include <thread>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <ftw.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "bench/data_bench.hpp"
#include "gpu/data/dataset.hpp"
#include "gpu/data/identity.hpp"
#include "gpu/data/order.hpp"
#include "gpu/data/packer.hpp"
#include "gpu/data/sha256.hpp"
#include "gpu/data/verify_once.hpp"
#include "gpu/device/error.hpp"
#include "gpu/engine/prefetch_engine.hpp"
#include "gpu/io/model_tokens.hpp"
#include "gpu/transport/transport.hpp"
#include "gpu/models/common.hpp"
#include "gpu/io/safetensors.hpp"
#include "tests/unit/expect_error.hpp"
#include "tests/unit/files.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace tandem;
using namespace tandem::gpu;
using namespace tandem::gpu::data;

using tandem::test::remove_tree;
using tandem::test::read_bytes;
using tandem::test::write_bytes;
using tandem::test::run_python;

namespace {

using tandem::test::expect_bad_input;

// ------------------------------------------------------------ fixtures --

/// One sample's content.
struct sample_spec {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
};

/// `n` samples of lengths in [min_len, max_len], tokens below `vocab`, a
/// random-ish mask; deterministic in `seed`.
std::vector<sample_spec> make_samples(int64_t n, int64_t min_len, int64_t max_len, int64_t vocab,
                                      uint64_t seed) {
  rng gen(seed);
  std::vector<sample_spec> out;
  for (int64_t i = 0; i < n; ++i) {
    const auto len = min_len + static_cast<int64_t>(gen.below(max_len - min_len + 1));
    sample_spec s;
    for (int64_t k = 0; k < len; ++k) {
      s.tokens.push_back(static_cast<int32_t>(gen.below(vocab)));
      s.mask.push_back(static_cast<uint8_t>(gen.below(2)));
    }
    out.push_back(std::move(s));
  }
  return out;
}

/// A shard's three tensors.
struct shard_tensors {
  at::Tensor tokens, loss_mask, offsets;
  int64_t supervised = 0;
};

shard_tensors to_tensors(const std::vector<sample_spec>& samples) {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  std::vector<int64_t> offsets{0};
  shard_tensors t;
  for (const auto& s : samples) {
    tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
    mask.insert(mask.end(), s.mask.begin(), s.mask.end());
    offsets.push_back(static_cast<int64_t>(tokens.size()));
    for (auto m : s.mask)
      t.supervised += m;
  }
  const auto n = static_cast<int64_t>(tokens.size());
  t.tokens = at::from_blob(tokens.data(), {n}, at::kInt).clone();
  t.loss_mask = at::from_blob(mask.data(), {n}, at::kByte).clone();
  t.offsets = at::from_blob(offsets.data(), {static_cast<int64_t>(offsets.size())}, at::kLong).clone();
  return t;
}

std::map<std::string, std::string> shard_metadata(int64_t n, int64_t t) {
  return {{"format", "tandem.shard.v1"},
          {"num_samples", std::to_string(n)},
          {"num_tokens", std::to_string(t)}};
}

void write_shard(const fs::path& p, const shard_tensors& t,
                 const std::map<std::string, std::string>& meta) {
  save_safetensors(p, {{"tokens", t.tokens}, {"loss_mask", t.loss_mask}, {"offsets", t.offsets}},
                   meta);
}

void write_manifest(const fs::path& dir, const json& m) {
  write_bytes(dir / "manifest.json", m.dump(2));
}

/// Writes `shards` (a list of sample lists) as a dataset in `dir`, in the
/// layout of docs/data.md, with correct counts and hashes.
json write_dataset(const fs::path& dir, const std::vector<std::vector<sample_spec>>& shards,
                   int64_t vocab) {
  fs::create_directories(dir);
  json m;
  m["format"] = "tandem.dataset.v1";
  m["created_by"] = "data_test";
  m["tokenizer"] = {{"source", "test"}, {"vocab_size", vocab}, {"sha256", "t"},
                    {"chat_template_sha256", "c"}};
  m["options"] = {{"block_size", 16}, {"max_length", 3072}};
  m["shards"] = json::array();
  int64_t samples = 0, tokens = 0, supervised = 0;
  std::string hashes;
  for (size_t s = 0; s < shards.size(); ++s) {
    const auto name = shard_file_name(static_cast<int64_t>(s));
    auto t = to_tensors(shards[s]);
    const auto n = static_cast<int64_t>(shards[s].size());
    const auto nt = t.tokens.numel();
    write_shard(dir / name, t, shard_metadata(n, nt));
    const auto hash = sha256_file_hex(dir / name);
    hashes += hash;
    m["shards"].push_back({{"file", name}, {"num_samples", n}, {"num_tokens", nt},
                           {"num_supervised", t.supervised}, {"sha256", hash}});
    samples += n;
    tokens += nt;
    supervised += t.supervised;
  }
  m["totals"] = {{"samples", samples}, {"tokens", tokens}, {"supervised", supervised}};
  m["report"] = {{"lines", samples}};
  m["content_hash"] = sha256_hex(hashes);
  write_manifest(dir, m);
  return m;
}

class data_test : public ::testing::Test {
protected:
  void SetUp() override {
    auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path()
           / ("tandem_data_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_"
              + info->name());
    remove_tree(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { remove_tree(dir_); }

  /// Three shards of 7, 0 and 11 samples; vocab 1000.
  json write_small(int64_t vocab = 1000) {
    shards_ = {make_samples(7, 1, 40, vocab, 1), {}, make_samples(11, 0, 30, vocab, 2)};
    return write_dataset(dir_, shards_, vocab);
  }

  fs::path shard(int64_t i) const { return dir_ / shard_file_name(i); }

  fs::path dir_;
  std::vector<std::vector<sample_spec>> shards_;
};

// -------------------------------------------------------------- sha256 --

struct sha_vector {
  std::string input;
  std::string digest;
};

// FIPS 180-2 appendix B and the NIST example values.
const std::vector<sha_vector> sha_vectors = {
  {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
  {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
  {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
   "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
  {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
   "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
  {std::string(1000000, 'a'), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
};

TEST(sha256_test, matches_fips_vectors_on_both_code_paths) {
  for (bool hw : {false, true}) {
    for (const auto& v : sha_vectors) {
      sha256 h(hw);
      h.update(v.input.data(), v.input.size());
      EXPECT_EQ(to_hex(h.finish()), v.digest)
        << (hw ? "hardware" : "portable") << " path, input of " << v.input.size() << " bytes";
    }
  }
  EXPECT_EQ(sha256_hex(std::string("abc")), sha_vectors[1].digest);
  std::printf("SHA extensions: %s\n", sha256::hardware_available() ? "used" : "absent");
}

TEST(sha256_test, incremental_updates_equal_one_shot_across_block_boundaries) {
  rng gen(5);
  std::string data(5000, '\0');
  for (auto& c : data)
    c = static_cast<char>(gen.below(256));
  for (size_t len : {0, 1, 55, 56, 63, 64, 65, 119, 120, 127, 128, 129, 1000, 5000}) {
    const auto want = sha256_hex(data.data(), len);
    for (bool hw : {false, true}) {
      sha256 h(hw);
      size_t at = 0;
      while (at < len) {
        const size_t step = std::min<size_t>(len - at, 1 + gen.below(97));
        h.update(data.data() + at, step);
        at += step;
      }
      EXPECT_EQ(to_hex(h.finish()), want) << "length " << len << (hw ? " hardware" : " portable");
    }
  }
}

TEST_F(data_test, sha256_of_a_file_matches_python_hashlib) {
  rng gen(9);
  std::string data(9 * 1024 * 1024 + 17, '\0');  // more than two of the reader's 4 MiB blocks
  for (auto& c : data)
    c = static_cast<char>(gen.below(256));
  const auto file = dir_ / "blob.bin";
  write_bytes(file, data);
  const auto [status, out] = run_python(
    "-c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],\"rb\").read()).hexdigest())' '"
    + file.string() + "'");
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(sha256_file_hex(file) + "\n", out);
  expect_bad_input([&] { sha256_file_hex(dir_ / "absent.bin"); }, {"absent.bin", "cannot open"});
}

// --------------------------------------------------------------- order --

bool is_permutation_of_iota(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != static_cast<int64_t>(i))
      return false;
  return true;
}

TEST(order_test, epoch_order_is_a_permutation) {
  for (int64_t n : {0, 1, 2, 3, 17, 1000, 100003}) {
    const auto o = epoch_order(n, 42, 3);
    EXPECT_EQ(static_cast<int64_t>(o.size()), n);
    EXPECT_TRUE(is_permutation_of_iota(o)) << n;
  }
}

TEST(order_test, epoch_order_is_deterministic_per_seed_and_epoch_and_differs_across_them) {
  const int64_t n = 5000;
  EXPECT_EQ(epoch_order(n, 7, 0), epoch_order(n, 7, 0));
  EXPECT_EQ(epoch_order(n, 7, 5), epoch_order(n, 7, 5));
  std::set<std::vector<int64_t>> seen;
  for (uint64_t seed : {0ULL, 1ULL, 7ULL, ~0ULL})
    for (int64_t epoch : {0, 1, 2, 3, 1000})
      seen.insert(epoch_order(n, seed, epoch));
  EXPECT_EQ(seen.size(), 20u) << "some (seed, epoch) pairs gave the same order";
  std::vector<int64_t> iota(n);
  std::iota(iota.begin(), iota.end(), int64_t{0});
  EXPECT_EQ(seen.count(iota), 0u) << "an order left the ids unshuffled";
  // Consecutive epochs are not related by a simple shift or reversal.
  const auto a = epoch_order(n, 7, 0), b = epoch_order(n, 7, 1);
  int64_t same_place = 0;
  for (int64_t i = 0; i < n; ++i)
    same_place += a[i] == b[i];
  EXPECT_LT(same_place, 20);  // expected about 1 for independent shuffles
}

TEST(order_test, epoch_order_equals_the_python_reference) {
  const std::string script = TANDEM_DATA_ORDER_REFERENCE;
  struct c {
    int64_t n;
    uint64_t seed;
    int64_t epoch;
  };
  for (const auto& k : {c{1000, 1234, 0}, c{1000, 1234, 1}, c{777, ~0ULL, 9}, c{1, 3, 0},
                        c{0, 3, 0}, c{50000, 0x9e3779b97f4a7c15ULL, 123456789}}) {
    const auto [status, out] = run_python("'" + script + "' " + std::to_string(k.n) + " "
                                          + std::to_string(k.seed) + " "
                                          + std::to_string(k.epoch));
    ASSERT_EQ(status, 0) << out;
    EXPECT_EQ(json::parse(out).get<std::vector<int64_t>>(), epoch_order(k.n, k.seed, k.epoch))
      << "n " << k.n << " seed " << k.seed << " epoch " << k.epoch;
  }
  const auto [status, out] = run_python("'" + script + "' 1001 5 2 1 3");
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(json::parse(out).get<std::vector<int64_t>>(), rank_order(epoch_order(1001, 5, 2), 1, 3));
}

TEST(order_test, rank_orders_partition_the_epoch_exactly) {
  for (int64_t n : {0, 1, 10, 1003}) {
    const auto order = epoch_order(n, 11, 4);
    for (int64_t world = 1; world <= 5; ++world) {
      std::vector<int64_t> all;
      for (int64_t rank = 0; rank < world; ++rank) {
        const auto mine = rank_order(order, rank, world);
        // Positions rank, rank + world, …
        ASSERT_EQ(static_cast<int64_t>(mine.size()), (n - rank + world - 1) / world);
        for (size_t i = 0; i < mine.size(); ++i)
          ASSERT_EQ(mine[i], order[rank + static_cast<int64_t>(i) * world]);
        all.insert(all.end(), mine.begin(), mine.end());
      }
      EXPECT_EQ(static_cast<int64_t>(all.size()), n);
      EXPECT_TRUE(is_permutation_of_iota(all)) << "n " << n << " world " << world;
    }
  }
  expect_bad_input([] { rank_order({1, 2}, 2, 2); }, {"rank 2 of world 2"});
  expect_bad_input([] { rank_order({1, 2}, 0, 0); }, {"world 0"});
  expect_bad_input([] { rank_order({1, 2}, -1, 2); }, {"rank -1"});
}

TEST(order_test, rng_below_stays_in_range_and_covers_it) {
  rng gen(3);
  std::vector<int> hits(7, 0);
  for (int i = 0; i < 7000; ++i) {
    const auto x = gen.below(7);
    ASSERT_LT(x, 7u);
    ++hits[x];
  }
  for (int h : hits)
    EXPECT_GT(h, 800);  // 1000 expected each
  EXPECT_EQ(gen.below(1), 0u);
}

// ------------------------------------------------------------- dataset --

TEST_F(data_test, opens_and_reads_every_sample_back) {
  const auto m = write_small();
  for (bool verify : {false, true}) {
    dataset_options o;
    o.verify_hashes = verify;
    const dataset ds(dir_, o);
    ASSERT_EQ(ds.num_samples(), 18);
    EXPECT_EQ(ds.vocab_size(), 1000);
    EXPECT_EQ(ds.num_tokens(), m["totals"]["tokens"].get<int64_t>());
    const auto& mi = ds.manifest();
    EXPECT_EQ(mi.format, "tandem.dataset.v1");
    EXPECT_EQ(mi.created_by, "data_test");
    EXPECT_EQ(mi.tokenizer_source, "test");
    ASSERT_EQ(mi.shards.size(), 3u);
    EXPECT_EQ(mi.shards[2].first_sample, 7);
    EXPECT_EQ(mi.shards[1].num_samples, 0);
    EXPECT_EQ(json::parse(mi.options_json)["block_size"], 16);
    EXPECT_EQ(mi.content_hash, m["content_hash"].get<std::string>());
    int64_t id = 0, longest = 0;
    for (size_t s = 0; s < shards_.size(); ++s) {
      for (size_t i = 0; i < shards_[s].size(); ++i, ++id) {
        const auto& want = shards_[s][i];
        const auto v = ds.sample(id);
        EXPECT_EQ(v.id, id);
        ASSERT_EQ(v.length, static_cast<int64_t>(want.tokens.size())) << id;
        EXPECT_EQ(ds.sample_length(id), v.length);
        EXPECT_EQ(std::vector<int32_t>(v.tokens, v.tokens + v.length), want.tokens) << id;
        EXPECT_EQ(std::vector<uint8_t>(v.loss_mask, v.loss_mask + v.length), want.mask) << id;
        EXPECT_EQ(ds.locate(id), std::make_pair(s, static_cast<int64_t>(i)));
        longest = std::max(longest, v.length);
        const auto t = tensors_of(ds, id);
        EXPECT_EQ(t.tokens.scalar_type(), at::kInt);
        EXPECT_EQ(t.loss_mask.scalar_type(), at::kByte);
        EXPECT_EQ(t.tokens.numel(), v.length);
        if (v.length > 0) {  // zero-copy: the views alias the mapping
          EXPECT_EQ(t.tokens.const_data_ptr<int32_t>(), v.tokens);
          EXPECT_EQ(t.loss_mask.const_data_ptr<uint8_t>(), v.loss_mask);
        }
      }
    }
    EXPECT_EQ(ds.max_sample_length(), longest);
    expect_bad_input([&] { ds.sample(18); }, {"sample id 18", "[0, 18)"});
    expect_bad_input([&] { ds.sample(-1); }, {"sample id -1"});
  }
  // The manifest's path opens the same dataset.
  EXPECT_EQ(dataset(dir_ / "manifest.json").num_samples(), 18);
}

TEST_F(data_test, sample_views_outlive_the_dataset_object) {
  write_small();
  sample_tensors t;
  std::vector<int32_t> want;
  {
    const dataset ds(dir_);
    t = tensors_of(ds, 3);
    want = shards_[0][3].tokens;
  }
  EXPECT_EQ(std::vector<int32_t>(t.tokens.const_data_ptr<int32_t>(),
                                 t.tokens.const_data_ptr<int32_t>() + t.tokens.numel()),
            want);
}

TEST_F(data_test, empty_dataset_opens_and_packs_nothing) {
  write_dataset(dir_, {}, 10);
  const dataset ds(dir_);
  EXPECT_EQ(ds.num_samples(), 0);
  auto p = make_epoch_packer(ds, 1, 0, 1, {});
  EXPECT_FALSE(p.next().has_value());
}

TEST_F(data_test, rejects_a_missing_or_unreadable_manifest) {
  expect_bad_input([&] { dataset{dir_}; }, {"manifest.json", "no such file"});
  write_bytes(dir_ / "manifest.json", "{\"format\": ");
  expect_bad_input([&] { dataset{dir_}; }, {"manifest.json", "not valid JSON"});
  write_bytes(dir_ / "manifest.json", "[1, 2]");
  expect_bad_input([&] { dataset{dir_}; }, {"manifest.json", "must be a JSON object"});
}

TEST_F(data_test, rejects_manifest_field_errors) {
  const auto good = write_small();
  auto with = [&](auto edit, const std::vector<std::string>& needles) {
    auto m = good;
    edit(m);
    write_manifest(dir_, m);
    expect_bad_input([&] { dataset{dir_}; }, needles);
  };
  with([](json& m) { m["format"] = "tandem.dataset.v0"; },
       {"manifest.json", "format = 'tandem.dataset.v0'", "tandem.dataset.v1"});
  with([](json& m) { m.erase("tokenizer"); }, {"manifest.json", "missing field 'tokenizer'"});
  with([](json& m) { m["tokenizer"]["vocab_size"] = -5; },
       {"manifest.json", "tokenizer.vocab_size", "non-negative integer"});
  with([](json& m) { m["tokenizer"]["vocab_size"] = 0; },
       {"manifest.json", "tokenizer.vocab_size = 0"});
  with([](json& m) { m["shards"][1].erase("num_tokens"); },
       {"manifest.json", "missing field 'shards[1].num_tokens'"});
  with([](json& m) { m["shards"][2]["num_samples"] = "11"; },
       {"manifest.json", "shards[2].num_samples", "non-negative integer", "\"11\""});
  with([](json& m) { m["shards"][2]["file"] = "../shard-00002.safetensors"; },
       {"manifest.json", "shards[2].file", "plain file name"});
  with([](json& m) { m["shards"][2]["file"] = m["shards"][0]["file"]; },
       {"manifest.json", "shards[2].file", "listed twice"});
  with([](json& m) { m["totals"]["samples"] = 17; },
       {"manifest.json", "totals.samples = 17", "sum to 18"});
  with([](json& m) { m["totals"]["tokens"] = m["totals"]["tokens"].get<int64_t>() + 1; },
       {"manifest.json", "totals.tokens"});
  with([](json& m) { m["totals"]["supervised"] = 0; },
       {"manifest.json", "totals.supervised = 0"});
}

TEST_F(data_test, rejects_a_missing_shard) {
  write_small();
  fs::remove(shard(2));
  expect_bad_input([&] { dataset{dir_}; },
                   {"manifest.json", "shards[2].file = 'shard-00002.safetensors'", "no such file"});
}

TEST_F(data_test, rejects_a_truncated_shard) {
  write_small();
  const auto bytes = read_bytes(shard(2));
  write_bytes(shard(2), bytes.substr(0, bytes.size() - 10));
  expect_bad_input([&] { dataset{dir_}; }, {"shard-00002.safetensors", "truncated"});
  write_bytes(shard(2), bytes.substr(0, 5));
  expect_bad_input([&] { dataset{dir_}; }, {"shard-00002.safetensors", "truncated"});
}

TEST_F(data_test, rejects_counts_that_disagree_with_the_manifest) {
  const auto good = write_small();
  auto m = good;
  m["shards"][2]["num_samples"] = 12;
  m["totals"]["samples"] = 19;
  write_manifest(dir_, m);
  expect_bad_input([&] { dataset{dir_}; },
                   {"shard-00002.safetensors", "__metadata__.num_samples = 11",
                    "shards[2].num_samples = 12"});
  m = good;
  m["shards"][0]["num_tokens"] = m["shards"][0]["num_tokens"].get<int64_t>() + 1;
  m["totals"]["tokens"] = m["totals"]["tokens"].get<int64_t>() + 1;
  write_manifest(dir_, m);
  expect_bad_input([&] { dataset{dir_}; },
                   {"shard-00000.safetensors", "__metadata__.num_tokens", "shards[0].num_tokens"});
  m = good;
  m["shards"][0]["num_supervised"] = m["shards"][0]["num_supervised"].get<int64_t>() + 1;
  m["totals"]["supervised"] = m["totals"]["supervised"].get<int64_t>() + 1;
  write_manifest(dir_, m);
  // The supervised count needs the mask's bytes: checked with the values
  // (at open when asked, else by verify_shard before the shard is used).
  dataset_options values;
  values.check_values = true;
  expect_bad_input([&] { dataset(dir_, values); },
                   {"shard-00000.safetensors", "loss_mask holds", "shards[0].num_supervised"});
  expect_bad_input([&] { dataset(dir_).verify_shard(0); },
                   {"shard-00000.safetensors", "loss_mask holds", "shards[0].num_supervised"});
}

TEST_F(data_test, rejects_shard_metadata_and_tensor_shape_mismatches) {
  write_small();
  auto t = to_tensors(shards_[0]);
  const int64_t n = 7, nt = t.tokens.numel();
  auto meta = shard_metadata(n, nt);
  meta["format"] = "other";
  write_shard(shard(0), t, meta);
  expect_bad_input([&] { dataset{dir_}; },
                   {"shard-00000.safetensors", "__metadata__.format = 'other'", "tandem.shard.v1"});
  meta = shard_metadata(n, nt);
  meta.erase("num_tokens");
  write_shard(shard(0), t, meta);
  expect_bad_input([&] { dataset{dir_}; },
                   {"shard-00000.safetensors", "__metadata__.num_tokens is missing"});
  meta = shard_metadata(n, nt);
  meta["num_samples"] = "7x";
  write_shard(shard(0), t, meta);
  expect_bad_input([&] { dataset{dir_}; },
                   {"shard-00000.safetensors", "__metadata__.num_samples = '7x'"});
  // The tensors disagree with the (consistent) metadata.
  auto short_mask = t;
  short_mask.loss_mask = t.loss_mask.narrow(0, 0, nt - 1).clone();
  write_shard(shard(0), short_mask, shard_metadata(n, nt));
  expect_bad_input([&] { dataset{dir_}; },
                   {"shard-00000.safetensors", "loss_mask", "shape [" + std::to_string(nt - 1) + "]"});
  save_safetensors(shard(0), {{"tokens", t.tokens}, {"offsets", t.offsets}}, shard_metadata(n, nt));
  expect_bad_input([&] { dataset{dir_}; }, {"shard-00000.safetensors", "loss_mask"});
}

TEST_F(data_test, rejects_wrong_dtypes) {
  write_small();
  const auto t = to_tensors(shards_[0]);
  const auto meta = shard_metadata(7, t.tokens.numel());
  auto w = t;
  w.tokens = t.tokens.to(at::kLong);
  write_shard(shard(0), w, meta);
  expect_bad_input([&] { dataset{dir_}; },
                   {"shard-00000.safetensors", "'tokens'", "dtype I64", "expected I32"});
  w = t;
  w.loss_mask = t.loss_mask.to(at::kBool);
  write_shard(shard(0), w, meta);
  expect_bad_input([&] { dataset{dir_}; },
                   {"shard-00000.safetensors", "'loss_mask'", "dtype BOOL", "expected U8"});
  w = t;
  w.offsets = t.offsets.to(at::kInt);
  write_shard(shard(0), w, meta);
  expect_bad_input([&] { dataset{dir_}; },
                   {"shard-00000.safetensors", "'offsets'", "dtype I32", "expected I64"});
}

TEST_F(data_test, rejects_bad_offsets) {
  write_small();
  const auto t = to_tensors(shards_[2]);
  const auto meta = shard_metadata(11, t.tokens.numel());
  auto w = t;
  w.offsets = t.offsets.clone();
  auto* off = w.offsets.mutable_data_ptr<int64_t>();
  // Make offsets[4] larger than offsets[5]: only the order breaks.
  off[4] = off[5] + 1;
  write_shard(shard(2), w, meta);
  expect_bad_input([&] { dataset{dir_}; },
                   {"shard-00002.safetensors",
                    "offsets[5] = " + std::to_string(off[5]) + " < offsets[4] = "
                      + std::to_string(off[4]),
                    "non-decreasing"});
  w.offsets = t.offsets.clone();
  w.offsets.mutable_data_ptr<int64_t>()[0] = 1;
  write_shard(shard(2), w, meta);
  expect_bad_input([&] { dataset{dir_}; }, {"shard-00002.safetensors", "offsets[0] = 1, expected 0"});
  w.offsets = t.offsets.clone();
  w.offsets.mutable_data_ptr<int64_t>()[11] += 5;
  write_shard(shard(2), w, meta);
  expect_bad_input([&] { dataset{dir_}; },
                   {"shard-00002.safetensors",
                    "offsets[11] = " + std::to_string(t.tokens.numel() + 5),
                    "expected num_tokens = " + std::to_string(t.tokens.numel())});
}

TEST_F(data_test, rejects_token_ids_outside_the_vocabulary) {
  write_small(1000);
  auto t = to_tensors(shards_[0]);
  const auto off = t.offsets.const_data_ptr<int64_t>();
  int64_t i = 1;  // the first sample after 0 with two tokens or more
  while (off[i + 1] - off[i] < 2)
    ++i;
  const int64_t k = off[i] + 1;  // inside sample i, at position 1
  t.tokens.mutable_data_ptr<int32_t>()[k] = 1000;
  write_shard(shard(0), t, shard_metadata(7, t.tokens.numel()));
  const std::vector<std::string> names{
    "shard-00000.safetensors", "tokens[" + std::to_string(k) + "] = 1000",
    "tokenizer.vocab_size = 1000",
    "sample " + std::to_string(i) + " of the shard, global id " + std::to_string(i)
      + ", position 1 in it"};
  dataset_options values;
  values.check_values = true;
  expect_bad_input([&] { dataset(dir_, values); }, names);
  // Opening alone reads no token (the prefetch engine verifies each shard in
  // the background); verify_shard finds it, without the hash (the bytes were
  // rewritten on purpose) and with it (the hash is checked first).
  const dataset ds(dir_);
  EXPECT_EQ(ds.num_samples(), 18);
  shard_check values_only;
  values_only.sha256 = false;
  expect_bad_input([&] { ds.verify_shard(0, values_only); }, names);
  expect_bad_input([&] { ds.verify_shard(0); }, {"shard-00000.safetensors", "sha256 is"});
  EXPECT_NO_THROW(ds.verify_shard(2));
  t.tokens.mutable_data_ptr<int32_t>()[k] = -1;
  write_shard(shard(0), t, shard_metadata(7, t.tokens.numel()));
  expect_bad_input([&] { dataset(dir_, values); },
                   {"shard-00000.safetensors", "tokens[" + std::to_string(k) + "] = -1"});
  // Not checked when asked not to.
  dataset_options o;
  o.check_values = false;
  EXPECT_EQ(dataset(dir_, o).num_samples(), 18);
}

TEST_F(data_test, verify_shard_checks_token_ids_against_the_target_vocabulary) {
  // The target's embedding may have fewer rows than the manifest's
  // tokenizer claims: an id past it must never reach the embedding lookup.
  write_small(1000);
  const dataset ds(dir_);
  int32_t max_id = 0;
  for (int64_t id = 0; id < ds.num_samples(); ++id) {
    const auto x = ds.sample(id);
    for (int64_t j = 0; j < x.length; ++j)
      max_id = std::max(max_id, x.tokens[j]);
  }
  shard_check check;
  check.vocab_size = max_id + 1;
  check.vocab_source = "vocab_size of /models/q/config.json";
  for (size_t sh = 0; sh < ds.num_shards(); ++sh)
    EXPECT_NO_THROW(ds.verify_shard(sh, check));
  check.vocab_size = max_id;  // the largest id is now one past the embedding
  int failed = 0;
  for (size_t sh = 0; sh < ds.num_shards(); ++sh) {
    try {
      ds.verify_shard(sh, check);
    } catch (const gpu::error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.code(), errc::bad_input);
      EXPECT_TRUE(test::contains(what, shard_file_name(static_cast<int64_t>(sh)))) << what;
      EXPECT_TRUE(test::contains(what, "= " + std::to_string(max_id)
                                         + " is not in [0, vocab_size of /models/q/config.json = "
                                         + std::to_string(max_id) + ")"))
        << what;
      EXPECT_TRUE(test::contains(what, "global id") && test::contains(what, "position")) << what;
      ++failed;
    }
  }
  EXPECT_GE(failed, 1);
  // A target vocabulary larger than the tokenizer's does not loosen the check.
  check.vocab_size = 5000;
  for (size_t sh = 0; sh < ds.num_shards(); ++sh)
    EXPECT_NO_THROW(ds.verify_shard(sh, check));
}

TEST_F(data_test, verify_shard_catches_one_flipped_low_bit) {
  // Issue 19: a single flipped low bit in a token is a valid id with valid
  // counts; only the manifest's sha256 can tell.
  const auto good = write_small();
  auto bytes = read_bytes(shard(2));
  {
    const dataset before(dir_);
    const auto v = before.sample(before.manifest().shards[2].first_sample + 4);
    // Find the sample's tokens in the file's bytes.
    const std::string needle(reinterpret_cast<const char*>(v.tokens),
                             static_cast<size_t>(v.length) * 4);
    const auto at = bytes.find(needle);
    ASSERT_NE(at, std::string::npos);
    bytes[at] = static_cast<char>(bytes[at] ^ 1);  // the low bit of the sample's first token
  }
  write_bytes(shard(2), bytes);
  const dataset ds(dir_);  // opens: the structure is intact
  EXPECT_EQ(ds.num_samples(), 18);
  shard_check values_only;
  values_only.sha256 = false;
  EXPECT_NO_THROW(ds.verify_shard(2, values_only));  // a valid id: the values cannot tell
  const auto expected = good["shards"][2]["sha256"].get<std::string>();
  const auto actual = sha256_file_hex(shard(2));
  EXPECT_NE(actual, expected);
  expect_bad_input([&] { ds.verify_shard(2); },
                   {shard(2).string(), "sha256 is " + actual,
                    "manifest.json shards[2].sha256 = '" + expected + "'",
                    "changed after `tandem prepare`"});
  EXPECT_NO_THROW(ds.verify_shard(0));
}

TEST_F(data_test, verify_shard_once_reads_each_shard_once_per_process) {
  // Several prefetch engines (one per target) share the shards' results: a
  // shard verified once is not read again while its file is unchanged
  // (path, size, modification time), and a failure is remembered too.
  write_small();
  const dataset ds(dir_);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&] {
      verify_shard_once(ds, 2, {});
      ++ok;
    });
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(ok.load(), 4);
  // Change one byte behind the cache's back (same size, the old mtime):
  // the cached result stands, the direct check sees it.
  const auto when = fs::last_write_time(shard(2));
  auto bytes = read_bytes(shard(2));
  bytes[bytes.size() - 1] = static_cast<char>(bytes.back() ^ 1);
  write_bytes(shard(2), bytes);
  fs::last_write_time(shard(2), when);
  EXPECT_NO_THROW(verify_shard_once(ds, 2, {}));
  expect_bad_input([&] { ds.verify_shard(2); }, {"shard-00002.safetensors", "sha256 is"});
  // A new modification time is a new file: verified again, and its failure
  // is given to every later caller.
  fs::last_write_time(shard(2), when + std::chrono::seconds(1));
  expect_bad_input([&] { verify_shard_once(ds, 2, {}); }, {"shard-00002.safetensors", "sha256 is"});
  expect_bad_input([&] { verify_shard_once(ds, 2, {}); }, {"shard-00002.safetensors", "sha256 is"});
  // Another check is another result: without the hash, the flipped mask
  // byte (the file's last) shows as a wrong supervised count.
  shard_check values_only;
  values_only.sha256 = false;
  expect_bad_input([&] { verify_shard_once(ds, 2, values_only); },
                   {"shard-00002.safetensors", "loss_mask holds"});
}

TEST_F(data_test, manifest_special_tokens_are_read_and_checked) {
  auto m = write_small();
  EXPECT_FALSE(read_manifest(dir_).special_tokens_recorded);  // an older manifest
  m["tokenizer"]["eos_token_id"] = 7;
  m["tokenizer"]["bos_token_id"] = nullptr;
  m["tokenizer"]["pad_token_id"] = 5;
  write_manifest(dir_, m);
  const auto info = read_manifest(dir_ / "manifest.json");
  EXPECT_TRUE(info.special_tokens_recorded);
  EXPECT_EQ(info.eos_token_id, 7);
  EXPECT_EQ(info.bos_token_id, -1);
  EXPECT_EQ(info.pad_token_id, 5);
  m["tokenizer"]["eos_token_id"] = 1000;
  write_manifest(dir_, m);
  expect_bad_input([&] { read_manifest(dir_); },
                   {"manifest.json", "tokenizer.eos_token_id = 1000", "tokenizer.vocab_size = 1000"});
  m["tokenizer"]["eos_token_id"] = "x";
  write_manifest(dir_, m);
  expect_bad_input([&] { read_manifest(dir_); }, {"manifest.json", "tokenizer.eos_token_id"});
}

TEST(identity_test, manifest_tokenizer_against_the_target_config) {
  manifest_info m;
  m.vocab_size = 151669;  // Qwen3's tokenizer: fewer ids than the embedding's 151936 rows
  m.special_tokens_recorded = true;
  m.eos_token_id = 151645;
  m.bos_token_id = -1;   // Qwen3's tokenizer has none; its config names one
  m.pad_token_id = 151643;
  model_tokens q;
  q.vocab_size = 151936;
  q.eos_token_ids = {151645};
  q.bos_token_id = 151643;
  q.file = "/models/q/config.json";
  EXPECT_TRUE(check_tokenizer_identity(m, "/d/manifest.json", q).empty());
  q.eos_token_ids = {151643, 151645};  // a list, as some configs give
  EXPECT_TRUE(check_tokenizer_identity(m, "/d/manifest.json", q).empty());

  auto other = m;
  other.vocab_size = 200000;
  expect_bad_input([&] { check_tokenizer_identity(other, "/d/manifest.json", q); },
                   {"/d/manifest.json", "tokenizer.vocab_size = 200000",
                    "/models/q/config.json has vocab_size = 151936", "another model"});
  other = m;
  other.eos_token_id = 2;
  expect_bad_input([&] { check_tokenizer_identity(other, "/d/manifest.json", q); },
                   {"/d/manifest.json", "tokenizer.eos_token_id = 2",
                    "eos_token_id = [151643, 151645]"});
  other = m;
  other.bos_token_id = 1;
  expect_bad_input([&] { check_tokenizer_identity(other, "/d/manifest.json", q); },
                   {"/d/manifest.json", "tokenizer.bos_token_id = 1", "bos_token_id = 151643"});
  // An old manifest: the vocabulary is still checked; the rest is a warning.
  other = m;
  other.special_tokens_recorded = false;
  other.eos_token_id = 2;
  const auto warnings = check_tokenizer_identity(other, "/d/manifest.json", q);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_TRUE(test::contains(warnings[0], "/d/manifest.json")) << warnings[0];
  EXPECT_TRUE(test::contains(warnings[0], "no special token ids")) << warnings[0];
  other.vocab_size = 200000;
  expect_bad_input([&] { check_tokenizer_identity(other, "/d/manifest.json", q); },
                   {"tokenizer.vocab_size = 200000"});
}

TEST_F(data_test, rejects_loss_mask_values_other_than_0_and_1) {
  write_small();
  auto t = to_tensors(shards_[2]);
  const int64_t k = t.offsets.const_data_ptr<int64_t>()[5];
  ASSERT_LT(k, t.loss_mask.numel());
  t.loss_mask.mutable_data_ptr<uint8_t>()[k] = 2;
  write_shard(shard(2), t, shard_metadata(11, t.tokens.numel()));
  const std::vector<std::string> names{"shard-00002.safetensors",
                                       "loss_mask[" + std::to_string(k) + "] = 2",
                                       "expected 0 or 1", "global id"};
  dataset_options values;
  values.check_values = true;
  expect_bad_input([&] { dataset(dir_, values); }, names);
  shard_check values_only;
  values_only.sha256 = false;
  expect_bad_input([&] { dataset(dir_).verify_shard(2, values_only); }, names);
}

TEST_F(data_test, verify_catches_a_changed_shard_and_a_wrong_content_hash) {
  const auto good = write_small();
  // Same counts, valid tokens, different bytes: only the hash can tell.
  auto t = to_tensors(shards_[0]);
  auto* tok = t.tokens.mutable_data_ptr<int32_t>();
  tok[0] = (tok[0] + 1) % 1000;
  write_shard(shard(0), t, shard_metadata(7, t.tokens.numel()));
  EXPECT_EQ(dataset(dir_).num_samples(), 18);
  dataset_options verify;
  verify.verify_hashes = true;
  expect_bad_input([&] { dataset(dir_, verify); },
                   {"shard-00000.safetensors", "sha256 is",
                    "shards[0].sha256 = '" + good["shards"][0]["sha256"].get<std::string>()});
  // Restore the shard; break the content hash.
  t.tokens = to_tensors(shards_[0]).tokens;
  write_shard(shard(0), t, shard_metadata(7, t.tokens.numel()));
  EXPECT_EQ(dataset(dir_, verify).num_samples(), 18);
  auto m = good;
  m["content_hash"] = std::string(64, '0');
  write_manifest(dir_, m);
  EXPECT_EQ(dataset(dir_).num_samples(), 18);
  expect_bad_input([&] { dataset(dir_, verify); }, {"manifest.json", "content_hash"});
}

// ------------------------------------------------- prefetch verification --

/// A Qwen3 config.json with `vocab` rows and the given special tokens.
std::string target_config(int64_t vocab, const std::string& extra = "") {
  return "{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": " + std::to_string(vocab)
         + ", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, "
           "\"num_attention_heads\": 2" + extra + "}";
}

prefetch_engine_options engine_options(const fs::path& dir, int64_t rows = 4) {
  prefetch_engine_options o;
  o.dataset = dir;
  o.rows = rows;
  o.seq_len = 64;
  o.max_docs = 8;
  return o;
}

TEST_F(data_test, prefetch_verifies_every_shard_in_the_background) {
  write_small();
  const auto live = transport::live_handles();
  prefetch_engine e(engine_options(dir_));
  e.start_epoch(0);
  int64_t batches = 0;
  while (auto b = e.next()) {
    e.release(b->handle);
    ++batches;
  }
  EXPECT_GT(batches, 0);
  EXPECT_EQ(transport::live_handles(), live);
  const auto v = e.verification();
  EXPECT_EQ(v.shards, 3);
  EXPECT_EQ(v.verified, 3);  // every shard a batch read was verified first; the empty one too
  EXPECT_EQ(v.bytes, static_cast<int64_t>(fs::file_size(shard(0)) + fs::file_size(shard(1))
                                          + fs::file_size(shard(2))));
  EXPECT_TRUE(e.warnings().empty());
}

TEST_F(data_test, prefetch_publishes_no_batch_from_a_shard_whose_bytes_changed) {
  // One flipped low bit in a token, after `prepare`: the engine opens (the
  // structure is intact) and the first batch that would read the shard
  // throws instead, naming the file and its sha256; nothing is staged.
  const auto good = write_small();
  auto bytes = read_bytes(shard(0));
  const auto t = to_tensors(shards_[0]);
  const std::string needle(reinterpret_cast<const char*>(t.tokens.const_data_ptr<int32_t>()), 4 * 8);
  const auto at = bytes.find(needle);
  ASSERT_NE(at, std::string::npos);
  bytes[at] = static_cast<char>(bytes[at] ^ 1);
  write_bytes(shard(0), bytes);
  const auto live = transport::live_handles();
  for (int64_t rows : {64, 1}) {  // every sample in the first batch; or one row at a time
    prefetch_engine e(engine_options(dir_, rows));
    e.start_epoch(0);
    std::string what;
    int64_t published = 0;
    try {
      while (auto b = e.next()) {
        for (auto id : b->sample_ids)
          EXPECT_GE(id, 7) << "a sample of shard 0 was published";
        e.release(b->handle);
        ++published;
      }
    } catch (const gpu::error& err) {
      EXPECT_EQ(err.code(), errc::bad_input);
      what = err.what();
    }
    EXPECT_TRUE(test::contains(what, shard(0).string())) << what;
    EXPECT_TRUE(test::contains(what, "sha256 is")) << what;
    EXPECT_TRUE(test::contains(what, good["shards"][0]["sha256"].get<std::string>())) << what;
    if (rows == 64)
      EXPECT_EQ(published, 0);
    EXPECT_EQ(transport::live_handles(), live);
  }
}

TEST_F(data_test, prefetch_checks_the_manifest_and_token_ids_against_the_target) {
  auto m = write_small(1000);
  const auto target = dir_ / "target";
  fs::create_directories(target);
  write_bytes(target / "config.json", target_config(1000, ", \"eos_token_id\": 7"));
  auto o = engine_options(dir_);
  o.target = target;
  {
    prefetch_engine e(o);  // an old manifest: a warning, not an error
    ASSERT_EQ(e.warnings().size(), 1u);
    EXPECT_TRUE(test::contains(e.warnings()[0], "no special token ids")) << e.warnings()[0];
  }
  m["tokenizer"]["eos_token_id"] = 8;
  m["tokenizer"]["bos_token_id"] = nullptr;
  m["tokenizer"]["pad_token_id"] = nullptr;
  write_manifest(dir_, m);
  expect_bad_input([&] { prefetch_engine{o}; },
                   {(dir_ / "manifest.json").string(), "tokenizer.eos_token_id = 8",
                    (target / "config.json").string(), "eos_token_id = 7"});
  m["tokenizer"]["eos_token_id"] = 7;
  write_manifest(dir_, m);
  EXPECT_TRUE(prefetch_engine(o).warnings().empty());
  // A target with fewer rows than the tokenizer's vocabulary.
  write_bytes(target / "config.json", target_config(500, ", \"eos_token_id\": 7"));
  expect_bad_input([&] { prefetch_engine{o}; },
                   {"manifest.json", "tokenizer.vocab_size = 1000", "has vocab_size = 500"});
}

TEST_F(data_test, prefetch_never_stages_a_token_past_the_vocabulary) {
  // A token past the vocabulary in a shard whose sha256 matches (a
  // manifest edited by hand, or a bug in a writer): refused on the host,
  // naming the shard, the sample, the position and the vocabulary, before
  // any batch reaches the device.  (A target with fewer rows than the
  // manifest's vocab_size is refused before that, by the manifest check;
  // verify_shard's own test covers the target's limit.)
  shards_ = {make_samples(7, 1, 40, 900, 1), {}, make_samples(11, 0, 30, 900, 2)};
  auto m = write_dataset(dir_, shards_, 1000);
  auto t = to_tensors(shards_[2]);
  size_t i = 0;  // the first sample of shard 2 with three tokens or more
  while (shards_[2][i].tokens.size() < 3)
    ++i;
  t.tokens.mutable_data_ptr<int32_t>()[t.offsets.const_data_ptr<int64_t>()[i] + 2] = 950;
  write_shard(shard(2), t, shard_metadata(11, t.tokens.numel()));
  m["shards"][2]["sha256"] = sha256_file_hex(shard(2));  // as a writer would have recorded it
  m.erase("content_hash");
  write_manifest(dir_, m);
  const auto target = dir_ / "target";
  fs::create_directories(target);
  write_bytes(target / "config.json", target_config(1000));
  auto o = engine_options(dir_, 64);
  o.target = target;
  {
    prefetch_engine e(o);
    e.start_epoch(0);
    auto b = e.next();  // 950 < 1000: fine
    ASSERT_TRUE(b.has_value());
    e.release(b->handle);
  }
  m["tokenizer"]["vocab_size"] = 950;
  write_manifest(dir_, m);
  const auto live = transport::live_handles();
  prefetch_engine e(o);
  e.start_epoch(0);
  expect_bad_input([&] { e.next(); },
                   {shard(2).string(), "= 950 is not in [0, tokenizer.vocab_size = 950)",
                    "sample " + std::to_string(i) + " of the shard, global id "
                      + std::to_string(7 + i) + ", position 2 in it"});
  EXPECT_EQ(transport::live_handles(), live);
}

TEST_F(data_test, verify_cost_per_gb) {
  // The cost docs/data.md states: one shard of 16 Mi tokens (80 MiB with its
  // mask), verified three times from the page cache (the first read of a
  // file from disk adds the disk's own time); prints the median.
  constexpr int64_t n = 16 << 20;
  auto tokens = at::randint(0, 151669, {n}, at::TensorOptions().dtype(at::kInt));
  auto mask = at::randint(0, 2, {n}, at::TensorOptions().dtype(at::kByte));
  auto offsets = at::arange(0, n + 1, 4096, at::TensorOptions().dtype(at::kLong));
  const auto samples = offsets.numel() - 1;
  ASSERT_EQ(offsets[samples].item<int64_t>(), n);
  const auto name = shard_file_name(0);
  write_shard(dir_ / name, {tokens, mask, offsets, mask.sum().item<int64_t>()},
              shard_metadata(samples, n));
  json m;
  m["format"] = "tandem.dataset.v1";
  m["tokenizer"] = {{"vocab_size", 151669}};
  m["shards"] = {{{"file", name}, {"num_samples", samples}, {"num_tokens", n},
                  {"num_supervised", mask.sum().item<int64_t>()},
                  {"sha256", sha256_file_hex(dir_ / name)}}};
  m["totals"] = {{"samples", samples}, {"tokens", n}, {"supervised", mask.sum().item<int64_t>()}};
  write_manifest(dir_, m);
  const dataset ds(dir_);
  const double bytes = static_cast<double>(fs::file_size(dir_ / name));
  auto median_of_3 = [&](const shard_check& c) {
    std::vector<double> secs;
    for (int i = 0; i < 3; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      ds.verify_shard(0, c);
      secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(secs.begin(), secs.end());
    return secs[1];
  };
  shard_check values_only;
  values_only.sha256 = false;
  const double all = median_of_3({});
  const double values = median_of_3(values_only);
  std::printf("verify_shard: %.0f MB in %.3f s = %.2f s/GB (%.0f MB/s; SHA extensions %s); "
              "the value scan alone %.3f s = %.2f s/GB\n",
              bytes / 1e6, all, all / (bytes / 1e9), bytes / 1e6 / all,
              sha256::hardware_available() ? "used" : "absent", values, values / (bytes / 1e9));
  EXPECT_GT(all, values);
}

// -------------------------------------------------------------- packer --

/// Every remaining batch of `p`.
std::vector<packed_batch> pack_all(packer& p) {
  std::vector<packed_batch> out;
  while (auto b = p.next())
    out.push_back(std::move(*b));
  return out;
}

::testing::AssertionResult same_batches(const std::vector<packed_batch>& a,
                                        const std::vector<packed_batch>& b) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << a.size() << " vs " << b.size() << " batches";
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].sample_ids != b[i].sample_ids)
      return ::testing::AssertionFailure() << "batch " << i << ": sample ids differ";
    if (!a[i].tokens.equal(b[i].tokens) || !a[i].loss_mask.equal(b[i].loss_mask)
        || !a[i].doc_lengths.equal(b[i].doc_lengths) || !a[i].doc_ids.equal(b[i].doc_ids))
      return ::testing::AssertionFailure() << "batch " << i << ": tensors differ";
    if (a[i].after != b[i].after)
      return ::testing::AssertionFailure() << "batch " << i << ": cursors differ";
    if (a[i].real_tokens != b[i].real_tokens || a[i].truncated_samples != b[i].truncated_samples)
      return ::testing::AssertionFailure() << "batch " << i << ": counts differ";
  }
  return ::testing::AssertionSuccess();
}

class packer_test : public data_test {
protected:
  /// 300 samples of 0–100 tokens in 3 shards, vocab 500 (some samples
  /// longer than the shortest seq_len tested, some empty).
  dataset open_dataset() {
    shards_ = {make_samples(120, 0, 100, 500, 21), make_samples(80, 1, 100, 500, 22),
               make_samples(100, 5, 100, 500, 23)};
    write_dataset(dir_, shards_, 500);
    return dataset(dir_);
  }

  const sample_spec& spec(int64_t id) const {
    for (const auto& s : shards_) {
      if (id < static_cast<int64_t>(s.size()))
        return s[static_cast<size_t>(id)];
      id -= static_cast<int64_t>(s.size());
    }
    throw std::out_of_range("sample id");
  }

  /// Checks one epoch's batches against the dataset: every sample exactly
  /// once, each row the concatenation of its documents, zero padding, the
  /// counts (truncation included), the final cursor.
  void check_epoch(const std::vector<packed_batch>& batches, const std::vector<int64_t>& order,
                   const packer_options& o) {
    std::multiset<int64_t> seen;
    int64_t truncated = 0, truncated_tokens = 0;
    for (size_t bi = 0; bi < batches.size(); ++bi) {
      const auto& b = batches[bi];
      SCOPED_TRACE("batch " + std::to_string(bi));
      ASSERT_EQ(b.tokens.sizes(), (at::IntArrayRef{o.rows, o.seq_len}));
      ASSERT_EQ(b.loss_mask.sizes(), (at::IntArrayRef{o.rows, o.seq_len}));
      ASSERT_EQ(b.doc_lengths.sizes(), (at::IntArrayRef{o.rows, o.max_docs}));
      ASSERT_EQ(b.doc_ids.sizes(), (at::IntArrayRef{o.rows, o.max_docs}));
      EXPECT_EQ(b.tokens.scalar_type(), at::kInt);
      EXPECT_EQ(b.loss_mask.scalar_type(), at::kByte);
      EXPECT_EQ(b.doc_lengths.scalar_type(), at::kLong);
      const auto* tok = b.tokens.const_data_ptr<int32_t>();
      const auto* mask = b.loss_mask.const_data_ptr<uint8_t>();
      const auto* len = b.doc_lengths.const_data_ptr<int64_t>();
      const auto* ids = b.doc_ids.const_data_ptr<int64_t>();
      std::vector<int64_t> row_major_ids;
      int64_t real = 0;
      for (int64_t r = 0; r < o.rows; ++r) {
        std::vector<int32_t> want_tok;
        std::vector<uint8_t> want_mask;
        int64_t row_sum = 0;
        bool ended = false;
        for (int64_t k = 0; k < o.max_docs; ++k) {
          const int64_t id = ids[r * o.max_docs + k], l = len[r * o.max_docs + k];
          if (id < 0) {
            EXPECT_EQ(l, 0);
            ended = true;
            continue;
          }
          EXPECT_FALSE(ended) << "a document after an empty slot in row " << r;
          const auto& s = spec(id);
          const auto full = static_cast<int64_t>(s.tokens.size());
          EXPECT_EQ(l, std::min(full, o.seq_len)) << "sample " << id;
          if (full > o.seq_len) {
            ++truncated;
            truncated_tokens += full - o.seq_len;
          }
          want_tok.insert(want_tok.end(), s.tokens.begin(), s.tokens.begin() + l);
          want_mask.insert(want_mask.end(), s.mask.begin(), s.mask.begin() + l);
          row_sum += l;
          row_major_ids.push_back(id);
          seen.insert(id);
        }
        ASSERT_LE(row_sum, o.seq_len) << "row " << r;
        real += row_sum;
        want_tok.resize(static_cast<size_t>(o.seq_len), 0);   // padding: token 0 …
        want_mask.resize(static_cast<size_t>(o.seq_len), 0);  // … and loss_mask 0
        EXPECT_EQ(std::vector<int32_t>(tok + r * o.seq_len, tok + (r + 1) * o.seq_len), want_tok)
          << "row " << r;
        EXPECT_EQ(std::vector<uint8_t>(mask + r * o.seq_len, mask + (r + 1) * o.seq_len), want_mask)
          << "row " << r;
      }
      EXPECT_EQ(b.sample_ids, row_major_ids);
      EXPECT_EQ(b.real_tokens, real);
      EXPECT_EQ(b.doc_lengths.sum().item<int64_t>(), real);
      EXPECT_EQ(b.padding_tokens, o.rows * o.seq_len - real);
      EXPECT_DOUBLE_EQ(b.padding_waste(),
                       static_cast<double>(o.rows * o.seq_len - real) / (o.rows * o.seq_len));
    }
    // Every sample of the order exactly once.
    EXPECT_EQ(seen, std::multiset<int64_t>(order.begin(), order.end()));
    int64_t got_truncated = 0, got_truncated_tokens = 0;
    for (const auto& b : batches) {
      got_truncated += b.truncated_samples;
      got_truncated_tokens += b.truncated_tokens;
    }
    EXPECT_EQ(got_truncated, truncated);
    EXPECT_EQ(got_truncated_tokens, truncated_tokens);
    // The last cursor is the end of the epoch.
    ASSERT_FALSE(batches.empty());
    EXPECT_EQ(batches.back().after.position, static_cast<int64_t>(order.size()));
    EXPECT_TRUE(batches.back().after.taken.empty());
  }
};

std::vector<packer_options> option_grid() {
  std::vector<packer_options> out;
  for (int64_t rows : {1, 4})
    for (int64_t seq : {64, 256})
      for (int64_t docs : {1, 3, 16})
        for (int64_t w : {1, 16}) {
          packer_options o;
          o.rows = rows;
          o.seq_len = seq;
          o.max_docs = docs;
          o.lookahead = w;
          out.push_back(o);
        }
  return out;
}

std::string describe(const packer_options& o) {
  return "rows " + std::to_string(o.rows) + " seq_len " + std::to_string(o.seq_len)
         + " max_docs " + std::to_string(o.max_docs) + " lookahead " + std::to_string(o.lookahead);
}

TEST_F(packer_test, every_sample_exactly_once_and_rows_are_their_samples_concatenated) {
  const auto ds = open_dataset();
  for (const auto& o : option_grid()) {
    SCOPED_TRACE(describe(o));
    const auto order = epoch_order(ds.num_samples(), 99, 0);
    packer p(ds, order, o);
    const auto batches = pack_all(p);
    check_epoch(batches, order, o);
    const auto& s = p.stats();
    EXPECT_EQ(s.batches, static_cast<int64_t>(batches.size()));
    EXPECT_EQ(s.samples, ds.num_samples());
    EXPECT_EQ(s.real_tokens + s.padding_tokens,
              static_cast<int64_t>(batches.size()) * o.rows * o.seq_len);
    if (o.seq_len == 256) {
      EXPECT_EQ(s.truncated_samples, 0);
    } else {
      EXPECT_GT(s.truncated_samples, 0);
    }
    EXPECT_FALSE(p.next().has_value());  // stays at the end
  }
}

TEST_F(packer_test, truncation_is_counted) {
  const auto ds = open_dataset();
  packer_options o;
  o.rows = 2;
  o.seq_len = 50;
  const auto order = epoch_order(ds.num_samples(), 3, 0);
  packer p(ds, order, o);
  pack_all(p);
  int64_t want = 0, want_tokens = 0;
  for (int64_t id = 0; id < ds.num_samples(); ++id) {
    const auto l = ds.sample_length(id);
    want += l > 50;
    want_tokens += std::max<int64_t>(l - 50, 0);
  }
  ASSERT_GT(want, 0);
  EXPECT_EQ(p.stats().truncated_samples, want);
  EXPECT_EQ(p.stats().truncated_tokens, want_tokens);
  EXPECT_EQ(p.stats().real_tokens + want_tokens, ds.num_tokens());
}

TEST_F(packer_test, is_deterministic_and_a_wider_look_ahead_pads_less) {
  const auto ds = open_dataset();
  const auto order = epoch_order(ds.num_samples(), 5, 1);
  packer_options o;
  o.rows = 2;
  o.seq_len = 256;
  packer a(ds, order, o), b(ds, order, o);
  EXPECT_TRUE(same_batches(pack_all(a), pack_all(b)));
  o.lookahead = 1;
  packer narrow(ds, order, o);
  pack_all(narrow);
  std::printf("padding waste: look-ahead 16 %.4f, look-ahead 1 %.4f\n",
              a.stats().padding_waste(), narrow.stats().padding_waste());
  EXPECT_LT(a.stats().padding_waste(), narrow.stats().padding_waste());
  EXPECT_DOUBLE_EQ(a.stats().padding_waste(),
                   static_cast<double>(a.stats().padding_tokens)
                     / (a.stats().batches * o.rows * o.seq_len));
}

TEST_F(packer_test, resuming_from_any_cursor_gives_the_same_remaining_batches) {
  const auto ds = open_dataset();
  int configs_with_taken = 0;
  for (const auto& o : option_grid()) {
    SCOPED_TRACE(describe(o));
    const auto order = rank_order(epoch_order(ds.num_samples(), 17, 2), 1, 2);
    packer whole(ds, order, o, {2, 0, {}});
    const auto all = pack_all(whole);
    bool saw_taken = false;
    for (size_t k = 0; k < all.size(); ++k) {
      const auto& c = all[k].after;
      EXPECT_EQ(c.epoch, 2);
      saw_taken |= !c.taken.empty();
      packer resumed(ds, order, o, c);
      EXPECT_EQ(resumed.position(), c);
      const auto rest = pack_all(resumed);
      ASSERT_TRUE(same_batches(rest, std::vector<packed_batch>(all.begin() + k + 1, all.end())))
        << "resumed after batch " << k;
    }
    if (o.lookahead == 1) {
      EXPECT_FALSE(saw_taken) << "without look-ahead, samples are taken in order";
    }
    configs_with_taken += saw_taken;
  }
  // The look-ahead took samples out of order somewhere, so `taken` was exercised.
  EXPECT_GT(configs_with_taken, 4);
}

TEST_F(packer_test, resuming_through_make_epoch_packer_covers_each_rank_exactly) {
  const auto ds = open_dataset();
  packer_options o;
  o.rows = 3;
  o.seq_len = 128;
  const int64_t world = 3;
  std::multiset<int64_t> seen;
  for (int64_t rank = 0; rank < world; ++rank) {
    // Pack two batches, "crash", resume from the second's cursor.
    auto first = make_epoch_packer(ds, 8, rank, world, o, {4, 0, {}});
    std::vector<int64_t> ids;
    cursor c;
    for (int i = 0; i < 2; ++i) {
      auto b = first.next();
      ASSERT_TRUE(b.has_value());
      ids.insert(ids.end(), b->sample_ids.begin(), b->sample_ids.end());
      c = b->after;
    }
    auto second = make_epoch_packer(ds, 8, rank, world, o, c);
    while (auto b = second.next())
      ids.insert(ids.end(), b->sample_ids.begin(), b->sample_ids.end());
    const auto mine = rank_order(epoch_order(ds.num_samples(), 8, 4), rank, world);
    EXPECT_EQ(std::multiset<int64_t>(ids.begin(), ids.end()),
              std::multiset<int64_t>(mine.begin(), mine.end()));
    seen.insert(ids.begin(), ids.end());
  }
  std::vector<int64_t> all(seen.begin(), seen.end());
  EXPECT_TRUE(is_permutation_of_iota(all));
}

TEST_F(packer_test, doc_lengths_feed_make_doc_layout) {
  const auto ds = open_dataset();
  packer_options o;
  o.rows = 4;
  o.seq_len = 256;
  o.max_docs = 8;
  packer p(ds, epoch_order(ds.num_samples(), 1, 0), o);
  auto b = p.next();
  ASSERT_TRUE(b.has_value());
  const auto layout = make_doc_layout(b->doc_lengths, o.seq_len);
  const auto* len = b->doc_lengths.const_data_ptr<int64_t>();
  const auto pos = layout.position.contiguous();
  const auto start = layout.start.contiguous();
  for (int64_t r = 0; r < o.rows; ++r) {
    int64_t col = 0;
    for (int64_t k = 0; k < o.max_docs; ++k) {
      for (int64_t i = 0; i < len[r * o.max_docs + k]; ++i, ++col) {
        ASSERT_EQ(pos[r][col].item<int64_t>(), i) << "row " << r << " col " << col;
        ASSERT_EQ(start[r][col].item<int64_t>(), col - i);
      }
    }
  }
}

TEST_F(packer_test, pinned_memory_only_when_cuda_is_available) {
  const auto ds = open_dataset();
  packer_options o;
  o.rows = 2;
  o.seq_len = 128;
  o.pinned = true;
  packer p(ds, epoch_order(ds.num_samples(), 1, 0), o);
  auto b = p.next();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->tokens.is_pinned(), at::hasCUDA());
  EXPECT_EQ(b->loss_mask.is_pinned(), at::hasCUDA());
  o.pinned = false;
  packer q(ds, epoch_order(ds.num_samples(), 1, 0), o);
  EXPECT_FALSE(q.next()->tokens.is_pinned());
}

TEST_F(packer_test, count_rest_and_count_steps_agree_with_the_batches_the_packers_produce) {
  const auto ds = open_dataset();
  for (const auto& o : option_grid()) {
    SCOPED_TRACE(describe(o));
    // count_rest: from a fresh cursor and from one in the middle of an epoch.
    auto full = make_epoch_packer(ds, 7, 0, 1, o);
    const auto all = pack_all(full);
    EXPECT_EQ(make_epoch_packer(ds, 7, 0, 1, o).count_rest(), static_cast<int64_t>(all.size()));
    const auto mid = all[all.size() / 2].after;
    auto rest = make_epoch_packer(ds, 7, 0, 1, o, mid);
    EXPECT_EQ(rest.count_rest(), static_cast<int64_t>(all.size() - all.size() / 2 - 1));
    EXPECT_FALSE(rest.next().has_value());
    // count_steps: every epoch's batches of every rank, dealt `drafters` a
    // step, the epoch's last step with fewer.
    for (int64_t ranks : {1, 3})
      for (int64_t drafters : {1, 2, 4}) {
        int64_t want = 0;
        for (int64_t e = 0; e < 3; ++e) {
          int64_t batches = 0;
          for (int64_t r = 0; r < ranks; ++r) {
            auto p = make_epoch_packer(ds, 7, r, ranks, o, cursor{e, 0, {}});
            batches += static_cast<int64_t>(pack_all(p).size());
          }
          want += (batches + drafters - 1) / drafters;
        }
        const auto got = count_steps(ds, 7, ranks, drafters, o, 3);
        EXPECT_EQ(got.steps, want) << ranks << " ranks, " << drafters << " drafters";
        EXPECT_EQ(got.epochs_counted, 3);
      }
  }
  // Past the budget the later epochs are scaled from the counted ones.
  packer_options o;
  o.seq_len = 256;
  const auto one = count_steps(ds, 7, 1, 1, o, 1).steps;
  const auto scaled = count_steps(ds, 7, 1, 1, o, 10, 1);
  EXPECT_EQ(scaled.epochs_counted, 1);
  EXPECT_EQ(scaled.steps, 10 * one);
  EXPECT_EQ(count_steps(ds, 7, 1, 1, o, 0).steps, 0);
  EXPECT_THROW(count_steps(ds, 7, 0, 1, o, 1), tandem::gpu::error);
}

TEST_F(packer_test, rejects_bad_options_and_cursors) {
  const auto ds = open_dataset();
  const auto order = epoch_order(ds.num_samples(), 1, 0);
  packer_options o;
  o.rows = 0;
  expect_bad_input([&] { packer{ds, order, o}; }, {"packer", "rows = 0"});
  o = {};
  o.lookahead = 0;
  expect_bad_input([&] { packer{ds, order, o}; }, {"packer", "lookahead = 0"});
  expect_bad_input([&] { packer{ds, order, {}, {0, 301, {}}}; }, {"cursor position 301"});
  expect_bad_input([&] { packer{ds, order, {}, {0, 5, {5}}}; }, {"cursor taken[0] = 5"});
  expect_bad_input([&] { packer{ds, order, {}, {0, 5, {9, 7}}}; }, {"cursor taken[1] = 7"});
  expect_bad_input(
    [&] {
      packer p(ds, {0, 1, 300}, {});
      p.next();
    },
    {"sample id 300"});
}

// --------------------------------------------------------------- bench --

TEST_F(data_test, synthetic_dataset_verifies_and_bench_reports_one_json_line) {
  synthetic_spec spec;
  spec.samples = 500;
  spec.shards = 3;
  write_synthetic_dataset(dir_, spec);
  dataset_options verify;
  verify.verify_hashes = true;
  const dataset ds(dir_, verify);
  EXPECT_EQ(ds.num_samples(), 500);
  EXPECT_GE(ds.max_sample_length(), 200);
  EXPECT_LE(ds.max_sample_length(), 3000);

  const auto line = bench_prefetch_json(dir_, 2, 3072, 0.2);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const auto j = json::parse(line);
  EXPECT_EQ(j["schema"], 1);
  EXPECT_EQ(j["case"], "prefetch_pack");
  EXPECT_EQ(j["rows"], 2);
  EXPECT_EQ(j["seq_len"], 3072);
  EXPECT_GT(j["samples_per_s"].get<double>(), 0);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
  EXPECT_GE(j["padding_waste"].get<double>(), 0);
  EXPECT_LT(j["padding_waste"].get<double>(), 1);
  std::printf("%s\n", line.c_str());
}

} // namespace
