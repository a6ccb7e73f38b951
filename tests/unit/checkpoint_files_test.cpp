// Checkpoint folders on disk (gpu/engine/checkpoint.hpp): CRC-32C, the
// `latest` pointer, rotation, the resume lookup's fallback past corrupt
// checkpoints, and SIGKILL at every point of a write (issue 19: "--resume
// always finds the newest complete checkpoint, never a torn one").  The
// checkpoints are small synthetic snapshots (publish_snapshot) whose every
// value is their step, so a checkpoint read back says which write made it.
#include "gpu/pch.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpu/engine/checkpoint.hpp"
#include "gpu/engine/checkpoint_io.hpp"
#include "gpu/engine/crc32c.hpp"
#include "tests/unit/expect_error.hpp"
#include "tests/unit/files.hpp"

namespace fs = std::filesystem;
using namespace tandem;
using namespace tandem::gpu;
using tandem::test::expect_bad_input;
using tandem::test::read_bytes;
using tandem::test::remove_tree;
using tandem::test::write_bytes;

namespace {

struct temp_dir {
  fs::path dir;
  temp_dir() {
    char t[] = "/tmp/tandem-ckpt-XXXXXX";
    dir = ::mkdtemp(t);
  }
  ~temp_dir() { remove_tree(dir); }
};

/// A snapshot whose weights, moments and step all hold `step`.
transport::handle synthetic_snapshot(int64_t step, int64_t numel = 1000) {
  snapshot_parts p;
  p.state = nlohmann::json{{"format", checkpoint_format},
                           {"version", checkpoint_version},
                           {"step", step},
                           {"generator", {{"device", "cpu"}, {"state", "00"}}},
                           {"drafter", nlohmann::json::object()},
                           {"parameters", {"a.weight", "b.weight"}}}
              .dump();
  for (int64_t n : {numel, int64_t{7}}) {
    p.weights.push_back(at::full({n}, static_cast<float>(step)));
    p.exp_avg.push_back(at::full({n}, static_cast<float>(step) + 0.5f));
    p.exp_avg_sq.push_back(at::full({n}, static_cast<float>(step) + 0.25f));
  }
  p.step = at::full({}, static_cast<float>(step));
  return publish_snapshot(p);
}

void write_step(const fs::path& root, int64_t step, int64_t numel = 1000) {
  auto h = synthetic_snapshot(step, numel);
  write_checkpoint(h, root / checkpoint_name(step), "{\"step\": " + std::to_string(step) + "}");
  transport::release(h);
}

/// The step a checkpoint's contents say (every value must agree).
int64_t contents_step(const fs::path& dir) {
  auto c = read_checkpoint(dir);
  const auto k = c.step;
  for (const auto& w : c.weights)
    EXPECT_TRUE(at::equal(w, at::full_like(w, static_cast<float>(k)))) << dir;
  return k;
}

/// Flips one bit at `offset` from the end of `file`.
void flip_bit_near_end(const fs::path& file, size_t from_end) {
  auto b = read_bytes(file);
  ASSERT_GT(b.size(), from_end);
  b[b.size() - from_end] ^= 0x01;
  write_bytes(file, b);
}

} // namespace

TEST(checkpoint_files, crc32c_matches_the_check_value_and_the_portable_code) {
  const char* nine = "123456789";
  EXPECT_EQ(crc32c(nine, 9), 0xE3069283u);  // RFC 3720 B.4
  EXPECT_EQ(crc32c_portable(nine, 9), 0xE3069283u);
  EXPECT_EQ(crc32c_hex(0xE3069283u), "e3069283");
  std::mt19937_64 rng(7);
  std::vector<uint8_t> buf(4099);
  for (auto& b : buf)
    b = static_cast<uint8_t>(rng());
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{63}, size_t{4099}})
    EXPECT_EQ(crc32c(buf.data(), n), crc32c_portable(buf.data(), n)) << n;
  // Continuing over two pieces is one pass over both.
  EXPECT_EQ(crc32c(buf.data() + 100, 3999, crc32c(buf.data(), 100)), crc32c(buf.data(), 4099));
}

