// Run configuration: defaults, every section, paths, --set overrides,
// located errors with suggestions, faults, placement (8 / 1 / 0 GPUs, all
// validated on the CPU), to_toml round trips, and the shipped examples.
#include <algorithm>
#include <fstream>
#include <functional>
#include <sstream>
#include <unistd.h>

#include <gtest/gtest.h>

#include "launch/run_config.hpp"

namespace fs = std::filesystem;
using namespace tandem;

namespace {

/// A fresh folder per test, removed afterwards.
class run_config_test : public ::testing::Test {
protected:
  void SetUp() override {
    auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("tandem_run_config_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, const std::string& text) {
    auto p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p;
  }

  fs::path dir_;
};

/// The message of the config_error `f` throws (fails the test if none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const config_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no config_error thrown";
  return {};
}

/// The three required keys, nothing else.
const std::string minimal = "[model]\n"
                            "target = \"/models/q\"\n"
                            "[drafter]\n"
                            "mask_token_id = 7\n"
                            "[data]\n"
                            "path = \"/data/d\"\n";

/// Every field with a value other than its default.
const std::string everything = R"([model]
target = "/models/Qwen3-8B"
tap_layers = [1, 9, 17, 25, 33]
dtype = "bfloat16"

[drafter]
layers = 5
block_size = 8
mask_token_id = 151669
seed = 11
init_from = "/ckpt/step-100"

[data]
path = "/data/regen"
seq_len = 4096
rows = 2
anchors = 256
max_docs = 8
lookahead = 32
seed = 12
epochs = 6

[train]
lr = 3e-4
warmup_ratio = 0.1
weight_decay = 0.01
grad_clip = 0.5
beta1 = 0.8
beta2 = 0.999
eps = 1e-6
max_steps = 1000
chunk_rows = 1024
log_every = 5

[placement]
targets = ["cuda:0", "cuda:1"]
drafters = ["cuda:2", "cpu"]
prefetch = "per_target"

[runtime]
credits = 2
heartbeat_s = 5
step_timeout_s = 60.5
capture_graphs = false

[checkpoint]
dir = "snaps"
every_steps = 50
keep = 5
on_signal = false

[supervision]
restart_budget = 1
backoff_s = [0.5, 3]
window_s = 120

[[faults.inject]]
drafter = 1
kind = "nan"
at_step = 5

[[faults.inject]]
drafter = 0
kind = "hang"
at_step = 9

[metrics]
jsonl = "m/metrics.jsonl"
progress = false
every_s = 0.25

[run]
output_dir = "/out/x"
name = "experiment"
)";

} // namespace

TEST_F(run_config_test, defaults) {
  auto c = load_run_config(write("tiny.toml", minimal));
  EXPECT_EQ(c.model.target, fs::path("/models/q"));
  EXPECT_TRUE(c.model.tap_layers.empty());
  EXPECT_EQ(c.model.dtype, "auto");
  EXPECT_EQ(c.drafter.layers, 1);
  EXPECT_EQ(c.drafter.block_size, 16);
  EXPECT_EQ(c.drafter.mask_token_id, 7);
  EXPECT_EQ(c.drafter.seed, 0u);
  EXPECT_TRUE(c.drafter.init_from.empty());
  EXPECT_EQ(c.data.path, fs::path("/data/d"));
  EXPECT_EQ(c.data.seq_len, 3072);
  EXPECT_EQ(c.data.rows, 1);
  EXPECT_EQ(c.data.anchors, 512);
  EXPECT_EQ(c.data.max_docs, 16);
  EXPECT_EQ(c.data.lookahead, 16);
  EXPECT_EQ(c.data.seed, 0u);
  EXPECT_EQ(c.data.epochs, 1);
  EXPECT_EQ(c.train.lr, 6e-4);
  EXPECT_EQ(c.train.warmup_ratio, 0.04);
  EXPECT_EQ(c.train.weight_decay, 0.0);
  EXPECT_EQ(c.train.grad_clip, 1.0);
  EXPECT_EQ(c.train.beta1, 0.9);
  EXPECT_EQ(c.train.beta2, 0.95);
  EXPECT_EQ(c.train.eps, 1e-8);
  EXPECT_EQ(c.train.max_steps, 0);
  EXPECT_EQ(c.train.chunk_rows, 2048);
  EXPECT_EQ(c.train.log_every, 10);
  EXPECT_EQ(c.placement.targets, std::vector<std::string>{"auto"});
  EXPECT_EQ(c.placement.drafters, std::vector<std::string>{"auto"});
  EXPECT_EQ(c.placement.prefetch, "per_target");
  EXPECT_EQ(c.runtime.credits, 4);
  EXPECT_EQ(c.runtime.heartbeat_s, 10.0);
  EXPECT_EQ(c.runtime.step_timeout_s, 120.0);
  EXPECT_TRUE(c.runtime.capture_graphs);
  EXPECT_EQ(c.checkpoint.dir, fs::path("checkpoints"));
  EXPECT_EQ(c.checkpoint.every_steps, 100);
  EXPECT_EQ(c.checkpoint.keep, 3);
  EXPECT_TRUE(c.checkpoint.on_signal);
  EXPECT_EQ(c.supervision.restart_budget, 3);
  EXPECT_EQ(c.supervision.backoff_s, (std::vector<double>{1, 2, 4}));
  EXPECT_EQ(c.supervision.window_s, 600.0);
  EXPECT_TRUE(c.faults.empty());
  EXPECT_EQ(c.metrics.jsonl, fs::path("metrics.jsonl"));
  EXPECT_TRUE(c.metrics.progress);
  EXPECT_EQ(c.metrics.every_s, 1.0);
  // output_dir: runs/<stem> in the working directory; name: the stem.
  EXPECT_EQ(c.run.output_dir, (fs::current_path() / "runs" / "tiny").lexically_normal());
  EXPECT_EQ(c.run.name, "tiny");
  EXPECT_EQ(c.checkpoint_dir(), c.run.output_dir / "checkpoints");
  EXPECT_EQ(c.metrics_file(), c.run.output_dir / "metrics.jsonl");
  EXPECT_EQ(c.source, dir_ / "tiny.toml");
}

