// gpu/hf_config: Qwen3 and DFlash config.json files (transformers 4 and 5
// layouts, z-lab's DFlash layout), their errors, the default tap ids, and
// cross-checks with transformers and the dflash package run by TANDEM_PYTHON.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <ftw.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpu/device/error.hpp"
#include "gpu/io/hf_config.hpp"
#include "gpu/io/model_tokens.hpp"
#include "tests/unit/expect_error.hpp"
#include "tests/unit/files.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace tandem;
using namespace tandem::gpu;

using tandem::test::remove_tree;
using tandem::test::run_python;

namespace {

using tandem::test::expect_bad_input;

/// Qwen3-8B's config.json as transformers 4 writes it (the fields that matter).
json qwen3_8b() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
    "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936})");
}

/// z-lab/Qwen3-8B-DFlash-b16's config.json (the fields DFLASH.md lists).
json zlab_8b() {
  return json::parse(R"({
    "architectures": ["DFlashDraftModel"], "block_size": 16, "num_target_layers": 36,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
    "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 5,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000, "vocab_size": 151936,
    "tie_word_embeddings": false, "max_position_embeddings": 40960, "model_type": "qwen3",
    "dtype": "bfloat16", "attention_bias": false, "hidden_act": "silu"})");
}

class hf_config_test : public ::testing::Test {
protected:
  void SetUp() override {
    auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path()
           / ("tandem_cfg_" + std::to_string(::getpid()) + "_" + info->name());
    remove_tree(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    remove_tree(dir_);
  }

  /// Writes `text` to dir_/name and returns its path.
  fs::path write_text(const std::string& name, const std::string& text) {
    auto p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p;
  }
  fs::path write(const std::string& name, const json& j) { return write_text(name, j.dump(2)); }

  fs::path dir_;
};

// ------------------------------------------------------------------ qwen3 --

TEST_F(hf_config_test, qwen3_reads_the_transformers4_layout) {
  auto c = load_qwen3_config(write("config.json", qwen3_8b()));
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 12288);
  EXPECT_EQ(c.num_hidden_layers, 36);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
}

TEST_F(hf_config_test, model_tokens_special_token_ids_one_a_list_or_none) {
  // Compared with the data set's tokenizer (gpu/data/identity.hpp).
  auto j = qwen3_8b();
  j["eos_token_id"] = 151645;
  j["bos_token_id"] = 151643;
  j.erase("pad_token_id");
  auto t = load_model_tokens(write("one.json", j));
  EXPECT_EQ(t.vocab_size, 151936);
  EXPECT_EQ(t.eos_token_ids, (std::vector<int64_t>{151645}));
  EXPECT_EQ(t.bos_token_id, 151643);
  EXPECT_EQ(t.pad_token_id, -1);
  EXPECT_EQ(t.file, dir_ / "one.json");
  j["eos_token_id"] = {151643, 151645};
  j["bos_token_id"] = nullptr;
  j["pad_token_id"] = 151643;
  t = load_model_tokens(write("list.json", j));
  EXPECT_EQ(t.eos_token_ids, (std::vector<int64_t>{151643, 151645}));
  EXPECT_EQ(t.bos_token_id, -1);
  EXPECT_EQ(t.pad_token_id, 151643);
  EXPECT_EQ(load_model_tokens(dir_ / "list.json").file, dir_ / "list.json");
  j["eos_token_id"] = "x";
  expect_bad_input([&] { load_model_tokens(write("bad.json", j)); }, {"bad.json", "'eos_token_id'"});
  j.erase("vocab_size");
  expect_bad_input([&] { load_model_tokens(write("novocab.json", j)); },
                   {"novocab.json", "missing field 'vocab_size'"});
}

TEST_F(hf_config_test, qwen3_accepts_the_directory_holding_config_json) {
  write("model/config.json", qwen3_8b());
  EXPECT_EQ(load_qwen3_config(dir_ / "model").hidden_size, 4096);
}

TEST_F(hf_config_test, qwen3_tied_embeddings) {
  auto j = qwen3_8b();
  j["tie_word_embeddings"] = true;  // Qwen3-4B
  EXPECT_TRUE(load_qwen3_config(write("config.json", j)).tie_word_embeddings);
}