TEST(checkpoint_files, latest_names_each_write_and_rotation_keeps_the_newest) {
  temp_dir t;
  for (int64_t k : {10, 20, 30, 40}) {
    write_step(t.dir, k);
    EXPECT_EQ(read_latest(t.dir), fs::path(list_checkpoints(t.dir).front()).filename().string());
  }
  EXPECT_EQ(read_latest(t.dir), "step-00000040");
  ASSERT_EQ(list_checkpoints(t.dir).size(), 4u);
  EXPECT_EQ(list_checkpoints(t.dir).front().filename(), "step-00000040");
  // A killed write's folder is not a checkpoint, and rotation removes it.
  fs::create_directory(t.dir / "step-00000050.tmp");
  write_bytes(t.dir / "step-00000050.tmp" / "state.json", "{}");
  EXPECT_EQ(list_checkpoints(t.dir).size(), 4u);
  // keep = 2: 10 and 20 go, except a protected one.
  auto removed = rotate_checkpoints(t.dir, 2, t.dir / "step-00000010");
  EXPECT_EQ(removed.size(), 2u);  // step-20 and the .tmp
  EXPECT_TRUE(fs::exists(t.dir / "step-00000010"));
  EXPECT_FALSE(fs::exists(t.dir / "step-00000020"));
  EXPECT_FALSE(fs::exists(t.dir / "step-00000050.tmp"));
  rotate_checkpoints(t.dir, 2, std::filesystem::path{});
  std::vector<std::string> left;
  for (const auto& p : list_checkpoints(t.dir))
    left.push_back(p.filename().string());
  EXPECT_EQ(left, (std::vector<std::string>{"step-00000040", "step-00000030"}));

  // The checkpointer clears a killed write before its next one (its space
  // check must not count it), touching no complete checkpoint; two
  // protected folders stay through a rotation.
  fs::create_directory(t.dir / "step-00000045.tmp");
  write_bytes(t.dir / "step-00000045.tmp" / "weights.safetensors", std::string(4096, 'x'));
  const auto cleared = remove_killed_writes(t.dir);
  ASSERT_EQ(cleared.size(), 1u);
  EXPECT_EQ(cleared[0].filename(), "step-00000045.tmp");
  EXPECT_FALSE(fs::exists(t.dir / "step-00000045.tmp"));
  EXPECT_EQ(list_checkpoints(t.dir).size(), 2u);
  write_step(t.dir, 50);
  rotate_checkpoints(t.dir, 1, std::vector<fs::path>{t.dir / "step-00000050", t.dir / "step-00000030"});
  left.clear();
  for (const auto& p : list_checkpoints(t.dir))
    left.push_back(p.filename().string());
  EXPECT_EQ(left, (std::vector<std::string>{"step-00000050", "step-00000030"}));
}

TEST(checkpoint_files, resume_falls_back_past_corrupt_checkpoints_naming_file_and_tensor) {
  temp_dir t;
  for (int64_t k : {10, 20, 30})
    write_step(t.dir, k);
  // step-30: one low bit of the last weight's data flipped.
  flip_bit_near_end(t.dir / "step-00000030" / "weights.safetensors", 3);
  expect_bad_input([&] { verify_checkpoint(t.dir / "step-00000030"); },
                   {"step-00000030/weights.safetensors", "tensor 'b.weight'", "corrupt", "CRC-32C"});
  // step-20: the optimizer file truncated.
  auto opt = read_bytes(t.dir / "step-00000020" / "optimizer.safetensors");
  write_bytes(t.dir / "step-00000020" / "optimizer.safetensors", opt.substr(0, opt.size() / 2));
  expect_bad_input([&] { verify_checkpoint(t.dir / "step-00000020"); },
                   {"step-00000020/optimizer.safetensors"});

  const auto r = find_resume_checkpoint(t.dir);
  ASSERT_EQ(r.dir, t.dir / "step-00000010");
  EXPECT_EQ(r.step, 10);
  EXPECT_EQ(contents_step(r.dir), 10);
  ASSERT_EQ(r.warnings.size(), 3u);  // two skipped, and `latest` names step-30
  EXPECT_NE(r.warnings[0].find("weights.safetensors: tensor 'b.weight' is corrupt"), std::string::npos)
    << r.warnings[0];
  EXPECT_NE(r.warnings[0].find("moved aside to step-00000030.corrupt"), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[1].find("optimizer.safetensors"), std::string::npos) << r.warnings[1];
  EXPECT_NE(r.warnings[2].find("latest names 'step-00000030'"), std::string::npos) << r.warnings[2];
  EXPECT_TRUE(fs::exists(t.dir / "step-00000030.corrupt"));
  // Moved aside: the next lookup goes straight to step-10.
  EXPECT_EQ(find_resume_checkpoint(t.dir).dir, t.dir / "step-00000010");
  // A state.json whose checksum of a tensor was edited is caught too.
  write_step(t.dir, 40);
  auto state = nlohmann::json::parse(read_bytes(t.dir / "step-00000040" / "state.json"));
  state["checksums"]["optimizer.safetensors"]["step"] = "00000000";
  write_bytes(t.dir / "step-00000040" / "state.json", state.dump());
  expect_bad_input([&] { verify_checkpoint(t.dir / "step-00000040"); },
                   {"optimizer.safetensors", "tensor 'step'"});
  // The runtime's state (extra: step, ledger) has its checksum too: an edit
  // that keeps it JSON is caught, and a resume falls back past it.
  write_step(t.dir, 50);
  state = nlohmann::json::parse(read_bytes(t.dir / "step-00000050" / "state.json"));
  state["extra"] = "{\"step\": 50, \"ledger\": [1]}";
  write_bytes(t.dir / "step-00000050" / "state.json", state.dump());
  expect_bad_input([&] { verify_checkpoint(t.dir / "step-00000050"); },
                   {"step-00000050/state.json", "field 'extra' is corrupt", "CRC-32C"});
  // Without its checksum (as before it was recorded): still JSON, and its
  // step must be the checkpoint's.
  state.erase("extra_crc32c");
  state["extra"] = "{\"step\": 49}";
  write_bytes(t.dir / "step-00000050" / "state.json", state.dump());
  expect_bad_input([&] { verify_checkpoint(t.dir / "step-00000050"); }, {"field 'extra' says step 49"});
  state["extra"] = "{\"step\": 5";
  write_bytes(t.dir / "step-00000050" / "state.json", state.dump());
  expect_bad_input([&] { verify_checkpoint(t.dir / "step-00000050"); }, {"field 'extra' is not JSON"});
  EXPECT_EQ(find_resume_checkpoint(t.dir).dir, t.dir / "step-00000010");
}