TEST_F(run_config_test, every_section_parsed) {
  auto c = load_run_config(write("all.toml", everything));
  EXPECT_EQ(c.model.target, fs::path("/models/Qwen3-8B"));
  EXPECT_EQ(c.model.tap_layers, (std::vector<int64_t>{1, 9, 17, 25, 33}));
  EXPECT_EQ(c.model.dtype, "bfloat16");
  EXPECT_EQ(c.drafter.layers, 5);
  EXPECT_EQ(c.drafter.block_size, 8);
  EXPECT_EQ(c.drafter.mask_token_id, 151669);
  EXPECT_EQ(c.drafter.seed, 11u);
  EXPECT_EQ(c.drafter.init_from, fs::path("/ckpt/step-100"));
  EXPECT_EQ(c.data.path, fs::path("/data/regen"));
  EXPECT_EQ(c.data.seq_len, 4096);
  EXPECT_EQ(c.data.rows, 2);
  EXPECT_EQ(c.data.anchors, 256);
  EXPECT_EQ(c.data.max_docs, 8);
  EXPECT_EQ(c.data.lookahead, 32);
  EXPECT_EQ(c.data.seed, 12u);
  EXPECT_EQ(c.data.epochs, 6);
  EXPECT_EQ(c.train.lr, 3e-4);
  EXPECT_EQ(c.train.warmup_ratio, 0.1);
  EXPECT_EQ(c.train.weight_decay, 0.01);
  EXPECT_EQ(c.train.grad_clip, 0.5);
  EXPECT_EQ(c.train.beta1, 0.8);
  EXPECT_EQ(c.train.beta2, 0.999);
  EXPECT_EQ(c.train.eps, 1e-6);
  EXPECT_EQ(c.train.max_steps, 1000);
  EXPECT_EQ(c.train.chunk_rows, 1024);
  EXPECT_EQ(c.train.log_every, 5);
  EXPECT_EQ(c.placement.targets, (std::vector<std::string>{"cuda:0", "cuda:1"}));
  EXPECT_EQ(c.placement.drafters, (std::vector<std::string>{"cuda:2", "cpu"}));
  EXPECT_EQ(c.runtime.credits, 2);
  EXPECT_EQ(c.runtime.heartbeat_s, 5.0);  // an integer where a number goes
  EXPECT_EQ(c.runtime.step_timeout_s, 60.5);
  EXPECT_FALSE(c.runtime.capture_graphs);
  EXPECT_EQ(c.checkpoint.dir, fs::path("snaps"));
  EXPECT_EQ(c.checkpoint.every_steps, 50);
  EXPECT_EQ(c.checkpoint.keep, 5);
  EXPECT_FALSE(c.checkpoint.on_signal);
  EXPECT_EQ(c.supervision.restart_budget, 1);
  EXPECT_EQ(c.supervision.backoff_s, (std::vector<double>{0.5, 3}));
  EXPECT_EQ(c.supervision.window_s, 120.0);
  ASSERT_EQ(c.faults.size(), 2u);
  EXPECT_EQ(c.faults[0].drafter, 1);
  EXPECT_EQ(c.faults[0].kind, "nan");
  EXPECT_EQ(c.faults[0].at_step, 5);
  EXPECT_EQ(c.faults[1].to_string(), "drafter=0,kind=hang,at_step=9");
  EXPECT_EQ(c.metrics.jsonl, fs::path("m/metrics.jsonl"));
  EXPECT_FALSE(c.metrics.progress);
  EXPECT_EQ(c.metrics.every_s, 0.25);
  EXPECT_EQ(c.run.output_dir, fs::path("/out/x"));
  EXPECT_EQ(c.run.name, "experiment");
  EXPECT_EQ(c.checkpoint_dir(), fs::path("/out/x/snaps"));
  EXPECT_EQ(c.metrics_file(), fs::path("/out/x/m/metrics.jsonl"));
}

TEST_F(run_config_test, relative_paths_are_taken_from_the_file_folder) {
  auto p = write("configs/sub/r.toml", R"([model]
target = "../models/q"
[drafter]
mask_token_id = 0
init_from = "ckpt/step-5"
[data]
path = "./data"
[checkpoint]
dir = "snaps"
[metrics]
jsonl = ""
[run]
output_dir = "out"
)");
  auto c = load_run_config(p);
  auto folder = dir_ / "configs" / "sub";
  EXPECT_EQ(c.model.target, (dir_ / "configs" / "models" / "q").lexically_normal());
  EXPECT_EQ(c.drafter.init_from, folder / "ckpt" / "step-5");
  EXPECT_EQ(c.data.path, folder / "data");
  EXPECT_EQ(c.run.output_dir, folder / "out");
  EXPECT_EQ(c.checkpoint.dir, fs::path("snaps")) << "relative to run.output_dir, not resolved";
  EXPECT_EQ(c.checkpoint_dir(), folder / "out" / "snaps");
  EXPECT_TRUE(c.metrics_file().empty()) << "jsonl = \"\" switches the log off";
  EXPECT_EQ(c.run.name, "r");

  // The same file named by a relative path resolves the same way.
  auto cwd = fs::current_path();
  fs::current_path(dir_);
  auto again = load_run_config("configs/sub/r.toml");
  // --set paths are relative to the working directory, not the file.
  auto cli = load_run_config("configs/sub/r.toml", {"data.path=here/d", "run.output_dir=o"});
  fs::current_path(cwd);
  EXPECT_EQ(again.data.path, c.data.path);
  EXPECT_EQ(again.model.target, c.model.target);
  EXPECT_EQ(cli.data.path, dir_ / "here" / "d");
  EXPECT_EQ(cli.run.output_dir, dir_ / "o");
}

TEST_F(run_config_test, overrides_are_typed_like_the_field) {
  auto p = write("o.toml", minimal + "[train]\nlr = 1e-3\n");
  auto c = load_run_config(p, {
    "train.lr=3e-4",
    "train.max_steps=200",
    "data.seq_len = 1024",
    "runtime.capture_graphs=false",
    "runtime.heartbeat_s=2",          // an integer for a number
    "model.tap_layers=1,9,17",        // a bare list
    "model.dtype=float32",            // a bare word for a string
    "model.target=\"/quoted/path\"",  // TOML string syntax works too
    "placement.targets=cuda:0,cuda:1",
    "placement.drafters=[\"cpu\"]",
    "supervision.backoff_s=3",        // one value for an array
    "run.name=123",                   // a string field keeps the text
    "checkpoint.keep=2",
    "checkpoint.keep=4",              // later wins
  });
  EXPECT_EQ(c.train.lr, 3e-4);
  EXPECT_EQ(c.train.max_steps, 200);
  EXPECT_EQ(c.data.seq_len, 1024);
  EXPECT_FALSE(c.runtime.capture_graphs);
  EXPECT_EQ(c.runtime.heartbeat_s, 2.0);
  EXPECT_EQ(c.model.tap_layers, (std::vector<int64_t>{1, 9, 17}));
  EXPECT_EQ(c.model.dtype, "float32");
  EXPECT_EQ(c.model.target, fs::path("/quoted/path"));
  EXPECT_EQ(c.placement.targets, (std::vector<std::string>{"cuda:0", "cuda:1"}));
  EXPECT_EQ(c.placement.drafters, std::vector<std::string>{"cpu"});
  EXPECT_EQ(c.supervision.backoff_s, std::vector<double>{3.0});
  EXPECT_EQ(c.run.name, "123");
  EXPECT_EQ(c.checkpoint.keep, 4);
}

TEST_F(run_config_test, control_listen_is_checked_and_off_loopback_needs_tls) {
  auto p = write("c.toml", minimal);
  EXPECT_EQ(load_run_config(p, {}).control.listen, "127.0.0.1:0");
  EXPECT_EQ(load_run_config(p, {"control.listen=[::1]:7000"}).control.listen, "[::1]:7000");
  EXPECT_EQ(load_run_config(p, {"control.listen="}).control.listen, "");
  for (const char* bad : {"control.listen=127.0.0.1", "control.listen=127.0.0.1:70000", "control.listen=host:80",
                          "control.listen=1.2.3:80", "control.listen=:80", "control.listen=127.0.0.1:x"}) {
    const auto e = error_of([&] { load_run_config(p, {bad}); });
    EXPECT_NE(e.find("'control.listen' must be \"HOST:PORT\""), std::string::npos) << bad << ": " << e;
  }
  const auto off = error_of([&] { load_run_config(p, {"control.listen=0.0.0.0:7000"}); });
  EXPECT_NE(off.find("'control.listen' (0.0.0.0:7000) is not a loopback address"), std::string::npos) << off;
  EXPECT_NE(off.find("control.tls_cert"), std::string::npos) << off;
  const auto half = error_of([&] { load_run_config(p, {"control.tls_cert=/pki/a.pem"}); });
  EXPECT_NE(half.find("'control.tls_cert' needs its partner"), std::string::npos) << half;
  const auto c = load_run_config(p, {"control.listen=0.0.0.0:7000", "control.tls_cert=/pki/a.pem",
                                     "control.tls_key=/pki/a.key"});
  EXPECT_EQ(c.control.tls_key, "/pki/a.key");
}

