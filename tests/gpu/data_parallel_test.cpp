// Data-parallel drafters (DESIGN.md §3, §4; drafter_engine::join_group) on two
// GPUs, with the parity fixtures' tiny Qwen3 target; "[  SKIPPED ]" with fewer
// than 2 CUDA devices or without NCCL.  One thread per rank, each owning one
// drafter engine and one target engine on its own GPU, as one drafter actor
// per GPU would; every rank trains on DIFFERENT batches.
//   - captured steps (capture_graphs = true), 20 steps: after every step the
//     two ranks' fp32 master weights are bit-identical, both saw the same
//     (averaged) gradient norm, the weights moved, the losses differ;
//   - the same with eager steps (capture_graphs = false);
//   - ranks built with different seeds start as replicas (rank 0's weights
//     are broadcast at join).
//   build/bin/gpu_tests --gtest_filter='data_parallel*'
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/engine/batch.hpp"
#include "gpu/engine/drafter_engine.hpp"
#include "gpu/engine/target_engine.hpp"
#include "gpu/device/error.hpp"
#include "gpu/nccl/communicator.hpp"
#include "gpu/pch.hpp"
#include "tests/gpu/fixtures.hpp"
#include "gpu/transport/tensors.hpp"

using namespace tandem::gpu;
using namespace tandem::gpu::test;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using tandem::test::contains;

namespace {

drafter_engine_options options(int device, bool graphs, uint64_t seed) {
  drafter_engine_options o;
  o.target_dir = tiny_target_dir();
  o.device = device;
  o.layers = 2;
  o.block_size = 8;
  o.mask_token_id = 511;
  o.anchors = 16;
  o.chunk_rows = 64;
  o.seed = seed;
  o.lr = 2e-3;
  o.total_steps = 20;
  o.capture_graphs = graphs;
  return o;
}

/// One thread per rank (tests/gpu/fixtures.hpp), named for this test's hang message.
void on_ranks(int world, const std::function<void(int)>& body,
              std::chrono::seconds limit = std::chrono::seconds(240)) {
  tandem::gpu::test::on_ranks("data_parallel_test", world, body, limit);
}

/// The engine's fp32 master weights, on the CPU (from its snapshot).
std::vector<at::Tensor> masters_of(const drafter_engine& e) {
  const auto h = e.snapshot();
  auto t = transport::acquire(h, at::Device(at::kCPU));
  transport::release(h);
  // {state bytes, step, weights…, exp_avg…, exp_avg_sq…}
  const auto n = (t.size() - 2) / 3;
  return std::vector<at::Tensor>(t.begin() + 2, t.begin() + 2 + static_cast<std::ptrdiff_t>(n));
}

bool bit_identical(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size())
    return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].sizes() != b[i].sizes() || !at::equal(a[i], b[i]))
      return false;
  return true;
}

/// What one rank saw over its steps.
struct rank_record {
  std::vector<at::Tensor> initial;                 ///< masters right after join_group
  std::vector<std::vector<at::Tensor>> after;      ///< masters after each step
  std::vector<step_result> results;
};

/// Two ranks, different seeds and different batches, `steps` steps.
std::vector<rank_record> train_two_ranks(bool graphs, int steps) {
  const auto id = nccl::new_unique_id();
  std::vector<rank_record> rec(2);
  on_ranks(2, [&](int r) {
    c10::cuda::CUDAGuard device(static_cast<c10::DeviceIndex>(r));
    // Each rank's own features, from its own target engine on its own GPU.
    target_engine target({tiny_target_dir(), r, "auto", {}});
    std::vector<transport::handle> batches, features;
    for (int i = 0; i < 4; ++i) {
      batches.push_back(publish_batch(phrase_batch(2, 128, 1000 * static_cast<uint64_t>(r + 1) + i)));
      features.push_back(target.forward(batches.back()));
    }
    {
      // Different seeds on purpose: join_group must make them replicas.
      drafter_engine drafter(options(r, graphs, 11 + static_cast<uint64_t>(r)));
      drafter.join_group(id, r, 2, 60s);
      EXPECT_EQ(drafter.group_world(), 2);
      rec[r].initial = masters_of(drafter);
      for (int s = 0; s < steps; ++s) {
        const auto i = static_cast<size_t>(s % 4);
        rec[r].results.push_back(drafter.train_step(batches[i], features[i]));
        rec[r].after.push_back(masters_of(drafter));
      }
      EXPECT_TRUE(drafter.leave_group(60s)) << "rank " << r << ": the communicator did not close cleanly";
    }
    for (auto h : features) transport::release(h);
    for (auto h : batches) transport::release(h);
  });
  return rec;
}