TEST(checkpoint_files, sizes_read_as_a_person_would) {
  EXPECT_EQ(human_bytes(0), "0 B");
  EXPECT_EQ(human_bytes(1536), "1.5 KiB");
  EXPECT_EQ(human_bytes(uint64_t{13528} << 20), "13.2 GiB");
  // fp32 weights and two moments per parameter, + 64 KiB of headers.
  EXPECT_EQ(checkpoint_bytes(1000), 12000u + (1u << 16));
}

// SIGKILL at every named point of a write (TANDEM_CHECKPOINT_CRASH) and at
// random moments, 60 trials in one folder whose leftovers each trial
// inherits: a child process writes checkpoint after checkpoint (rotating
// with keep = 2, as the checkpointer does) and reports each completed write
// through a pipe; after the kill, find_resume_checkpoint must return a
// checkpoint at least as new as the last completed write, whose contents are
// whole, with no corrupt one on the way.  ~10 s.
TEST(checkpoint_files, sigkill_during_writes_never_leaves_a_torn_checkpoint_for_resume) {
  temp_dir t;
  const std::vector<std::string> points{"weights", "optimizer", "state", "before_swap", "after_swap",
                                        "after_latest"};
  std::mt19937 rng(2026);
  write_step(t.dir, 0);  // a run's first checkpoint, so that there is always one to resume
  int64_t next = 1;
  int killed_at_points = 0, killed_at_random = 0;
  for (int trial = 0; trial < 60; ++trial) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const bool at_point = trial % 2 == 0;
    const auto first = next;
    const auto crash_step = first + static_cast<int64_t>(rng() % 3);
    const auto point = points[static_cast<size_t>(trial / 2) % points.size()];
    const int delay_us = static_cast<int>(rng() % 20000);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      if (at_point)
        ::setenv("TANDEM_CHECKPOINT_CRASH", (point + ":" + std::to_string(crash_step)).c_str(), 1);
      for (int64_t k = first;; ++k) {
        // Bigger tensors now and then, so a random kill lands mid-file too
        // (below 32768 elements: no intra-op threads in a forked child).
        write_step(t.dir, k, k % 3 == 0 ? 30000 : 1000);
        rotate_checkpoints(t.dir, 2, t.dir / checkpoint_name(k));
        if (::write(fds[1], &k, sizeof k) != sizeof k)
          ::_exit(3);
      }
    }
    ::close(fds[1]);
    if (!at_point) {
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      ::kill(pid, SIGKILL);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "trial " << trial << ": status " << status;
    (at_point ? killed_at_points : killed_at_random) += 1;
    int64_t done = first - 1, k = 0;
    while (::read(fds[0], &k, sizeof k) == sizeof k)
      done = k;
    ::close(fds[0]);
    if (at_point)  // killed inside the write of crash_step
      EXPECT_EQ(done, crash_step - 1) << "trial " << trial << " (" << point << ")";

    const auto r = find_resume_checkpoint(t.dir);
    for (const auto& w : r.warnings)
      EXPECT_EQ(w.find("corrupt"), std::string::npos) << "trial " << trial << ": " << w;
    for (const auto& w : r.warnings)
      EXPECT_EQ(w.find("skipped"), std::string::npos) << "trial " << trial << ": " << w;
    ASSERT_FALSE(r.dir.empty()) << "trial " << trial << ": nothing to resume from (done " << done << ")";
    EXPECT_GE(r.step, done) << "trial " << trial;
    EXPECT_LE(r.step, done + 1) << "trial " << trial;  // at most the write in progress, complete
    EXPECT_EQ(contents_step(r.dir), r.step) << "trial " << trial;
    if (at_point && (point == "after_swap" || point == "after_latest"))
      EXPECT_EQ(r.step, crash_step) << "trial " << trial << ": " << point << " is past the rename";
    if (at_point && point != "after_swap" && point != "after_latest")
      EXPECT_EQ(r.step, crash_step - 1) << "trial " << trial << ": " << point << " is before the rename";
    if (at_point && point == "after_swap")  // the pointer is one behind; resume is not
      EXPECT_NE(read_latest(t.dir), r.dir.filename().string()) << "trial " << trial;
    next = std::max(next, r.step + 1);
  }
  EXPECT_EQ(killed_at_points, 30);
  EXPECT_EQ(killed_at_random, 30);
}
