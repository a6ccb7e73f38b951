// Captured drafter steps (gpu/engine/graph.hpp) on a real GPU, with the
// parity fixtures' tiny Qwen3 target; "[  SKIPPED ]" without one.
//   - graph replay follows the eager loss trajectory over 50 steps;
//   - a restored engine captures again and continues like the original;
//   - 8 engines on one GPU capturing their first graphs at the same moment,
//     20 rounds in fresh processes (tests/gpu/capture_stress.cpp): no
//     failure, and the captures never overlapped (the process capture lock).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <unistd.h>
#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "gpu/engine/adamw.hpp"
#include "gpu/engine/batch.hpp"
#include "gpu/engine/drafter_engine.hpp"
#include "gpu/engine/graph.hpp"
#include "gpu/engine/target_engine.hpp"
#include "gpu/pch.hpp"
#include "tests/gpu/fixtures.hpp"
#include "gpu/transport/tensors.hpp"

using namespace tandem::gpu;
using namespace tandem::gpu::test;
namespace fs = std::filesystem;

namespace {

bool have_gpu() {
  return torch::cuda::is_available() && torch::cuda::device_count() > 0;
}

drafter_engine_options options(bool graphs) {
  drafter_engine_options o;
  o.target_dir = tiny_target_dir();
  o.device = 0;
  o.layers = 2;
  o.block_size = 8;
  o.mask_token_id = 511;
  o.anchors = 16;
  o.chunk_rows = 64;
  o.seed = 11;
  o.lr = 2e-3;
  o.total_steps = 50;
  o.capture_graphs = graphs;
  return o;
}

/// Batches and their features on cuda:0, published for the test's life.
struct gpu_inputs {
  std::vector<transport::handle> batches, features;
  explicit gpu_inputs(int n) {
    target_engine target({tiny_target_dir(), 0, "auto", {}});
    for (int i = 0; i < n; ++i) {
      batches.push_back(publish_batch(phrase_batch(2, 128, 100 + static_cast<uint64_t>(i))));
      features.push_back(target.forward(batches.back()));
    }
  }
  ~gpu_inputs() {
    for (auto h : features) transport::release(h);
    for (auto h : batches) transport::release(h);
  }
};

} // namespace

TEST(graph, replay_follows_the_eager_trajectory_for_50_steps) {
  if (!have_gpu())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  gpu_inputs in(5);
  drafter_engine eager(options(false)), graphed(options(true));
  const auto captures_before = captures_in_process();
  double worst = 0;
  for (int step = 0; step < 50; ++step) {
    const auto i = static_cast<size_t>(step % 5);
    auto a = eager.train_step(in.batches[i], in.features[i]);
    auto b = graphed.train_step(in.batches[i], in.features[i]);
    ASSERT_TRUE(a.finite && b.finite) << "step " << step;
    ASSERT_EQ(a.step, b.step);
    ASSERT_EQ(a.scored_tokens, b.scored_tokens) << "step " << step << ": other anchors were drawn";
    const double rel = std::abs(a.loss - b.loss) / std::abs(a.loss);
    worst = std::max(worst, rel);
    // bf16 forward/backward: the same kernels in the same order, so the
    // trajectories agree far inside this; a wrong static input, a stale
    // generator or a missed update would break it within a step or two.
    EXPECT_LE(rel, 2e-3) << "step " << step << ": eager " << a.loss << ", graph " << b.loss;
    EXPECT_NEAR(a.lr, b.lr, 1e-12);
  }
  std::printf("graph vs eager over 50 steps: max relative loss difference %.3g\n", worst);
  EXPECT_EQ(captures_in_process() - captures_before, 1) << "one capture, then replays";
}

TEST(graph, the_learning_rate_multiplier_reaches_the_replayed_update) {
  // The multiplier lives in a device tensor the captured update reads: set
  // between replays (1, then 0.5, then 2), the graph's lr and losses follow
  // the eager engine's, and the lr is float32(scheduled · scale).
  if (!have_gpu())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  gpu_inputs in(3);
  const auto o = options(true);
  drafter_engine eager(options(false)), graphed(o);
  const auto captures_before = captures_in_process();
  for (int step = 0; step < 24; ++step) {
    const auto i = static_cast<size_t>(step % 3);
    const double scale = step < 8 ? 1.0 : step < 16 ? 0.5 : 2.0;
    auto a = eager.train_step(in.batches[i], in.features[i], true, scale);
    auto b = graphed.train_step(in.batches[i], in.features[i], true, scale);
    ASSERT_TRUE(a.finite && b.finite) << "step " << step;
    EXPECT_EQ(a.lr, b.lr) << "step " << step + 1;
    adamw_options ao;
    ao.lr = o.lr;
    ao.warmup_ratio = o.warmup_ratio;
    ao.total_steps = o.total_steps;
    EXPECT_NEAR(b.lr, static_cast<float>(scheduled_lr(ao, step + 1) * scale), 1e-12) << "step " << step + 1;
    EXPECT_LE(std::abs(a.loss - b.loss) / std::abs(a.loss), 2e-3) << "step " << step + 1;
  }
  EXPECT_EQ(captures_in_process() - captures_before, 1) << "one capture: the multiplier needs no new one";
}

