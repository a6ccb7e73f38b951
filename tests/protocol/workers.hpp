#pragma once
/// The worker suites' fixture (prefetch, target, drafter, checkpointer):
/// the real actors of actors/{prefetch,target,drafter,checkpointer}.cpp
/// spawned *scheduled* (`spawn_*<caf::no_spawn_options>`), so that the deterministic scheduler
/// drives them and their CPU engines run on the test thread, next to a
/// recording coordinator.  Real engines through their torch-free facades:
/// the tiny Qwen3 of the parity fixtures (tests/parity/FIXTURES.md) as the
/// target, and a small dataset written by support.hpp.
///
/// Include this before dsl.hpp: the DSL's `inject` macro would rewrite
/// gpu::drafter_engine::inject.

#include "actors/spawn.hpp"
#include "gpu/engine/drafter_engine.hpp"
#include "gpu/engine/prefetch_engine.hpp"
#include "gpu/engine/target_engine.hpp"
#include "gpu/transport/transport.hpp"
#include "support.hpp"

namespace tandem::test {

inline fs::path fixtures_dir() {
  return fs::path(TANDEM_FIXTURES_DIR);
}

/// V 512, D 64, 8 layers; default taps 1..5, so features are [B, S, 5·64].
inline fs::path tiny_target() {
  return fixtures_dir() / "qwen3_tiny";
}

inline gpu::prefetch_engine_options prefetch_options(const fs::path& dataset) {
  gpu::prefetch_engine_options o;
  o.dataset = dataset;
  o.device = -1;
  o.rows = 1;
  o.seq_len = 256;
  o.max_docs = 8;
  o.lookahead = 8;
  o.seed = 3;
  return o;
}

inline gpu::target_engine_options target_options() {
  gpu::target_engine_options o;
  o.dir = tiny_target();
  o.device = -1;
  return o;
}

/// As tests/unit/engine_test.cpp's drafter and the runtime test's config.
inline gpu::drafter_engine_options drafter_options() {
  gpu::drafter_engine_options o;
  o.target_dir = tiny_target();
  o.device = -1;
  o.layers = 1;
  o.block_size = 8;
  o.mask_token_id = 511;
  o.anchors = 8;
  o.chunk_rows = 48;
  o.seed = 7;
  o.lr = 3e-3;
  o.total_steps = 10;
  return o;
}

/// What every worker suite's fixture holds besides CAF's deterministic
/// test fixture: a scratch folder, a dataset of `dataset_samples` samples in
/// it, the recording coordinator's log, and the transport's handle count at
/// the start (for leak checks).
struct worker_fixture_base {
  scratch tmp;
  fs::path dataset = tmp.dir / "data";
  std::shared_ptr<coordinator_log> log = std::make_shared<coordinator_log>();
  size_t handles_at_start = gpu::transport::live_handles();

  explicit worker_fixture_base(int64_t dataset_samples = 24) {
    write_dataset(dataset, dataset_samples);
  }
};

} // namespace tandem::test
