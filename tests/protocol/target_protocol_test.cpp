// Target protocol (messages/target.hpp): the real target actor of
// actors/target.cpp, scheduled on CAF's deterministic test coordinator,
// running the parity fixtures' tiny Qwen3 on the CPU.  A batch staged by a
// real prefetch engine becomes a work item whose features descriptor names
// the taps behind its handle; `release` frees them; failures end the actor
// with an error naming the batch (its watcher, the supervisor of
// actors/supervisor.cpp, escalates it).
#define CAF_SUITE target_protocol

#include "workers.hpp"  // before dsl.hpp (its `inject` macro)

#include "dsl.hpp"
#include "gpu/transport/link.hpp"

using namespace tandem;
using namespace tandem::test;

namespace {

struct fixture : worker_fixture_base, test_coordinator_fixture<config> {
  coordinator_actor coord = sys.spawn(recording_coordinator, log);
  gpu::prefetch_engine staging{prefetch_options(dataset)};

  fixture() : worker_fixture_base(8) {
    staging.start_epoch(0);
  }

  ~fixture() override {
    caf::anon_send_exit(coord, caf::exit_reason::kill);
    // The work items name their target (features.producer, a strong handle):
    // dropped here, so a target the test did not shut down can end.
    log->work.clear();
  }

  /// A real staged batch, as a prefetch actor would describe it.
  batch_desc next_batch(int64_t id) {
    auto b = staging.next();
    CAF_REQUIRE(b.has_value());
    batch_desc d;
    d.batch_id = id;
    d.epoch = 0;
    d.source = 1;
    d.sample_ids = b->sample_ids;
    d.rows = b->rows;
    d.seq_len = b->seq_len;
    d.real_tokens = b->real_tokens;
    d.handle = b->handle;
    return d;
  }
};

} // namespace

CAF_TEST_FIXTURE_SCOPE(target_protocol_tests, fixture)

CAF_TEST(a batch becomes a work item with its features for the coordinator) {
  auto t = spawn_target<caf::no_spawn_options>(sys, 1, target_options(), coord);
  auto batch = next_batch(7);
  const auto live = gpu::transport::live_handles();
  self->send(t, batch);
  expect((batch_desc), from(self).to(t).with(batch));
  expect((work_item), from(t).to(coord));
  run();
  CAF_REQUIRE_EQUAL(log->work.size(), 1u);
  const auto& w = log->work[0];
  CAF_CHECK(w.batch == batch);  // passed on untouched, batch handle included
  CAF_CHECK_EQUAL(w.features.batch_id, 7);
  CAF_CHECK_EQUAL(w.features.target, 1);
  CAF_CHECK(w.features.handle != 0 && w.features.handle != batch.handle);
  CAF_CHECK(w.features.shape == (std::vector<int64_t>{1, 256, 5 * 64}));
  CAF_CHECK_EQUAL(w.features.where.device, -1);
  CAF_CHECK_GREATER(w.features.forward_ms, 0.0);
  // Where a drafter in another process pulls them from (an NCCL link).
  CAF_CHECK(w.features.producer == caf::actor_cast<caf::actor>(t));
  CAF_CHECK_EQUAL(w.features.host, gpu::transport::host_identity());
  // The features are published; the batch is still the prefetch's.
  CAF_CHECK_EQUAL(gpu::transport::live_handles(), live + 1);
  self->send(t, release_atom::value, w.features.handle);
  run();
  CAF_CHECK_EQUAL(gpu::transport::live_handles(), live);
  CAF_CHECK(!gpu::transport::release(w.features.handle));  // already freed
  CAF_CHECK(gpu::transport::release(batch.handle));        // never touched by the target
  self->send(t, shutdown_atom::value);
  run();
}

CAF_TEST(batches are answered in order one work item each) {
  auto t = spawn_target<caf::no_spawn_options>(sys, 0, target_options(), coord);
  std::vector<batch_desc> sent;
  for (int64_t id = 10; id < 13; ++id) {
    sent.push_back(next_batch(id));
    self->send(t, sent.back());
  }
  run();
  CAF_REQUIRE_EQUAL(log->work.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    CAF_CHECK_EQUAL(log->work[i].features.batch_id, sent[i].batch_id);
    self->send(t, release_atom::value, log->work[i].features.handle);
    gpu::transport::release(sent[i].handle);
  }
  run();
  CAF_CHECK_EQUAL(gpu::transport::live_handles(), handles_at_start);
}