TEST_F(run_config_test, the_run_flags_for_one_field_are_named_in_its_errors) {
  auto p = write("f.toml", minimal);
  const auto c = load_run_config(p, {"--listen=127.0.0.1:7070", "--name=gpu-a"});
  EXPECT_EQ(c.cluster.listen, "127.0.0.1:7070");
  EXPECT_EQ(c.cluster.name, "gpu-a");
  const auto listen = error_of([&] { load_run_config(p, {"--listen=garbage"}); });
  EXPECT_EQ(listen.rfind("--listen 'garbage': 'cluster.listen' must be \"HOST:PORT\"", 0), 0u) << listen;
  const auto name = error_of([&] { load_run_config(p, {"--name=Bad"}); });
  EXPECT_EQ(name.rfind("--name 'Bad': 'cluster.name' must be a node name", 0), 0u) << name;
  EXPECT_EQ(error_of([&] { load_run_config(p, {"cluster.name=Bad"}); }).rfind("--set cluster.name=Bad: ", 0), 0u);
}

TEST_F(run_config_test, override_errors) {
  auto p = write("o.toml", minimal);
  EXPECT_EQ(error_of([&] { load_run_config(p, {"train.learning_rate=1e-3"}); }),
            "--set train.learning_rate=1e-3: unknown key 'train.learning_rate' "
            "(did you mean 'train.lr'?)");
  EXPECT_EQ(error_of([&] { load_run_config(p, {"trian.lr=1"}); }),
            "--set trian.lr=1: unknown key 'trian.lr' (did you mean 'train.lr'?)");
  EXPECT_EQ(error_of([&] { load_run_config(p, {"nothing.like.this=1"}); }),
            "--set nothing.like.this=1: unknown key 'nothing.like.this'");
  EXPECT_EQ(error_of([&] { load_run_config(p, {"data.seq_len=abc"}); }),
            "--set data.seq_len=abc: 'data.seq_len' must be a positive integer, got \"abc\"");
  EXPECT_EQ(error_of([&] { load_run_config(p, {"data.seq_len=-5"}); }),
            "--set data.seq_len=-5: 'data.seq_len' must be a positive integer, got -5");
  EXPECT_EQ(error_of([&] { load_run_config(p, {"data.seq_len=3072.0"}); }),
            "--set data.seq_len=3072.0: 'data.seq_len' must be a positive integer, got 3072.0");
  // The runtime's timers are durations on a clock: more than a day is refused (1e12 overflowed).
  for (const char* k : {"runtime.step_timeout_s", "runtime.heartbeat_s", "runtime.group_timeout_s"}) {
    EXPECT_EQ(error_of([&] { load_run_config(p, {std::string(k) + "=1e12"}); }),
              "--set " + std::string(k) + "=1e12: '" + k + "' must be a number of seconds, more than 0 and at "
              "most 86400 (a day), got 1000000000000.0");
    EXPECT_NE(error_of([&] { load_run_config(p, {std::string(k) + "=0"}); }).find("more than 0 and at most 86400"),
              std::string::npos);
  }
  EXPECT_EQ(load_run_config(p, {"runtime.step_timeout_s=86400"}).runtime.step_timeout_s, 86400.0);
  EXPECT_EQ(error_of([&] { load_run_config(p, {"runtime.capture_graphs=yes"}); }),
            "--set runtime.capture_graphs=yes: 'runtime.capture_graphs' must be true or false, "
            "got \"yes\"");
  EXPECT_EQ(error_of([&] { load_run_config(p, {"placement.targets=gpu:1"}); }),
            "--set placement.targets=gpu:1: 'placement.targets[0]' must be \"cpu\", \"cuda:N\", "
            "\"NODE:cpu\", \"NODE:cuda:N\" or \"auto\" (NODE: a cluster member's name, lowercase letters, "
            "digits and '-'), got \"gpu:1\"");
  EXPECT_EQ(error_of([&] { load_run_config(p, {"train.lr"}); }),
            "--set train.lr: expected SECTION.KEY=VALUE (e.g. --set train.lr=3e-4)");
  EXPECT_EQ(error_of([&] { load_run_config(p, {"faults.inject=1"}); }),
            "--set faults.inject=1: faults cannot be set with --set; use --fault "
            "drafter=N,kind=throw|nan|hang|slow_snapshot|throw_in_snapshot|cuda_error|cuda_sticky|abort,at_step=S, "
            "or target=N / prefetch=N with kind throw|abort (at_step: its at_step-th batch)");
}