TEST_F(hf_config_test, qwen3_defaults_head_dim_and_kv_heads) {
  auto j = qwen3_8b();
  j.erase("head_dim");
  j.erase("num_key_value_heads");
  j.erase("max_position_embeddings");
  auto c = load_qwen3_config(write("config.json", j));
  EXPECT_EQ(c.head_dim, 4096 / 32);
  EXPECT_EQ(c.num_key_value_heads, 32);
  EXPECT_EQ(c.max_position_embeddings, 32768);
}

TEST_F(hf_config_test, qwen3_reads_transformers5_rope_parameters) {
  // transformers 5: no `architectures` in a bare config, theta nested.
  auto j = qwen3_8b();
  j.erase("architectures");
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_theta", 5e6}, {"rope_type", "default"}};
  EXPECT_DOUBLE_EQ(load_qwen3_config(write("config.json", j)).rope_theta, 5e6);

  j.erase("rope_parameters");
  j["rope_scaling"] = {{"rope_theta", 2e6}, {"type", "default"}};
  EXPECT_DOUBLE_EQ(load_qwen3_config(write("config.json", j)).rope_theta, 2e6);
}

TEST_F(hf_config_test, qwen3_rejects_scaled_or_conflicting_rope) {
  auto j = qwen3_8b();
  j["rope_parameters"] = {{"rope_theta", 1e6}, {"rope_type", "yarn"}, {"factor", 4.0}};
  expect_bad_input([&] { load_qwen3_config(write("yarn.json", j)); },
                   {"yarn.json", "rope_parameters.rope_type", "yarn", "default"});
  j["rope_parameters"] = {{"rope_theta", 5e5}, {"rope_type", "default"}};
  expect_bad_input([&] { load_qwen3_config(write("conflict.json", j)); },
                   {"conflict.json", "rope_parameters.rope_theta", "rope_theta"});
  j.erase("rope_parameters");
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  expect_bad_input([&] { load_qwen3_config(write("linear.json", j)); },
                   {"linear.json", "rope_scaling.type", "linear"});
}

TEST_F(hf_config_test, qwen3_missing_or_malformed_fields_are_named) {
  for (const char* field : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads"}) {
    auto j = qwen3_8b();
    j.erase(field);
    const std::string name = std::string("no_") + field + ".json";
    expect_bad_input([&] { load_qwen3_config(write(name, j)); },
                     {name, std::string("missing field '") + field + "'"});
  }
  auto j = qwen3_8b();
  j["hidden_size"] = "4096";
  expect_bad_input([&] { load_qwen3_config(write("str.json", j)); },
                   {"str.json", "'hidden_size'", "integer"});
  j = qwen3_8b();
  j["num_hidden_layers"] = 0;
  expect_bad_input([&] { load_qwen3_config(write("zero.json", j)); },
                   {"zero.json", "'num_hidden_layers'", "> 0"});
  j = qwen3_8b();
  j["num_key_value_heads"] = 5;
  expect_bad_input([&] { load_qwen3_config(write("gqa.json", j)); },
                   {"gqa.json", "'num_attention_heads'", "'num_key_value_heads'"});
  j = qwen3_8b();
  j["rms_norm_eps"] = -1;
  expect_bad_input([&] { load_qwen3_config(write("eps.json", j)); }, {"eps.json", "'rms_norm_eps'"});
  j = qwen3_8b();
  j["tie_word_embeddings"] = "yes";
  expect_bad_input([&] { load_qwen3_config(write("tie.json", j)); },
                   {"tie.json", "'tie_word_embeddings'"});
  j = qwen3_8b();
  j["hidden_act"] = "gelu";
  expect_bad_input([&] { load_qwen3_config(write("act.json", j)); },
                   {"act.json", "'hidden_act'", "gelu"});
  j = qwen3_8b();
  j["use_sliding_window"] = true;
  expect_bad_input([&] { load_qwen3_config(write("swa.json", j)); },
                   {"swa.json", "'use_sliding_window'"});
  j = qwen3_8b();
  j.erase("head_dim");
  j["hidden_size"] = 4000;
  j["num_attention_heads"] = 48;
  j["num_key_value_heads"] = 8;
  expect_bad_input([&] { load_qwen3_config(write("hd.json", j)); }, {"hd.json", "'head_dim'"});
}

