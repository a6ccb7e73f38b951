// Drafter protocol (messages/drafter.hpp): the real drafter actor of
// actors/drafter.cpp, scheduled on CAF's deterministic test coordinator,
// training a 1-layer DFlash drafter against the parity fixtures' tiny
// Qwen3 on the CPU.  Work items (a real staged batch and the target
// engine's real features) become step reports to the coordinator; snapshot
// requests are answered with a descriptor the requester owns; injected
// faults (fault_plan, as `--fault` sets up) end the actor with an error
// naming the step or report a non-finite step; restore continues a
// checkpoint's step.
#define CAF_SUITE drafter_protocol

#include <thread>

#include "workers.hpp"  // before dsl.hpp (its `inject` macro)

#include "dsl.hpp"

using namespace tandem;
using namespace tandem::test;

namespace {

struct fixture : worker_fixture_base, test_coordinator_fixture<config> {
  coordinator_actor coord = sys.spawn(recording_coordinator, log);
  gpu::prefetch_engine staging{prefetch_options(dataset)};
  gpu::target_engine target{target_options()};
  std::vector<uint64_t> to_release;

  fixture() : worker_fixture_base(8) {
    staging.start_epoch(0);
  }

  ~fixture() override {
    caf::anon_send_exit(coord, caf::exit_reason::kill);
    for (auto h : to_release)
      gpu::transport::release(h);
  }

  drafter_actor spawn(std::string restore_from = "", std::shared_ptr<fault_plan> faults = nullptr) {
    return spawn_drafter<caf::no_spawn_options>(sys, 0, drafter_options(), std::move(restore_from),
                                                coord, std::move(faults));
  }

  /// A real batch and its real features, as the coordinator routes them.
  work_item next_item(int64_t id) {
    auto b = staging.next();
    CAF_REQUIRE(b.has_value());
    work_item w;
    w.batch.batch_id = id;
    w.batch.sample_ids = b->sample_ids;
    w.batch.rows = b->rows;
    w.batch.seq_len = b->seq_len;
    w.batch.real_tokens = b->real_tokens;
    w.batch.handle = b->handle;
    w.features.batch_id = id;
    w.features.handle = target.forward(b->handle);
    to_release.push_back(w.batch.handle);
    to_release.push_back(w.features.handle);
    return w;
  }

  static std::shared_ptr<fault_plan> one_fault(const std::string& kind, int64_t at_step) {
    auto plan = std::make_shared<fault_plan>();
    auto e = std::make_unique<fault_plan::entry>();
    e->drafter = 0;
    e->kind = kind;
    e->at_step = at_step;
    plan->entries.push_back(std::move(e));
    return plan;
  }
};

} // namespace

CAF_TEST_FIXTURE_SCOPE(drafter_protocol_tests, fixture)

CAF_TEST(a work item is trained and reported to the coordinator) {
  auto d = spawn();
  run();  // the engine is built inside the behaviour
  auto item = next_item(7);
  auto item2 = next_item(8);
  const auto live = gpu::transport::live_handles();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // idle before the work arrives
  self->send(d, item);
  expect((work_item), from(self).to(d).with(item));
  expect((step_report), from(d).to(coord));
  CAF_REQUIRE_EQUAL(log->reports.size(), 1u);
  const auto& r = log->reports[0];
  CAF_CHECK_EQUAL(r.drafter, 0);
  CAF_CHECK_EQUAL(r.step, 1);
  CAF_CHECK_EQUAL(r.batch_id, 7);
  CAF_CHECK(r.finite);
  CAF_CHECK(std::isfinite(r.loss) && r.loss > 0);
  CAF_CHECK(r.accuracy >= 0 && r.accuracy <= 1);
  CAF_CHECK_GREATER(r.grad_norm, 0.0);
  CAF_CHECK_GREATER(r.lr, 0.0);
  CAF_CHECK_GREATER(r.scored_tokens, 0);
  CAF_CHECK_EQUAL(r.real_tokens, item.batch.real_tokens);
  CAF_CHECK_GREATER(r.compute_ms, 0.0);
  CAF_CHECK_GREATER_OR_EQUAL(r.wait_ms, 30.0);
  // The drafter only reads the payloads; their owners free them.
  CAF_CHECK_EQUAL(gpu::transport::live_handles(), live);
  // The next item was already there: its wait is the gap between the two
  // (the scheduler's), not the step before it.
  self->send(d, item2);
  run();
  CAF_REQUIRE_EQUAL(log->reports.size(), 2u);
  CAF_CHECK_EQUAL(log->reports[1].step, 2);
  CAF_CHECK_LESS(log->reports[1].wait_ms, 30.0);
  self->send(d, shutdown_atom::value);
  run();
}

CAF_TEST(a snapshot request is answered with a descriptor the requester owns) {
  auto d = spawn();
  self->send(d, next_item(1));
  run();
  const auto live = gpu::transport::live_handles();
  auto a = ask<snapshot_desc>(sys, d, snapshot_atom::value);
  run();
  CAF_REQUIRE(a->value.has_value());
  CAF_CHECK_EQUAL(a->value->drafter, 0);
  CAF_CHECK_EQUAL(a->value->step, 1);
  CAF_CHECK(a->value->handle != 0);
  CAF_CHECK_EQUAL(gpu::transport::live_handles(), live + 1);
  CAF_CHECK(gpu::transport::release(a->value->handle));
  self->send(d, shutdown_atom::value);
  run();
}