TEST(graph, a_restored_engine_captures_again_and_continues) {
  if (!have_gpu())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  gpu_inputs in(3);
  const auto dir = fs::temp_directory_path() / ("tandem_graph_restore_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  drafter_engine first(options(true));
  for (int step = 0; step < 6; ++step)
    first.train_step(in.batches[static_cast<size_t>(step % 3)], in.features[static_cast<size_t>(step % 3)]);
  auto snap = first.snapshot();
  write_checkpoint(snap, dir / "step-6", "");
  transport::release(snap);
  std::vector<double> expected;
  for (int step = 6; step < 12; ++step)
    expected.push_back(first.train_step(in.batches[static_cast<size_t>(step % 3)],
                                        in.features[static_cast<size_t>(step % 3)]).loss);

  const auto captures_before = captures_in_process();
  drafter_engine second(options(true));
  second.restore(dir / "step-6");
  for (int step = 6; step < 12; ++step) {
    auto r = second.train_step(in.batches[static_cast<size_t>(step % 3)],
                               in.features[static_cast<size_t>(step % 3)]);
    EXPECT_EQ(r.step, step + 1);
    EXPECT_LE(std::abs(r.loss - expected[static_cast<size_t>(step - 6)]),
              2e-3 * std::abs(expected[static_cast<size_t>(step - 6)]))
      << "step " << step + 1;
  }
  EXPECT_EQ(captures_in_process() - captures_before, 1) << "the restored engine captured anew";
  fs::remove_all(dir);
}

TEST(graph, prepared_snapshot_buffers_end_page_locked_and_copy_exactly) {
  if (!have_gpu())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
#ifdef TANDEM_HAVE_CUDA
  // The host sets a helper thread maps ahead, page-locked piece by piece
  // while steps run (and the rest at the snapshot that takes them): every
  // tensor of an asynchronous snapshot lies in page-locked memory and holds
  // what the synchronous snapshot (pageable, copied on the thread) holds.
  gpu_inputs in(3);
  auto o = options(true);
  o.prepare_snapshot_buffers = true;
  o.memory_slot = 77;  // its host sets are not another test's
  drafter_engine e(o);
  auto take = [&] {
    e.begin_snapshot();
    std::optional<transport::handle> h;
    while (!h)
      h = e.poll_snapshot();
    return *h;
  };
  std::vector<transport::handle> held;
  for (int round = 0; round < 3; ++round) {  // the two prepared sets, then the first again
    for (int step = 0; step < 4; ++step)
      e.train_step(in.batches[static_cast<size_t>(step % 3)], in.features[static_cast<size_t>(step % 3)]);
    auto sync = e.snapshot();
    auto async = take();
    const auto want = transport::acquire(sync, at::Device(at::kCPU));
    const auto got = transport::acquire(async, at::Device(at::kCPU));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(at::equal(got[i], want[i])) << "round " << round << ", tensor " << i;
    for (size_t i = 1; i < got.size(); ++i) {  // [0] is the state text
      cudaPointerAttributes a{};
      ASSERT_EQ(cudaPointerGetAttributes(&a, got[i].data_ptr()), cudaSuccess);
      EXPECT_EQ(a.type, cudaMemoryTypeHost) << "round " << round << ", tensor " << i << " is not page-locked";
    }
    transport::release(sync);
    held.push_back(async);
    if (round == 1)  // both sets written: free again
      for (auto h : std::exchange(held, {}))
        transport::release(h);
  }
  for (auto h : held)
    transport::release(h);
#endif
}

TEST(graph, in_place_restore_point_stages_snapshots_and_restores_a_graphed_engine) {
  if (!have_gpu())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  // checkpoint.memory_every 1: the restore point is the drafter's own state.
  // An asynchronous snapshot goes through staging buffers on the device
  // while the next steps run: it still holds the step it was begun at (the
  // synchronous snapshot's bits), and those steps are the uninterrupted
  // run's, bit for bit.  A new engine then restores the point after graphed
  // steps and follows the trajectory.
  gpu_inputs in(3);
  auto pick = [](int step) { return static_cast<size_t>(step % 3); };
  drafter_engine::drop_restore_points();
  drafter_engine straight(options(true));
  std::vector<double> want;
  for (int step = 0; step < 12; ++step)
    want.push_back(straight.train_step(in.batches[pick(step)], in.features[pick(step)]).loss);
  auto o = options(true);
  o.memory_every = 1;
  o.memory_slot = 78;
  drafter_engine e(o);
  for (int step = 0; step < 6; ++step) {
    EXPECT_EQ(e.train_step(in.batches[pick(step)], in.features[pick(step)]).loss, want[static_cast<size_t>(step)]);
    EXPECT_EQ(e.keep_restore_point(), step + 1);
  }
  auto sync = e.snapshot();
  e.begin_snapshot();
  for (int step = 6; step < 8; ++step) {  // beside the snapshot's copy to the host
    EXPECT_EQ(e.train_step(in.batches[pick(step)], in.features[pick(step)]).loss, want[static_cast<size_t>(step)])
      << "step " << step + 1;
    EXPECT_EQ(e.keep_restore_point(), step + 1);
  }
  std::optional<transport::handle> async;
  while (!async)
    async = e.poll_snapshot();
  {
    const auto a = transport::acquire(sync, at::Device(at::kCPU));
    const auto b = transport::acquire(*async, at::Device(at::kCPU));
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(at::equal(a[i], b[i])) << "tensor " << i << " of the staged snapshot";
  }
  transport::release(sync);
  transport::release(*async);
  auto other = o;
  other.seed = 99;  // what matches comes from the restore point
  drafter_engine next(other);
  next.restore_memory(8);
  double worst = 0;
  for (int step = 8; step < 12; ++step) {
    auto r = next.train_step(in.batches[pick(step)], in.features[pick(step)]);
    EXPECT_EQ(r.step, step + 1);
    const double rel = std::abs(r.loss - want[static_cast<size_t>(step)]) / std::abs(want[static_cast<size_t>(step)]);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 2e-3) << "step " << step + 1;  // its first step eager, as after any restore
  }
  std::printf("in-place restore point: max relative loss difference after the restore %.3g\n", worst);
  drafter_engine::drop_restore_points();
}