TEST_F(run_config_test, unknown_keys_name_file_line_column_and_suggest) {
  auto p = write("tiny.toml", minimal + "[train]\nlr = 1e-3\n\nlearning_rate = 3e-4\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":10:1: unknown key 'train.learning_rate' (did you mean 'train.lr'?)");

  // Within two edits, in the same section.
  p = write("a.toml", minimal + "seq_lne = 100\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":7:1: unknown key 'data.seq_lne' (did you mean 'data.seq_len'?)");
  // The right key in the wrong section.
  p = write("b.toml", minimal + "[train]\nseq_len = 100\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":8:1: unknown key 'train.seq_len' (did you mean 'data.seq_len'?)");
  // Initials: bs → block_size.
  p = write("c.toml", "[drafter]\nbs = 8\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":2:1: unknown key 'drafter.bs' (did you mean 'drafter.block_size'?)");
  p = write("c.toml", "[train]\nwd = 0.1\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":2:1: unknown key 'train.wd' (did you mean 'train.weight_decay'?)");
  // Two edits: enough for a long key, not for a two-letter one.
  p = write("c.toml", "[runtime]\ncredit_s = 2\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":2:1: unknown key 'runtime.credit_s' (did you mean 'runtime.credits'?)");
  p = write("c.toml", "[train]\nxy = 1\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }), p.string() + ":2:1: unknown key 'train.xy'");
  // Nothing close: no suggestion.
  p = write("d.toml", minimal + "[train]\nfrobnicate = 1\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":8:1: unknown key 'train.frobnicate'");
  // Unknown sections, and keys outside any section.
  p = write("e.toml", minimal + "[trian]\nlr = 1\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":7:2: unknown section 'trian' (did you mean 'train'?)");
  p = write("f.toml", "lr = 1\n" + minimal);
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":1:1: unknown key 'lr' (did you mean 'train.lr'?)");
  // Inside [[faults.inject]].
  p = write("g.toml", minimal + "[[faults.inject]]\ndrafter = 0\nkidn = \"nan\"\nat_step = 1\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() +
              ":9:1: unknown key 'faults.inject.kidn' (did you mean 'faults.inject.kind'?)");
  // Every unknown key at once, in file order.
  p = write("h.toml", "[train]\nlearning_rate = 1\n[data]\nseqlen = 2\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":2:1: unknown key 'train.learning_rate' (did you mean 'train.lr'?)\n" +
              p.string() + ":4:1: unknown key 'data.seqlen' (did you mean 'data.seq_len'?)");
}

TEST_F(run_config_test, type_and_range_errors_name_file_line_column_and_field) {
  auto p = write("t.toml", minimal + "seq_len = -5\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":7:11: 'data.seq_len' must be a positive integer, got -5");
  p = write("t.toml", minimal + "seq_len = \"long\"\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":7:11: 'data.seq_len' must be a positive integer, got \"long\"");
  p = write("t.toml", minimal + "[train]\nbeta2 = 1.0\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":8:9: 'train.beta2' must be a number in [0, 1), got 1.0");
  p = write("t.toml", minimal + "[train]\nlr = nan\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":8:6: 'train.lr' must be a positive number, got nan");
  p = write("t.toml", minimal + "[train]\nlr = [1]\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":8:6: 'train.lr' must be a positive number, got [1]");
  p = write("t.toml", "[model]\ntarget = \"m\"\ndtype = \"fp16\"\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() +
              ":3:9: 'model.dtype' must be one of \"auto\", \"float32\", \"bfloat16\", got \"fp16\"");
  p = write("t.toml", "[model]\ntarget = \"m\"\ntap_layers = [1, -2]\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":3:18: 'model.tap_layers[1]' must be a non-negative integer, got -2");
  p = write("t.toml", "[model]\ntarget = \"m\"\ntap_layers = [9, 1]\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":3:14: 'model.tap_layers' must be strictly increasing, got [9, 1]");
  p = write("t.toml", minimal + "[placement]\ntargets = [\"cuda:0\", \"auto\"]\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":8:22: 'placement.targets[1]' must be alone when it is \"auto\" "
                         "(auto means every GPU), got \"auto\"");
  p = write("t.toml", minimal + "[placement]\ndrafters = []\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":8:12: 'placement.drafters' must be an array of device strings "
                         "(\"cpu\", \"cuda:N\", \"NODE:cpu\", \"NODE:cuda:N\", or \"auto\" alone), got []");
  p = write("t.toml", minimal + "[drafter]\n");  // a section defined twice is a TOML error
  EXPECT_NE(error_of([&] { load_run_config(p); }).find("TOML syntax error"), std::string::npos);
  p = write("t.toml", "train = 5\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":1:9: 'train' must be a table ([train]), got 5");
  // Across fields: the row must hold a block.
  p = write("t.toml", minimal + "seq_len = 8\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":7:11: 'data.seq_len' (8, " + p.string()
              + ":7:11) must be at least 'drafter.block_size' (16, its default)");
  // A --set that breaks it is named as such.
  p = write("t.toml", minimal + "seq_len = 64\n");
  EXPECT_EQ(error_of([&] { load_run_config(p, {"drafter.block_size=100"}); }),
            p.string() + ":7:11: 'data.seq_len' (64, " + p.string()
              + ":7:11) must be at least 'drafter.block_size' (100, --set drafter.block_size=100)");
  // ... and the anchors distinct start positions of a row.
  p = write("t.toml", minimal + "seq_len = 64\nanchors = 50\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":8:11: 'data.anchors' (50) must be at most data.seq_len - drafter.block_size + 1 = 49: "
                         "a draft block starts at a distinct position of a row");
  p = write("t.toml", minimal + "seq_len = 64\nanchors = 49\n");
  EXPECT_EQ(load_run_config(p).data.anchors, 49);
  // ... and a row's documents its tokens (the prefetch allocates rows x max_docs).
  p = write("t.toml", minimal + "seq_len = 64\nmax_docs = 10000000000\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":8:12: 'data.max_docs' (10000000000) must be at most data.seq_len = 64: "
                         "a document is one token at least");
  p = write("t.toml", minimal + "seq_len = 8\n");
  EXPECT_EQ(load_run_config(p, {"drafter.block_size=4"}).data.max_docs, 8);  // the default follows the row
  // Counts kept in narrower integers are bounded, not wrapped: 2^32 + 1
  // credits were 1 credit, 10^12 a negative count (the run hung).
  p = write("t.toml", minimal + "[runtime]\ncredits = 4294967297\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":8:11: 'runtime.credits' must be an integer in [1, 2147483647], got 4294967297");
  p = write("t.toml", minimal + "[checkpoint]\nkeep = 4294967296\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":8:8: 'checkpoint.keep' must be an integer in [1, 2147483646], got 4294967296");
  p = write("t.toml", minimal + "[runtime]\ncredits = 2147483647\n[checkpoint]\nkeep = 2147483646\n");
  EXPECT_EQ(load_run_config(p).runtime.credits, 2147483647);
  EXPECT_EQ(load_run_config(p).checkpoint.keep, 2147483646);
}

TEST_F(run_config_test, missing_file_required_keys_and_syntax_errors) {
  auto missing = dir_ / "nope.toml";
  EXPECT_EQ(error_of([&] { load_run_config(missing); }), missing.string() + ": no such file");
  // A folder opens as a stream and reads as an empty file: it was "missing
  // required key 'model.target'".
  EXPECT_EQ(error_of([&] { load_run_config(dir_); }), dir_.string() + ": a folder, not a file");

  auto p = write("m.toml", "[model]\ntarget = \"m\"\n[data]\npath = \"d\"\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ": missing required key 'drafter.mask_token_id' "
                         "(token id of the block's masked positions)");
  p = write("m.toml", "[model]\ndtype = \"auto\"\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":1:1: missing required key 'model.target' (the frozen target: a Hugging "
                         "Face Qwen3 folder (config.json + *.safetensors))");

  p = write("s.toml", "[model]\ntarget = \"m\n");
  auto msg = error_of([&] { load_run_config(p); });
  EXPECT_EQ(msg.rfind(p.string() + ":2:", 0), 0u) << msg;
  EXPECT_NE(msg.find("TOML syntax error: "), std::string::npos) << msg;
  p = write("s.toml", "[model]\ntarget = \n");
  msg = error_of([&] { load_run_config(p); });
  EXPECT_EQ(msg.rfind(p.string() + ":2:", 0), 0u) << msg;
}

TEST_F(run_config_test, data_sources_default_the_path_and_the_tokenizer) {
  auto p = write("sub/s.toml", "[model]\ntarget = \"m\"\n[drafter]\nmask_token_id = 7\n"
                               "[data]\nsources = [\"a.jsonl\", \"/abs/b.jsonl\"]\n"
                               "[run]\noutput_dir = \"out\"\n");
  auto c = load_run_config(p);
  EXPECT_EQ(c.data.sources, (std::vector<fs::path>{dir_ / "sub" / "a.jsonl", "/abs/b.jsonl"}));
  EXPECT_EQ(c.data.path, dir_ / "sub" / "out" / "data");
  EXPECT_EQ(c.data.tokenizer, dir_ / "sub" / "m");
  auto cli = load_run_config(p, {"data.sources=x.jsonl,y.jsonl", "data.tokenizer=tok"});
  EXPECT_EQ(cli.data.sources,
            (std::vector<fs::path>{fs::absolute("x.jsonl"), fs::absolute("y.jsonl")}));
  EXPECT_EQ(cli.data.tokenizer, fs::absolute("tok"));
  auto back = load_run_config(write("again.toml", to_toml(c)));
  EXPECT_EQ(back.data.sources, c.data.sources);
  EXPECT_EQ(back.data.path, c.data.path);
  EXPECT_EQ(back.data.tokenizer, c.data.tokenizer);

  p = write("n.toml", "[model]\ntarget = \"m\"\n[drafter]\nmask_token_id = 7\n[data]\nseq_len = 64\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":5:1: missing required key 'data.path' (a `tandem prepare` output "
                         "folder; or give data.sources to prepare one)");
  p = write("e.toml", "[model]\ntarget = \"m\"\n[drafter]\nmask_token_id = 7\n[data]\nsources = [3]\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":6:12: 'data.sources[0]' must be a non-empty string, got 3");
}

TEST_F(run_config_test, check_paths_names_the_field_and_the_path) {
  auto model = dir_ / "model";
  auto cfg_text = "[model]\ntarget = \"model\"\n[drafter]\nmask_token_id = 7\n"
                  "[data]\npath = \"data\"\n";
  auto p = write("c.toml", cfg_text);
  auto c = load_run_config(p);
  auto prefix = p.string() + ": ";
  EXPECT_EQ(error_of([&] { check_paths(c, true); }),
            prefix + "'model.target' = \"" + model.string() + "\": no such folder");
  write("model/config.json", "{\"vocab_size\": 16, \"num_hidden_layers\": 4}");
  EXPECT_EQ(error_of([&] { check_paths(c, true); }),
            prefix + "'model.target' = \"" + model.string() + "\": no *.safetensors weights there");
  write("model/model.safetensors", "x");
  EXPECT_EQ(error_of([&] { check_paths(c, true); }),
            prefix + "'data.path' = \"" + (dir_ / "data").string() +
              "\": no such folder");
  write("data/shard-00000.safetensors", "x");
  EXPECT_EQ(error_of([&] { check_paths(c, true); }),
            prefix + "'data.path' = \"" + (dir_ / "data").string() +
              "\": no manifest.json (prepare the data with `tandem prepare`, or give data.sources) there");
  EXPECT_NO_THROW(check_paths(c, false));
  write("data/manifest.json", "{}");
  EXPECT_NO_THROW(check_paths(c, true));

  auto s = load_run_config(p, {"data.sources=in.jsonl"});
  EXPECT_EQ(error_of([&] { check_paths(s, false); }),
            prefix + "'data.sources[0]' = \"" + fs::absolute("in.jsonl").string() + "\": no such file");
  s = load_run_config(p, {"data.sources=" + write("in.jsonl", "{}").string()});
  EXPECT_EQ(error_of([&] { check_paths(s, false); }),
            prefix + "'data.tokenizer' = \"" + model.string() +
              "\": no tokenizer.json (a Hugging Face tokenizer folder) there");
  write("model/tokenizer.json", "{}");
  EXPECT_NO_THROW(check_paths(s, false));

  // The same file twice, by another spelling or through a link: named before
  // anything runs (it was `tandem prepare`'s usage text and "given twice").
  const auto in = dir_ / "in.jsonl";
  fs::create_symlink(in, dir_ / "link.jsonl");
  write("copy.jsonl", "{}");  // another file with the same bytes is not the same file
  for (const auto& second : {in.string(), (dir_ / "." / "in.jsonl").string(), (dir_ / "link.jsonl").string()}) {
    s = load_run_config(p, {"data.sources=" + (dir_ / "copy.jsonl").string() + "," + in.string() + "," + second});
    EXPECT_EQ(error_of([&] { check_paths(s, false); }),
              prefix + "'data.sources[2]' = \"" + fs::path(second).lexically_normal().string() +
                "\": the same file as 'data.sources[1]' = \"" + in.string() +
                "\" (its samples would be trained on twice)");
  }
  s = load_run_config(p, {"data.sources=" + (dir_ / "copy.jsonl").string() + "," + in.string()});
  EXPECT_NO_THROW(check_paths(s, false));

  // data.tokenizer given with neither data.sources nor eval.prompts: still checked.
  EXPECT_EQ(error_of([&] { check_paths(load_run_config(p, {"data.tokenizer=" + (dir_ / "tok").string()}), true); }),
            prefix + "'data.tokenizer' = \"" + (dir_ / "tok").string() + "\": no such folder");

  // drafter.init_from: a folder the warm start can read, checked before the start
  // (a file or an empty folder passed, and the run failed once it had started).
  auto from = [&](const fs::path& f) { return load_run_config(p, {"drafter.init_from=" + f.string()}); };
  EXPECT_EQ(error_of([&] { check_paths(from(dir_ / "nowhere"), true); }),
            prefix + "'drafter.init_from' = \"" + (dir_ / "nowhere").string() + "\": no such folder");
  EXPECT_EQ(error_of([&] { check_paths(from(in), true); }),
            prefix + "'drafter.init_from' = \"" + in.string()
              + "\": not a folder (a Tandem checkpoint folder, or a z-lab DFlash export folder)");
  fs::create_directories(dir_ / "warm");
  EXPECT_EQ(error_of([&] { check_paths(from(dir_ / "warm"), true); }),
            prefix + "'drafter.init_from' = \"" + (dir_ / "warm").string()
              + "\": neither a Tandem checkpoint (weights.safetensors) nor a z-lab DFlash export "
                "(config.json + model.safetensors)");
  write("warm/config.json", "{}");
  EXPECT_NE(error_of([&] { check_paths(from(dir_ / "warm"), true); }), "");  // the export's weights missing
  write("warm/model.safetensors", "x");
  EXPECT_NO_THROW(check_paths(from(dir_ / "warm"), true));
  fs::create_directories(dir_ / "ckpt");
  write("ckpt/weights.safetensors", "x");
  EXPECT_NO_THROW(check_paths(from(dir_ / "ckpt"), true));

  // A leader's cluster.secret and cluster.certs (read once the run folder was
  // written, exit 1 without the config's name): checked with the other paths.
  auto leader = [&](const std::string& key, const fs::path& f) {
    return load_run_config(p, {"cluster.listen=127.0.0.1:7777", key + "=" + f.string()});
  };
  EXPECT_EQ(error_of([&] { check_paths(leader("cluster.secret", dir_ / "no.secret"), true); }),
            prefix + "'cluster.secret' = \"" + (dir_ / "no.secret").string()
              + "\": no such file (tandem certs DIR writes DIR/cluster.secret)");
  EXPECT_EQ(error_of([&] { check_paths(leader("cluster.secret", dir_ / "warm"), true); }),
            prefix + "'cluster.secret' = \"" + (dir_ / "warm").string() + "\": not a file");
  write("cluster.secret", "s");
  EXPECT_NO_THROW(check_paths(leader("cluster.secret", dir_ / "cluster.secret"), true));
  auto certs = load_run_config(p, {"cluster.listen=127.0.0.1:7777", "cluster.secret=" + (dir_ / "cluster.secret").string(),
                                   "cluster.certs=" + (dir_ / "leader").string()});
  EXPECT_EQ(error_of([&] { check_paths(certs, true); }),
            prefix + "'cluster.certs' = \"" + (dir_ / "leader").string() + "\": no such folder");
  write("leader/cert.pem", "c");
  write("leader/key.pem", "k");
  EXPECT_EQ(error_of([&] { check_paths(certs, true); }),
            prefix + "'cluster.certs' = \"" + (dir_ / "leader").string()
              + "\": no ca.pem there (give the leader's folder of `tandem certs DIR --nodes ...`)");
  write("leader/ca.pem", "a");
  EXPECT_NO_THROW(check_paths(certs, true));
}

TEST_F(run_config_test, check_paths_checks_mask_token_and_taps_against_the_target) {
  // Issue 19: drafter.mask_token_id outside the target's embedding and tap
  // layers beyond its depth are config errors naming the config file, the
  // field and the target's config.json, before any actor starts (today's
  // engines find them only when a drafter loads: a failed worker, retried).
  auto model = dir_ / "model";
  write("model/config.json", "{\"vocab_size\": 2048, \"num_hidden_layers\": 8}");
  write("model/model.safetensors", "x");
  write("data/manifest.json", "{}");
  auto p = write("t.toml", "[model]\ntarget = \"model\"\n[drafter]\nmask_token_id = 2047\n"
                           "[data]\npath = \"data\"\n");
  const auto json_file = (model / "config.json").string();
  EXPECT_NO_THROW(check_paths(load_run_config(p), true));
  EXPECT_NO_THROW(check_paths(load_run_config(p, {"model.tap_layers=0,7"}), true));
  EXPECT_EQ(error_of([&] { check_paths(load_run_config(p, {"drafter.mask_token_id=2048"}), true); }),
            p.string() + ": 'drafter.mask_token_id' = 2048 is not a row of the target's embedding: "
              + json_file + " has vocab_size = 2048 (ids 0 .. 2047; Qwen3 uses 151669)");
  EXPECT_EQ(error_of([&] { check_paths(load_run_config(p, {"model.tap_layers=1,5,8"}), true); }),
            p.string() + ": 'model.tap_layers[2]' = 8 is not a layer of the target: " + json_file
              + " has num_hidden_layers = 8 (layers 0 .. 7)");
  // A negative id never gets this far: the reader refuses it, naming the key.
  EXPECT_NE(error_of([&] { load_run_config(p, {"drafter.mask_token_id=-1"}); })
              .find("'drafter.mask_token_id'"),
            std::string::npos);
  // The target's config.json must state both numbers.
  write("model/config.json", "{\"vocab_size\": 2048}");
  EXPECT_EQ(error_of([&] { check_paths(load_run_config(p), true); }),
            p.string() + ": 'model.target': " + json_file
              + ": field 'num_hidden_layers' must be a positive integer, and it is missing");
  write("model/config.json", "{\"vocab_size\": \"big\", \"num_hidden_layers\": 8}");
  EXPECT_EQ(error_of([&] { check_paths(load_run_config(p), true); }),
            p.string() + ": 'model.target': " + json_file
              + ": field 'vocab_size' must be a positive integer, got \"big\"");
  write("model/config.json", "{\"vocab_size\": ");
  EXPECT_NE(error_of([&] { check_paths(load_run_config(p), true); }).find("is not valid JSON"),
            std::string::npos);
}

TEST_F(run_config_test, faults_from_toml_and_command_line) {
  auto c = load_run_config(
    write("f.toml", minimal + "[[faults.inject]]\ndrafter = 2\nkind = \"throw\"\nat_step = 7\n"));
  ASSERT_EQ(c.faults.size(), 1u);
  EXPECT_EQ(c.faults[0].drafter, 2);
  EXPECT_EQ(c.faults[0].kind, "throw");
  EXPECT_EQ(c.faults[0].at_step, 7);

  auto f = parse_fault("drafter=0,kind=nan,at_step=5");
  EXPECT_EQ(f.drafter, 0);
  EXPECT_EQ(f.kind, "nan");
  EXPECT_EQ(f.at_step, 5);
  f = parse_fault(" at_step = 3 , kind=hang, drafter=1");
  EXPECT_EQ(f.to_string(), "drafter=1,kind=hang,at_step=3");

  EXPECT_EQ(error_of([] { parse_fault("drafter=0,kind=oops,at_step=5"); }),
            "--fault drafter=0,kind=oops,at_step=5: 'kind' must be one of \"throw\", \"nan\", "
            "\"hang\", \"slow_snapshot\", \"throw_in_snapshot\", \"cuda_error\", \"cuda_sticky\", \"abort\", got \"oops\"");
  EXPECT_EQ(error_of([] { parse_fault("drafter=x,kind=nan,at_step=5"); }),
            "--fault drafter=x,kind=nan,at_step=5: 'drafter' must be a non-negative integer, "
            "got \"x\"");
  EXPECT_EQ(error_of([] { parse_fault("drafter=0,kind=throw,at_step=0"); }),
            "--fault drafter=0,kind=throw,at_step=0: 'at_step' must be at least 1 (a drafter's steps count "
            "from 1; at 0 the fault would never fire)");
  EXPECT_EQ(error_of([] { parse_fault("drafter=0,kind=nan"); }),
            "--fault drafter=0,kind=nan: missing 'at_step' "
            "(a fault is drafter=N,kind=throw|nan|hang|slow_snapshot|throw_in_snapshot|cuda_error|cuda_sticky|abort,at_step=S, or target=N / prefetch=N with kind throw|abort (at_step: its at_step-th batch))");
  EXPECT_EQ(error_of([] { parse_fault("drafter=0,kidn=nan,at_step=1"); }),
            "--fault drafter=0,kidn=nan,at_step=1: unknown key 'kidn' (did you mean 'kind'?) "
            "(a fault is drafter=N,kind=throw|nan|hang|slow_snapshot|throw_in_snapshot|cuda_error|cuda_sticky|abort,at_step=S, or target=N / prefetch=N with kind throw|abort (at_step: its at_step-th batch))");
  EXPECT_EQ(error_of([] { parse_fault("drafter=0,drafter=1,kind=nan,at_step=1"); }),
            "--fault drafter=0,drafter=1,kind=nan,at_step=1: 'drafter' given twice");

  // A target's or prefetch's fault: one role, kinds throw and abort.
  f = parse_fault("target=1,kind=throw,at_step=4");
  EXPECT_EQ(f.role, "target");
  EXPECT_EQ(f.drafter, 1);
  EXPECT_EQ(f.to_string(), "target=1,kind=throw,at_step=4");
  EXPECT_EQ(parse_fault("prefetch=0,kind=abort,at_step=2").role, "prefetch");
  EXPECT_EQ(error_of([] { parse_fault("target=0,kind=nan,at_step=1"); }),
            "--fault target=0,kind=nan,at_step=1: kind 'nan' applies to drafters only; a target fault is throw or abort");
  EXPECT_EQ(error_of([] { parse_fault("target=0,drafter=0,kind=throw,at_step=1"); }),
            "--fault target=0,drafter=0,kind=throw,at_step=1: name one actor: drafter=N, target=N or prefetch=N (got 2)");
  EXPECT_EQ(error_of([] { parse_fault("kind=throw,at_step=1"); }),
            "--fault kind=throw,at_step=1: name one actor: drafter=N, target=N or prefetch=N (got 0)");
  c = load_run_config(write("t.toml", minimal + "[[faults.inject]]\nprefetch = 0\nkind = \"throw\"\nat_step = 3\n"));
  ASSERT_EQ(c.faults.size(), 1u);
  EXPECT_EQ(c.faults[0].role, "prefetch");
  EXPECT_EQ(c.faults[0].at_step, 3);

  auto p = write("bad.toml", minimal + "[[faults.inject]]\ndrafter = 0\nkind = \"boom\"\nat_step = 1\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":9:8: 'faults.inject[0].kind' must be one of \"throw\", \"nan\", "
                         "\"hang\", \"slow_snapshot\", \"throw_in_snapshot\", \"cuda_error\", \"cuda_sticky\", \"abort\", got \"boom\"");
  p = write("bad.toml", minimal + "[[faults.inject]]\ndrafter = 0\nkind = \"nan\"\n");
  EXPECT_EQ(error_of([&] { load_run_config(p); }),
            p.string() + ":7:1: faults.inject[0] is missing 'at_step' "
                         "(a fault is drafter=N,kind=throw|nan|hang|slow_snapshot|throw_in_snapshot|cuda_error|cuda_sticky|abort,at_step=S, or target=N / prefetch=N with kind throw|abort (at_step: its at_step-th batch))");
}

TEST_F(run_config_test, placement_8_gpus_5_targets_3_drafters) {
  auto c = load_run_config(write("p.toml", minimal + R"([placement]
targets = ["cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:4"]
drafters = ["cuda:5", "cuda:6", "cuda:7"]
)"));
  auto plan = resolve_placement(c, 8);
  ASSERT_EQ(plan.targets.size(), 5u);
  ASSERT_EQ(plan.prefetch.size(), 5u);
  ASSERT_EQ(plan.drafters.size(), 3u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(plan.targets[i].role, "target");
    EXPECT_EQ(plan.targets[i].index, i);
    EXPECT_EQ(plan.targets[i].device, i);
    EXPECT_EQ(plan.prefetch[i].role, "prefetch");
    EXPECT_EQ(plan.prefetch[i].index, i);
    EXPECT_EQ(plan.prefetch[i].device, i) << "a prefetch sits on its target's GPU";
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(plan.drafters[i].role, "drafter");
    EXPECT_EQ(plan.drafters[i].index, i);
    EXPECT_EQ(plan.drafters[i].device, 5 + i);
  }
  EXPECT_EQ(plan.describe(),
            "cuda:0: target 0, prefetch 0\n"
            "cuda:1: target 1, prefetch 1\n"
            "cuda:2: target 2, prefetch 2\n"
            "cuda:3: target 3, prefetch 3\n"
            "cuda:4: target 4, prefetch 4\n"
            "cuda:5: drafter 0\n"
            "cuda:6: drafter 1\n"
            "cuda:7: drafter 2\n");
  // The same file on a 4-GPU host.
  EXPECT_EQ(error_of([&] { resolve_placement(c, 4); }),
            c.source.string() +
              ":8:11: 'placement.targets' names cuda:4, but this host has 4 GPUs (cuda:0 to cuda:3)");
  // auto on 8 GPUs: a target and a drafter on every GPU.
  auto a = resolve_placement(load_run_config(write("a.toml", minimal)), 8);
  ASSERT_EQ(a.targets.size(), 8u);
  ASSERT_EQ(a.drafters.size(), 8u);
  EXPECT_EQ(a.targets[7].device, 7);
  EXPECT_EQ(a.drafters[7].device, 7);
}

TEST_F(run_config_test, placement_1_gpu_everything_shared) {
  auto plan = resolve_placement(load_run_config(write("a.toml", minimal)), 1);
  ASSERT_EQ(plan.targets.size(), 1u);
  ASSERT_EQ(plan.drafters.size(), 1u);
  EXPECT_EQ(plan.targets[0].device, 0);
  EXPECT_EQ(plan.prefetch[0].device, 0);
  EXPECT_EQ(plan.drafters[0].device, 0);
  EXPECT_EQ(plan.describe(), "cuda:0: target 0, prefetch 0, drafter 0\n");

  // Two drafters on the one GPU: data-parallel drafters are one NCCL rank per GPU.
  auto c = load_run_config(write("b.toml", minimal), {"placement.targets=cuda:0",
                                                      "placement.drafters=cuda:0,cuda:0"});
  EXPECT_EQ(error_of([&] { resolve_placement(c, 1); }),
            "--set placement.drafters=cuda:0,cuda:0: 'placement.drafters' names cuda:0 twice: data-parallel "
            "drafters need distinct GPUs (one NCCL rank each)");
  EXPECT_EQ(error_of([&] { resolve_placement(c, 0); }).find("this host has 0 GPUs") !=
              std::string::npos,
            true);
  // Two drafters on two GPUs need a batch each per step: credits x targets >= 2.
  c = load_run_config(write("d.toml", minimal), {"placement.targets=cuda:0",
                                                 "placement.drafters=cuda:0,cuda:1",
                                                 "runtime.credits=1"});
  EXPECT_EQ(error_of([&] { resolve_placement(c, 2); }),
            "--set runtime.credits=1: 'runtime.credits' (1) x 1 target(s) is less than the 2 "
            "data-parallel drafters: a group step needs one batch per drafter");
  c.runtime.credits = 2;
  EXPECT_EQ(resolve_placement(c, 2).describe(), "cuda:0: target 0, prefetch 0, drafter 0\ncuda:1: drafter 1\n");
  // A peer's collective must time out before the watchdog judges the step.
  c.runtime.group_timeout_s = 120;
  EXPECT_EQ(error_of([&] { resolve_placement(c, 2); }),
            c.source.string() + ": 'runtime.group_timeout_s' (120.0) must be less than "
                                "'runtime.step_timeout_s' (120.0): a drafter's peers must give up on a "
                                "collective it never joins before the watchdog judges the step, so "
                                "the one that failed is told apart");
  c.placement.drafters = {"cuda:1"};  // changed in code: named where the --set put its first value
  EXPECT_EQ(error_of([&] { resolve_placement(c, 1); }),
            "--set placement.drafters=cuda:0,cuda:1: 'placement.drafters' names cuda:1, but this host has 1 GPU "
            "(cuda:0)");
}

TEST_F(run_config_test, placement_0_gpus) {
  auto plan = resolve_placement(load_run_config(write("a.toml", minimal)), 0);
  ASSERT_EQ(plan.targets.size(), 1u);
  ASSERT_EQ(plan.drafters.size(), 1u);
  EXPECT_EQ(plan.targets[0].device, -1);
  EXPECT_EQ(plan.prefetch[0].device, -1);
  EXPECT_EQ(plan.drafters[0].device, -1);
  EXPECT_EQ(plan.describe(), "cpu: target 0, prefetch 0, drafter 0\n");

  // Several CPU drafters: data-parallel replicas need NCCL, so a GPU each.
  auto three = load_run_config(write("c.toml", minimal), {"placement.drafters=cpu,cpu,cpu"});
  EXPECT_EQ(error_of([&] { resolve_placement(three, 0); }),
            "--set placement.drafters=cpu,cpu,cpu: 'placement.drafters': 3 data-parallel drafters need a CUDA "
            "device each (NCCL), got \"cpu\"; use one drafter on the CPU");

  auto p = write("x.toml", minimal + "[placement]\ntargets = [\"cuda:0\"]\ndrafters = [\"cpu\"]\n");
  EXPECT_EQ(error_of([&] { resolve_placement(load_run_config(p), 0); }),
            p.string() + ":8:11: 'placement.targets' names cuda:0, but this host has 0 GPUs; use "
                         "\"cpu\", or \"auto\" (the GPUs if any, else the CPU)");
}

TEST_F(run_config_test, placement_checks_faults_name_existing_drafters) {
  auto c = load_run_config(write("f.toml", minimal + "[placement]\ndrafters = [\"cuda:0\", \"cuda:1\"]\n"));
  c.faults.push_back(parse_fault("drafter=1,kind=nan,at_step=3"));
  EXPECT_NO_THROW(resolve_placement(c, 2));
  c.faults.push_back(parse_fault("drafter=2,kind=throw,at_step=4"));
  EXPECT_EQ(error_of([&] { resolve_placement(c, 2); }),
            c.source.string() + ": fault 'drafter=2,kind=throw,at_step=4' names drafter 2, but "
                                "the placement has 2 drafters (0 to 1)");
}

TEST_F(run_config_test, to_toml_round_trips) {
  auto original = load_run_config(write("all.toml", everything));
  auto text = to_toml(original);
  // Reloaded from another folder: paths are absolute, so nothing moves.
  auto copy = load_run_config(write("elsewhere/effective.toml", text));
  auto body = [](const std::string& t) { return t.substr(t.find("\n[model]")); };
  EXPECT_EQ(body(to_toml(copy)), body(text)) << "only the 'Loaded from' comment may differ";
  EXPECT_EQ(copy.model.tap_layers, original.model.tap_layers);
  EXPECT_EQ(copy.train.lr, original.train.lr);
  EXPECT_EQ(copy.train.eps, original.train.eps);
  EXPECT_EQ(copy.supervision.backoff_s, original.supervision.backoff_s);
  EXPECT_EQ(copy.faults.size(), 2u);
  EXPECT_EQ(copy.faults[1].to_string(), original.faults[1].to_string());
  EXPECT_EQ(copy.run.output_dir, original.run.output_dir);
  EXPECT_EQ(copy.run.name, original.run.name);

  // Defaults too, and awkward values: exact doubles, strings that need escapes.
  auto d = load_run_config(write("d.toml", minimal),
                           {"train.lr=0.1", "train.eps=1e-300", "run.name=a \"b\"\\c"});
  d.train.warmup_ratio = 1.0 / 3.0;
  d.runtime.step_timeout_s = 100.0 / 3.0;
  d.supervision.backoff_s = {120, 1e-20, 0.1 + 0.2};
  auto back = load_run_config(write("d2.toml", to_toml(d)));
  EXPECT_EQ(back.train.lr, 0.1);
  EXPECT_EQ(back.train.eps, 1e-300);
  EXPECT_EQ(back.train.warmup_ratio, 1.0 / 3.0);
  EXPECT_EQ(back.runtime.step_timeout_s, 100.0 / 3.0);
  EXPECT_EQ(back.supervision.backoff_s, d.supervision.backoff_s);
  EXPECT_NE(to_toml(d).find("backoff_s = [120.0, 1e-20, 0.30000000000000004]"), std::string::npos);
  EXPECT_EQ(back.run.name, "a \"b\"\\c");
  EXPECT_EQ(back.run.output_dir, d.run.output_dir) << "the default output_dir is written out";
  EXPECT_EQ(back.checkpoint.dir, fs::path("checkpoints"));
  EXPECT_EQ(back.placement.targets, std::vector<std::string>{"auto"});

  // Every key is written, each under a comment.
  for (auto& key : run_config_keys()) {
    auto dot = key.rfind('.');
    auto field = key.substr(dot + 1) + " = ";
    EXPECT_NE(text.find("\n" + field), std::string::npos) << key;
  }
  EXPECT_NE(text.find("# the frozen target: a Hugging Face Qwen3 folder"), std::string::npos);
}

TEST_F(run_config_test, embedded_default_loads_and_its_paths_exist) {
  fs::path file = fs::path(TANDEM_SOURCE_DIR) / "config" / "default.toml";
  auto c = load_run_config(file);
  EXPECT_EQ(c.model.target, fs::path(TANDEM_SOURCE_DIR) / "config" / "default" / "target");
  EXPECT_EQ(c.data.path, c.run.output_dir / "data");
  EXPECT_NO_THROW(check_paths(c, false));
  auto plan = resolve_placement(c, 0);
  EXPECT_EQ(plan.targets.size(), 1u);
  EXPECT_EQ(plan.drafters.size(), 1u);
}

TEST_F(run_config_test, example_cluster_loads_and_places_on_its_members) {
  fs::path file = fs::path(TANDEM_SOURCE_DIR) / "config" / "cluster.toml";
  auto c = load_run_config(file);
  EXPECT_EQ(c.cluster.listen, "127.0.0.1:7070");
  EXPECT_EQ(placement_nodes(c), (std::vector<std::string>{"gpu-a", "gpu-b"}));
  EXPECT_EQ(c.cluster.secret, (fs::path(TANDEM_SOURCE_DIR) / "pki" / "cluster.secret").lexically_normal());
  auto p = resolve_placement(c, 0, {{"gpu-a", 0}, {"gpu-b", 0}});
  EXPECT_EQ(p.targets[0].node, "gpu-a");
  EXPECT_EQ(p.drafters[0].node, "gpu-b");
  EXPECT_EQ(p.describe(), "gpu-a:cpu: target 0, prefetch 0\ngpu-b:cpu: drafter 0\n");
}

TEST_F(run_config_test, example_single_node_8gpu_loads_and_resolves) {
  fs::path file = fs::path(TANDEM_SOURCE_DIR) / "config" / "single-node-8gpu.toml";
  auto c = load_run_config(file);
  EXPECT_EQ(c.model.target, fs::path("/models/Qwen3-8B"));
  EXPECT_EQ(c.drafter.layers, 5);
  EXPECT_EQ(c.drafter.mask_token_id, 151669);
  EXPECT_EQ(c.data.seq_len, 3072);
  EXPECT_EQ(c.data.anchors, 512);
  EXPECT_EQ(c.run.output_dir, (fs::current_path() / "runs" / "single-node-8gpu").lexically_normal());
  auto plan = resolve_placement(c, 8);
  ASSERT_EQ(plan.targets.size(), 5u);
  ASSERT_EQ(plan.drafters.size(), 3u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(plan.targets[i].device, i);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(plan.prefetch[i].device, i);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(plan.drafters[i].device, 5 + i);
  EXPECT_THROW(resolve_placement(c, 1), config_error);

  // Every field of the schema appears in the example and in the README table.
  std::stringstream example, readme;
  example << std::ifstream(file).rdbuf();
  readme << std::ifstream(fs::path(TANDEM_SOURCE_DIR) / "config" / "README.md").rdbuf();
  for (auto& key : run_config_keys()) {
    auto field = key.substr(key.rfind('.') + 1);
    EXPECT_NE(example.str().find(field + " = "), std::string::npos) << key << " not in the example";
    EXPECT_NE(readme.str().find("`" + key + "`"), std::string::npos) << key << " not in README";
  }
}

// Addresses: listening takes IP literals (and localhost); connecting also
// takes host names, which are never loopback (they need TLS: --certs).
TEST(addresses, listen_and_connect) {
  auto l = parse_listen("0.0.0.0:7700");
  ASSERT_TRUE(l);
  EXPECT_EQ(l->host, "0.0.0.0");
  EXPECT_EQ(l->port, 7700);
  EXPECT_TRUE(parse_listen("[::1]:0"));
  EXPECT_FALSE(parse_listen("leader-0:7700"));
  EXPECT_FALSE(parse_listen("1.2.3:7700"));
  EXPECT_FALSE(parse_listen("1.2.3.4:70000"));
  auto c = parse_connect("gpu-3.cluster.example:7700");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->host, "gpu-3.cluster.example");
  EXPECT_EQ(c->port, 7700);
  EXPECT_FALSE(c->loopback());
  EXPECT_TRUE(parse_connect("localhost:1")->loopback());
  EXPECT_TRUE(parse_connect("127.0.0.1:1")->loopback());
  for (const char* bad : {"leader", "leader:", ":7700", "leader:port", "-lead:1", "lead-:1", "a..b:1", "a_b:1",
                          "1.2.3:7700", "999.1.1.1:1", "lead:99999", "a:b:1", "runs/x:1"})
    EXPECT_FALSE(parse_connect(bad)) << bad;
}