TEST_F(hf_config_test, qwen3_unknown_architecture_is_named) {
  auto j = qwen3_8b();
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  const auto p = write("llama.json", j);
  try {
    load_qwen3_config(p);
    ADD_FAILURE() << "no error";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::bad_input);
    EXPECT_EQ(std::string(e.what()), "unknown architecture LlamaForCausalLM in " + p.string()
                                         + " (Tandem supports Qwen3ForCausalLM)");
  }
  // A DFlash drafter is model_type qwen3 but not a causal LM.
  expect_bad_input([&] { load_qwen3_config(write("drafter.json", zlab_8b())); },
                   {"unknown architecture DFlashDraftModel", "drafter.json"});
  j.erase("architectures");
  j["model_type"] = "mistral";
  expect_bad_input([&] { load_qwen3_config(write("mistral.json", j)); },
                   {"unknown architecture", "mistral", "mistral.json"});
}

TEST_F(hf_config_test, missing_or_invalid_file_is_named) {
  expect_bad_input([&] { load_qwen3_config(dir_ / "absent.json"); }, {"absent.json", "no such file"});
  expect_bad_input([&] { load_qwen3_config(dir_); }, {"config.json", "no such file"});
  expect_bad_input([&] { load_qwen3_config(write_text("broken.json", "{\"hidden_size\": ")); },
                   {"broken.json", "not valid JSON"});
  expect_bad_input([&] { load_dflash_config(write_text("list.json", "[1]")); },
                   {"list.json", "JSON object"});
}

// ----------------------------------------------------------------- dflash --

TEST_F(hf_config_test, dflash_reads_the_zlab_layout) {
  auto d = load_dflash_config(write("config.json", zlab_8b()));
  EXPECT_EQ(d.block_size, 16);
  EXPECT_EQ(d.num_target_layers, 36);
  EXPECT_EQ(d.mask_token_id, 151669);
  EXPECT_EQ(d.target_layer_ids, (std::vector<int64_t>{1, 9, 17, 25, 33}));
  EXPECT_EQ(d.layer.num_hidden_layers, 5);
  EXPECT_EQ(d.layer.hidden_size, 4096);
  EXPECT_EQ(d.layer.head_dim, 128);
  EXPECT_EQ(d.layer.vocab_size, 151936);
  EXPECT_DOUBLE_EQ(d.layer.rope_theta, 1e6);
}

TEST_F(hf_config_test, dflash_defaults_follow_the_dflash_package) {
  auto j = zlab_8b();
  j["dflash_config"].erase("target_layer_ids");
  j.erase("block_size");
  auto d = load_dflash_config(write("config.json", j));
  EXPECT_EQ(d.block_size, 16);
  EXPECT_EQ(d.target_layer_ids, (std::vector<int64_t>{1, 9, 17, 25, 33}));
  // dflash takes one tap per draft layer when the ids are not given.
  j["num_hidden_layers"] = 3;
  EXPECT_EQ(load_dflash_config(write("three.json", j)).target_layer_ids,
            default_tap_ids(36, 3));
  // Fields at the top level are the fallback, as in dflash's _draft_value.
  j = zlab_8b();
  j.erase("dflash_config");
  j["mask_token_id"] = 7;
  j["target_layer_ids"] = {2, 4};
  d = load_dflash_config(write("top.json", j));
  EXPECT_EQ(d.mask_token_id, 7);
  EXPECT_EQ(d.target_layer_ids, (std::vector<int64_t>{2, 4}));
}

TEST_F(hf_config_test, dflash_mask_token_must_be_a_row_of_the_embedding) {
  auto j = zlab_8b();
  j["dflash_config"]["mask_token_id"] = 151936;
  expect_bad_input([&] { load_dflash_config(write("mask.json", j)); },
                   {"mask.json", "'dflash_config.mask_token_id'", "151936", "vocab_size"});
  j["dflash_config"]["mask_token_id"] = -1;
  expect_bad_input([&] { load_dflash_config(write("neg.json", j)); },
                   {"neg.json", "'dflash_config.mask_token_id'"});
  j["dflash_config"].erase("mask_token_id");
  expect_bad_input([&] { load_dflash_config(write("nomask.json", j)); },
                   {"nomask.json", "missing field 'dflash_config.mask_token_id'"});
}