TEST(graph, eight_engines_capture_their_first_graphs_at_once_20_fresh_processes) {
  if (!have_gpu())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  int failures = 0;
  for (int round = 0; round < 20; ++round) {
    const std::string cmd = std::string(TANDEM_CAPTURE_STRESS) + " " + TANDEM_FIXTURES_DIR + " 0 8 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[512];
    while (std::fgets(buf, sizeof buf, p))
      out += buf;
    const int status = ::pclose(p);
    std::printf("round %2d: %s", round, out.c_str());
    if (status != 0) {
      ++failures;
      ADD_FAILURE() << "round " << round << " exited with status " << status << ":\n" << out;
    }
  }
  EXPECT_EQ(failures, 0);
}

// Training turns on a shared GPU (captured_step::replay(take_turn)): graph A
// doubles x 400 times (milliseconds of work), graph B, on its own stream and
// launched right after A with no other ordering, copies x into y.  Taken as
// turns, B starts only once A has ended: y is the final x, every round.  Side
// by side (no turns) B would read a half-doubled x.
TEST(graph, replays_taken_as_turns_run_one_after_the_other) {
  if (!have_gpu())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  if (!device_turns_enabled())
    GTEST_SKIP() << "SKIPPED: TANDEM_SHARED_GPU=concurrent";
  const auto dev = torch::Device(torch::kCUDA, 0);
  auto x = torch::ones({1 << 22}, torch::dtype(torch::kFloat64).device(dev));
  auto y = torch::zeros_like(x);
  captured_step a(dev), b(dev);
  a.capture([&] {
    for (int i = 0; i < 400; ++i)
      x.mul_(2.0).div_(2.0).mul_(1.0 + 1.0 / 1024);
  }, {});
  b.capture([&] { y.copy_(x); }, {});
  const auto taken = device_turns_taken();
  for (int round = 0; round < 5; ++round) {
    x.fill_(1.0);
    torch::cuda::synchronize(0);
    a.replay(/*take_turn=*/true);
    b.replay(/*take_turn=*/true);
    torch::cuda::synchronize(0);
    EXPECT_TRUE(torch::equal(x, y)) << "round " << round << ": B ran beside A (y " << y[0].item<double>()
                                    << ", x " << x[0].item<double>() << ")";
    EXPECT_GT(x[0].item<double>(), 1.4) << "A did its work";
  }
  EXPECT_EQ(device_turns_taken() - taken, 10);
}