void expect_replicas(const std::vector<rank_record>& rec, int steps) {
  ASSERT_EQ(rec.size(), 2u);
  ASSERT_EQ(rec[0].after.size(), static_cast<size_t>(steps));
  ASSERT_EQ(rec[1].after.size(), static_cast<size_t>(steps));
  EXPECT_TRUE(bit_identical(rec[0].initial, rec[1].initial))
    << "ranks built with different seeds must start from rank 0's weights";
  int losses_differ = 0;
  for (int s = 0; s < steps; ++s) {
    const auto& a = rec[0].results[static_cast<size_t>(s)];
    const auto& b = rec[1].results[static_cast<size_t>(s)];
    ASSERT_TRUE(a.finite && b.finite) << "step " << s;
    EXPECT_EQ(a.step, s + 1);
    EXPECT_EQ(a.step, b.step);
    // Both clip the same averaged gradient: the same norm, bit for bit.
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s;
    EXPECT_EQ(a.lr, b.lr) << "step " << s;
    EXPECT_TRUE(bit_identical(rec[0].after[static_cast<size_t>(s)], rec[1].after[static_cast<size_t>(s)]))
      << "step " << s << ": the ranks' master weights differ";
    losses_differ += a.loss != b.loss;
  }
  // Different data: the local losses differ (on essentially every step).
  EXPECT_GE(losses_differ, steps - 1) << "the ranks' losses should differ: different batches";
  // The weights moved.
  double moved = 0;
  for (size_t i = 0; i < rec[0].initial.size(); ++i)
    moved = std::max(moved, (rec[0].after.back()[i] - rec[0].initial[i]).abs().max().item<double>());
  EXPECT_GT(moved, 1e-4) << "20 updates should move some weight";
  std::printf("data parallel: %d steps, loss rank0 %.4f → %.4f, rank1 %.4f → %.4f, max |Δw| %.3g\n",
              steps, rec[0].results.front().loss, rec[0].results.back().loss,
              rec[1].results.front().loss, rec[1].results.back().loss, moved);
}

/// Two ranks train `together` steps; then rank 1 "dies" before its next
/// step and, once rank 0 is inside that step, its group is aborted (what
/// the coordinator does for a rank it knows failed).  Rank 0's step must end
/// at once with the group broken and its state that of the step before:
/// update count and master weights unchanged (the guarded update skipped).
void survivor_keeps_its_state(bool graphs, int together) {
  const auto id = nccl::new_unique_id();
  std::promise<void> entering;
  auto rank0_entering = entering.get_future().share();
  on_ranks(2, [&](int r) {
    c10::cuda::CUDAGuard device(static_cast<c10::DeviceIndex>(r));
    target_engine target({tiny_target_dir(), r, "auto", {}});
    auto batch = publish_batch(phrase_batch(2, 128, 500 + static_cast<uint64_t>(r)));
    auto features = target.forward(batch);
    {
      drafter_engine drafter(options(r, graphs, 11));
      drafter.join_group(id, r, 2, 60s);
      for (int s = 0; s < together; ++s)
        drafter.train_step(batch, features);
      if (r == 1) {
        rank0_entering.wait();
        std::this_thread::sleep_for(1s);
        EXPECT_EQ(nccl::abort_group(id, "drafter 1 died in step " + std::to_string(together + 1)), 2u);
        drafter.leave_group(1s);
      } else {
        const auto before = masters_of(drafter);
        const auto step_before = drafter.step();
        EXPECT_EQ(step_before, together);
        entering.set_value();
        const auto t0 = steady::now();
        try {
          drafter.train_step(batch, features);
          ADD_FAILURE() << "rank 0's step must fail: its peer never took part";
        } catch (const error& e) {
          std::printf("survivor (%s): step %d ended after %.2f s: %s\n", graphs ? "graphed" : "eager",
                      together + 1, seconds_since(t0), e.what());
          EXPECT_TRUE(contains(e.what(), "aborted for its group: drafter 1 died")) << e.what();
        }
        EXPECT_LT(seconds_since(t0), 10.0) << "the abort, not the 60 s deadline, must end the step";
        EXPECT_TRUE(drafter.group_broken());
        drafter.leave_group(2s);
        EXPECT_EQ(drafter.sync_step(), step_before) << "the cut-short update must be skipped";
        EXPECT_EQ(drafter.step(), step_before);
        EXPECT_TRUE(bit_identical(masters_of(drafter), before))
          << "the survivor's master weights must be those of step " << step_before;
      }
    }
    transport::release(features);
    transport::release(batch);
  });
}

} // namespace

TEST(data_parallel, a_survivor_of_a_peer_dead_mid_step_keeps_its_state_graphed) {
  TANDEM_REQUIRE_GPUS(2);
  TANDEM_REQUIRE_NCCL();
  survivor_keeps_its_state(/*graphs=*/true, /*together=*/3);  // eager, capture, replay
}

TEST(data_parallel, a_survivor_of_a_peer_dead_mid_step_keeps_its_state_eager) {
  TANDEM_REQUIRE_GPUS(2);
  TANDEM_REQUIRE_NCCL();
  survivor_keeps_its_state(/*graphs=*/false, /*together=*/2);
}

TEST(data_parallel, captured_steps_keep_two_drafters_bit_identical) {
  TANDEM_REQUIRE_GPUS(2);
  TANDEM_REQUIRE_NCCL();
  const int steps = 20;
  expect_replicas(train_two_ranks(/*graphs=*/true, steps), steps);
}

TEST(data_parallel, eager_steps_keep_two_drafters_bit_identical) {
  TANDEM_REQUIRE_GPUS(2);
  TANDEM_REQUIRE_NCCL();
  const int steps = 20;
  expect_replicas(train_two_ranks(/*graphs=*/false, steps), steps);
}

TEST(data_parallel_cpu, join_group_is_refused_on_the_cpu) {
  if (!fs::exists(tiny_target_dir() / "config.json"))
    GTEST_SKIP() << "SKIPPED: no parity fixtures at " << tiny_target_dir();
  auto o = options(-1, false, 11);
  drafter_engine e(o);
  EXPECT_EQ(e.group_world(), 1);
  try {
    e.join_group(std::vector<uint8_t>(nccl::unique_id_size), 0, 2, 1s);
    ADD_FAILURE() << "join_group on the CPU must throw";
  } catch (const error& err) {
    EXPECT_EQ(err.code(), tandem::errc::bad_input);
    EXPECT_NE(std::string(err.what()).find("CUDA device"), std::string::npos) << err.what();
  }
  EXPECT_TRUE(e.leave_group(1s)) << "no group: nothing to leave";
}