TEST_F(hf_config_test, dflash_fields_are_validated) {
  auto j = zlab_8b();
  j["dflash_config"]["target_layer_ids"] = {1, 9, 36};
  expect_bad_input([&] { load_dflash_config(write("ids.json", j)); },
                   {"ids.json", "'dflash_config.target_layer_ids[2]'", "36"});
  j = zlab_8b();
  j["dflash_config"]["target_layer_ids"] = json::array();
  expect_bad_input([&] { load_dflash_config(write("noids.json", j)); },
                   {"noids.json", "'dflash_config.target_layer_ids'"});
  j = zlab_8b();
  j.erase("num_target_layers");
  expect_bad_input([&] { load_dflash_config(write("ntl.json", j)); },
                   {"ntl.json", "missing field 'num_target_layers'"});
  j = zlab_8b();
  j["block_size"] = 1;
  expect_bad_input([&] { load_dflash_config(write("bs.json", j)); }, {"bs.json", "'block_size'"});
  j = zlab_8b();
  j["dflash_config"] = 3;
  expect_bad_input([&] { load_dflash_config(write("dc.json", j)); }, {"dc.json", "'dflash_config'"});
  j = zlab_8b();
  j["architectures"] = {"Qwen3ForCausalLM"};
  expect_bad_input([&] { load_dflash_config(write("target.json", j)); },
                   {"unknown architecture Qwen3ForCausalLM in", "target.json", "DFlashDraftModel"});
}

TEST_F(hf_config_test, to_json_writes_the_zlab_layout_and_round_trips) {
  auto d = load_dflash_config(write("config.json", zlab_8b()));
  auto j = json::parse(to_json(d));
  auto want = zlab_8b();
  for (auto it = want.begin(); it != want.end(); ++it)
    EXPECT_EQ(j.at(it.key()), it.value()) << it.key();
  EXPECT_EQ(j.size(), want.size()) << j.dump(2);
  EXPECT_EQ(json::parse(to_json(d, "float32"))["dtype"], "float32");
  EXPECT_EQ(dflash_config_json(d), to_json(d));
  expect_bad_input([&] { to_json(d, "int8"); }, {"int8"});

  d.layer.tie_word_embeddings = true;
  d.mask_token_id = 12;
  d.target_layer_ids = {0, 35};
  auto e = load_dflash_config(write_text("again.json", to_json(d)));
  EXPECT_EQ(e.mask_token_id, 12);
  EXPECT_EQ(e.target_layer_ids, d.target_layer_ids);
  EXPECT_TRUE(e.layer.tie_word_embeddings);
  EXPECT_EQ(e.block_size, d.block_size);
  EXPECT_EQ(e.num_target_layers, d.num_target_layers);
  EXPECT_EQ(e.layer.intermediate_size, d.layer.intermediate_size);
  EXPECT_EQ(e.layer.max_position_embeddings, d.layer.max_position_embeddings);
  EXPECT_DOUBLE_EQ(e.layer.rms_norm_eps, d.layer.rms_norm_eps);
}

// ------------------------------------------------------------------- taps --

TEST(hf_config, default_tap_ids) {
  EXPECT_EQ(default_tap_ids(36, 5), (std::vector<int64_t>{1, 9, 17, 25, 33}));  // Qwen3-8B
  EXPECT_EQ(default_tap_ids(8, 5), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(default_tap_ids(28, 5), (std::vector<int64_t>{1, 7, 13, 19, 25}));
  EXPECT_EQ(default_tap_ids(36, 1), (std::vector<int64_t>{18}));
  EXPECT_EQ(default_tap_ids(7, 1), (std::vector<int64_t>{3}));
  // 1 + i*3/4 for i = 2 is 2.5: half to even gives 2, not 3.
  EXPECT_EQ(default_tap_ids(7, 5), (std::vector<int64_t>{1, 2, 2, 3, 4}));
  expect_bad_input([] { default_tap_ids(0, 5); }, {"num_target_layers"});
  expect_bad_input([] { default_tap_ids(36, 0); }, {"num_taps"});
  expect_bad_input([] { default_tap_ids(2, 5); }, {"too few"});
}

// ------------------------------------------- cross-checks with Python --

TEST_F(hf_config_test, default_tap_ids_match_the_dflash_package) {
  auto script = write_text("taps.py", R"PY(
from dflash.model import build_target_layer_ids
for L in range(4, 101):
    for n in range(1, 11):
        print(L, n, *build_target_layer_ids(L, n))
)PY");
  auto [rc, out] = run_python("'" + script.string() + "'");
  ASSERT_EQ(rc, 0) << out;
  std::istringstream lines(out);
  std::string line;
  int checked = 0;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    int64_t l = 0, n = 0, id = 0;
    if (!(in >> l >> n))
      continue;
    std::vector<int64_t> want;
    while (in >> id)
      want.push_back(id);
    EXPECT_EQ(default_tap_ids(l, n), want) << "L=" << l << " n=" << n;
    ++checked;
  }
  EXPECT_EQ(checked, 97 * 10) << out;
}