CAF_TEST(the target counts what it handled and reports its forward times as vitals) {
  auto t = spawn_target<caf::no_spawn_options>(sys, 2, target_options(), coord);
  std::vector<batch_desc> sent;
  for (int64_t id = 20; id < 22; ++id) {
    sent.push_back(next_batch(id));
    self->send(t, sent.back());
  }
  run();
  CAF_REQUIRE_EQUAL(log->work.size(), 2u);
  self->send(t, release_atom::value, log->work[0].features.handle);
  run();
  auto a = ask<actor_vitals>(sys, t, vitals_atom::value);
  run();
  CAF_REQUIRE(a->value.has_value());
  const auto& v = *a->value;
  CAF_CHECK_EQUAL(v.role, "target");
  CAF_CHECK_EQUAL(v.index, 2);
  CAF_CHECK_EQUAL(v.actor_id, t->id());
  CAF_CHECK(v.answered);
  CAF_CHECK(!v.own_thread);  // scheduled here; detached in production
  CAF_CHECK_GREATER(v.thread, 0);
  CAF_CHECK_EQUAL(v.handled, 4u);  // two batches, one release, this request
  CAF_CHECK_EQUAL(v.last_message, "release");
  CAF_CHECK_GREATER_OR_EQUAL(v.uptime_s, 0.0);
  auto f = figures_of(v);
  CAF_CHECK_EQUAL(f["batches"], 2.0);
  CAF_CHECK_GREATER(f["forward_ms_mean"], 0.0);
  CAF_CHECK_EQUAL(f["forward_ms_last"], log->work[1].features.forward_ms);
  CAF_CHECK(f.count("queue_depth") == 1);
  CAF_CHECK_GREATER_OR_EQUAL(v.busiest_ms, log->work[0].features.forward_ms);
  self->send(t, release_atom::value, log->work[1].features.handle);
  for (auto& b : sent)
    gpu::transport::release(b.handle);
  self->send(t, shutdown_atom::value);
  run();
}

CAF_TEST(an unknown batch handle ends the target with an error naming the batch) {
  auto t = spawn_target<caf::no_spawn_options>(sys, 1, target_options(), coord);
  auto ex = watch(sys, t);
  batch_desc b;
  b.batch_id = 42;
  b.rows = 1;
  b.seq_len = 256;
  b.handle = 987654321;
  self->send(t, b);
  run();
  CAF_CHECK(log->work.empty());
  CAF_REQUIRE_EQUAL(ex->reasons.size(), 1u);
  // The engine's own code (since issue 19: a target's failure keeps it, so
  // that out-of-memory for these shapes is bad_input): transport's unknown
  // handle is bad input, not a device failure.
  CAF_CHECK(is(ex->reasons[0], errc::bad_input));
  auto text = sys.render(ex->reasons[0]);
  CAF_MESSAGE(text);
  CAF_CHECK(contains(text, "target 1, batch 42"));
  CAF_CHECK(contains(text, "987654321"));
}

CAF_TEST(a target whose weights do not load ends with bad_input naming them) {
  auto o = target_options();
  o.dir = tmp.dir / "no_such_model";
  auto t = spawn_target<caf::no_spawn_options>(sys, 3, o, coord);
  auto ex = watch(sys, t);
  run();
  CAF_REQUIRE_EQUAL(ex->reasons.size(), 1u);
  CAF_CHECK(is(ex->reasons[0], errc::bad_input));
  auto text = sys.render(ex->reasons[0]);
  CAF_MESSAGE(text);
  CAF_CHECK(contains(text, "target 3"));
  CAF_CHECK(contains(text, "no_such_model"));
}

CAF_TEST(a truncated target file ends the target with bad_input naming it; a missing GPU is not bad input) {
  // Issue 19: bad_input means deterministic (the supervisor never retries
  // it), so the target keeps the engine's own code: a truncated weights
  // file is bad input, a GPU this host does not have is device_unavailable.
  const auto dir = tmp.dir / "truncated_target";
  fs::create_directories(dir);
  fs::copy_file(tiny_target() / "config.json", dir / "config.json");
  const auto weights = tiny_target() / "model.safetensors";
  fs::copy_file(weights, dir / "model.safetensors");
  fs::resize_file(dir / "model.safetensors", fs::file_size(weights) / 2);
  auto o = target_options();
  o.dir = dir;
  auto t = spawn_target<caf::no_spawn_options>(sys, 2, o, coord);
  auto ex = watch(sys, t);
  run();
  CAF_REQUIRE_EQUAL(ex->reasons.size(), 1u);
  CAF_CHECK(is(ex->reasons[0], errc::bad_input));
  auto text = sys.render(ex->reasons[0]);
  CAF_MESSAGE(text);
  CAF_CHECK(contains(text, "target 2"));
  CAF_CHECK(contains(text, (dir / "model.safetensors").string()));
  CAF_CHECK(contains(text, "truncated"));

  o = target_options();
  o.device = 64;  // no host has it
  auto g = spawn_target<caf::no_spawn_options>(sys, 4, o, coord);
  auto gone = watch(sys, g);
  run();
  CAF_REQUIRE_EQUAL(gone->reasons.size(), 1u);
  CAF_CHECK(is(gone->reasons[0], errc::device_unavailable));
  CAF_MESSAGE(sys.render(gone->reasons[0]));
  CAF_CHECK(log->work.empty());
}

CAF_TEST(an unexpected message is answered with unexpected_message) {
  auto t = spawn_target<caf::no_spawn_options>(sys, 0, target_options(), coord);
  auto a = ask<std::string>(sys, caf::actor_cast<caf::actor>(t), int32_t{5});
  run();
  CAF_REQUIRE(a->error.has_value());
  CAF_CHECK(is(*a->error, errc::unexpected_message));
  self->send(t, shutdown_atom::value);
  run();
}

CAF_TEST(shutdown ends the target) {
  auto t = spawn_target<caf::no_spawn_options>(sys, 0, target_options(), coord);
  auto ex = watch(sys, t);
  run();
  self->send(t, shutdown_atom::value);
  run();
  CAF_REQUIRE_EQUAL(ex->reasons.size(), 1u);
  CAF_CHECK(ex->reasons[0] == caf::exit_reason::normal);
}

CAF_TEST_FIXTURE_SCOPE_END()