CAF_TEST(an injected throw ends the drafter with device_failure naming the step) {
  auto plan = one_fault("throw", 2);
  auto d = spawn("", plan);
  auto ex = watch(sys, d);
  self->send(d, next_item(1));
  self->send(d, next_item(2));
  run();
  CAF_REQUIRE_EQUAL(log->reports.size(), 1u);  // step 1 only
  CAF_REQUIRE_EQUAL(ex->reasons.size(), 1u);
  CAF_CHECK(is(ex->reasons[0], errc::device_failure));
  auto text = sys.render(ex->reasons[0]);
  CAF_MESSAGE(text);
  CAF_CHECK(contains(text, "step 2"));
  CAF_CHECK(plan->entries[0]->fired);
  // It fires once per run: the next incarnation trains step 2.
  auto d2 = spawn("", plan);
  self->send(d2, next_item(3));
  run();
  CAF_CHECK_EQUAL(log->reports.size(), 2u);
  self->send(d2, shutdown_atom::value);
  run();
}

CAF_TEST(an injected nan is reported as a non-finite step without an update) {
  auto d = spawn("", one_fault("nan", 1));
  self->send(d, next_item(1));
  self->send(d, next_item(2));
  run();
  CAF_REQUIRE_EQUAL(log->reports.size(), 2u);
  CAF_CHECK(!log->reports[0].finite);
  CAF_CHECK_EQUAL(log->reports[0].step, 0);  // nothing applied
  CAF_CHECK(log->reports[1].finite);
  CAF_CHECK_EQUAL(log->reports[1].step, 1);
  self->send(d, shutdown_atom::value);
  run();
}

CAF_TEST(a drafter restored from a checkpoint continues from its step) {
  // Two steps on an engine, written as the checkpointer would.
  gpu::drafter_engine e(drafter_options());
  for (int64_t i = 0; i < 2; ++i) {
    auto w = next_item(i);
    (void)e.train_step(w.batch.handle, w.features.handle);
  }
  auto snap = e.snapshot();
  gpu::write_checkpoint(snap, tmp.dir / "ck", "{}");
  gpu::transport::release(snap);
  auto d = spawn((tmp.dir / "ck").string());
  auto a = ask<snapshot_desc>(sys, d, snapshot_atom::value);
  run();
  CAF_REQUIRE(a->value.has_value());
  CAF_CHECK_EQUAL(a->value->step, 2);
  gpu::transport::release(a->value->handle);
  self->send(d, next_item(5));
  run();
  CAF_REQUIRE_EQUAL(log->reports.size(), 1u);
  CAF_CHECK_EQUAL(log->reports[0].step, 3);
  self->send(d, shutdown_atom::value);
  run();
}

CAF_TEST(a checkpoint that does not load ends the drafter with bad_input naming it) {
  auto d = spawn((tmp.dir / "no_such_checkpoint").string());
  auto ex = watch(sys, d);
  run();
  CAF_REQUIRE_EQUAL(ex->reasons.size(), 1u);
  CAF_CHECK(is(ex->reasons[0], errc::bad_input));
  auto text = sys.render(ex->reasons[0]);
  CAF_MESSAGE(text);
  CAF_CHECK(contains(text, "drafter 0"));
  CAF_CHECK(contains(text, "no_such_checkpoint"));
}

CAF_TEST(a payload that does not fit ends the drafter with an error naming the step) {
  auto d = spawn();
  auto ex = watch(sys, d);
  auto item = next_item(1);
  item.features.handle = item.batch.handle;  // a batch where features belong
  self->send(d, item);
  run();
  CAF_CHECK(log->reports.empty());
  CAF_REQUIRE_EQUAL(ex->reasons.size(), 1u);
  CAF_CHECK(is(ex->reasons[0], errc::bad_input));
  auto text = sys.render(ex->reasons[0]);
  CAF_MESSAGE(text);
  CAF_CHECK(contains(text, "step 1"));
}

CAF_TEST(an unexpected message is answered with unexpected_message) {
  auto d = spawn();
  auto a = ask<std::string>(sys, caf::actor_cast<caf::actor>(d), std::string("train"));
  run();
  CAF_REQUIRE(a->error.has_value());
  CAF_CHECK(is(*a->error, errc::unexpected_message));
  self->send(d, shutdown_atom::value);
  run();
}

CAF_TEST(shutdown ends the drafter) {
  auto d = spawn();
  auto ex = watch(sys, d);
  run();
  self->send(d, shutdown_atom::value);
  run();
  CAF_REQUIRE_EQUAL(ex->reasons.size(), 1u);
  CAF_CHECK(ex->reasons[0] == caf::exit_reason::normal);
}

CAF_TEST_FIXTURE_SCOPE_END()