TEST_F(hf_config_test, transformers_written_qwen3_config_reads) {
  // transformers 5 writes rope_parameters and no architectures for a bare config.
  auto script = write_text("qwen3.py", R"PY(
import sys
from transformers import Qwen3Config
Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
            max_position_embeddings=256, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6}).save_pretrained(sys.argv[1])
)PY");
  auto [rc, out] = run_python("'" + script.string() + "' '" + (dir_ / "hf").string() + "'");
  ASSERT_EQ(rc, 0) << out;
  auto c = load_qwen3_config(dir_ / "hf");
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 128);
  EXPECT_EQ(c.num_hidden_layers, 8);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.max_position_embeddings, 256);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_TRUE(c.tie_word_embeddings);
}

TEST_F(hf_config_test, dflash_package_reads_our_config) {
  dflash_config d;
  d.layer = {512, 64, 128, 2, 4, 2, 16, 256, 1e-6, 1e6, false, false};
  d.block_size = 8;
  d.num_target_layers = 8;
  d.mask_token_id = 500;
  d.target_layer_ids = default_tap_ids(8, 5);
  write_text("zl/config.json", to_json(d, "float32"));
  auto script = write_text("load.py", R"PY(
import sys, json
from transformers import AutoConfig
from dflash.model import DFlashDraftModel
cfg = AutoConfig.from_pretrained(sys.argv[1])
m = DFlashDraftModel(cfg)
print(json.dumps({"block_size": m.block_size, "mask_token_id": m.mask_token_id,
                  "target_layer_ids": list(m.target_layer_ids), "layers": len(m.layers),
                  "fc_in": m.fc.in_features, "head_dim": m.layers[0].self_attn.head_dim,
                  "rope_theta": cfg.rope_parameters["rope_theta"]}))
)PY");
  auto [rc, out] = run_python("'" + script.string() + "' '" + (dir_ / "zl").string() + "'");
  ASSERT_EQ(rc, 0) << out;
  auto j = json::parse(out.substr(out.rfind('{')));
  EXPECT_EQ(j["block_size"], 8);
  EXPECT_EQ(j["mask_token_id"], 500);
  EXPECT_EQ(j["target_layer_ids"], json({1, 2, 3, 4, 5}));
  EXPECT_EQ(j["layers"], 2);
  EXPECT_EQ(j["fc_in"], 5 * 64);
  EXPECT_EQ(j["head_dim"], 16);
  EXPECT_EQ(j["rope_theta"], 1e6);
}

} // namespace

// The taps a run uses without model.tap_layers: DFlash's default from 8
// layers up, else min(5, L) distinct layers in order — never a repeated or
// out-of-order tap (default_tap_ids(4, 5) would be [1, 1, 1, 1, 1]).
TEST(hf_config, training_tap_ids) {
  EXPECT_EQ(training_tap_ids(36), (std::vector<int64_t>{1, 9, 17, 25, 33}));
  EXPECT_EQ(training_tap_ids(8), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(training_tap_ids(7), (std::vector<int64_t>{0, 2, 3, 5, 6}));
  EXPECT_EQ(training_tap_ids(4), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(training_tap_ids(2), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(training_tap_ids(1), (std::vector<int64_t>{0}));
  for (int64_t L = 1; L <= 80; ++L) {
    const auto ids = training_tap_ids(L);
    ASSERT_EQ(ids.size(), static_cast<size_t>(std::min<int64_t>(5, L))) << L;
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_TRUE(ids[i] >= 0 && ids[i] < L) << L;
      if (i > 0)
        EXPECT_LT(ids[i - 1], ids[i]) << L;
    }
  }
}
