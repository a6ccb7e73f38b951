// Checkpointer protocol (messages/checkpointer.hpp): the real checkpointer
// actor of actors/checkpointer.cpp, scheduled on CAF's deterministic test
// coordinator, writing into a scratch folder on the CPU.  The snapshots are
// real (a 1-layer DFlash drafter engine over the parity fixtures' tiny
// Qwen3, through its torch-free facade).  A write is answered with its
// folder, holds the runtime's JSON verbatim, releases the snapshot, and
// keeps only the newest `keep`; a failed write is answered with bad_input
// naming the folder and the checkpointer carries on.  The cluster's
// checkpoint router hands each snapshot to its drafter's checkpointer and
// answers a write lost with its node with node_lost_prefix's error.
#define CAF_SUITE checkpointer_protocol

#include "actors/cluster.hpp"
#include "workers.hpp"  // before dsl.hpp (its `inject` macro)

#include "dsl.hpp"

using namespace tandem;
using namespace tandem::test;

namespace {

struct fixture : worker_fixture_base, test_coordinator_fixture<config> {
  gpu::drafter_engine engine{drafter_options()};
  fs::path dir = tmp.dir / "checkpoints";

  fixture() : worker_fixture_base(1) {}

  checkpointer_actor spawn(int keep = 3) {
    return spawn_checkpointer<caf::no_spawn_options>(sys, dir, keep);
  }

  /// Writes a fresh snapshot as step `step`; returns the answer.
  std::shared_ptr<answer<std::string>> write(checkpointer_actor c, int64_t step,
                                             const std::string& extra) {
    snapshot_desc snap{0, step, engine.snapshot()};
    auto a = ask<std::string>(sys, c, snap, extra);
    run();
    return a;
  }
};

} // namespace

CAF_TEST_FIXTURE_SCOPE(checkpointer_protocol_tests, fixture)

CAF_TEST(a snapshot is written as step-k and answered with its folder) {
  auto c = spawn();
  const auto extra = std::string(R"({"ledger":{"epoch":0},"step":7})");
  auto a = write(c, 7, extra);
  CAF_REQUIRE(a->value.has_value());
  CAF_CHECK_EQUAL(*a->value, (dir / "step-00000007").string());
  CAF_CHECK(fs::is_regular_file(dir / "step-00000007" / "state.json"));
  CAF_CHECK(fs::is_regular_file(dir / "step-00000007" / "weights.safetensors"));
  CAF_CHECK(fs::is_regular_file(dir / "step-00000007" / "optimizer.safetensors"));
  CAF_CHECK(!fs::exists(dir / "step-00000007.tmp"));
  CAF_CHECK_EQUAL(gpu::read_checkpoint_extra(dir / "step-00000007"), extra);
  // The checkpointer released the snapshot it was handed.
  CAF_CHECK_EQUAL(gpu::transport::live_handles(), handles_at_start);
  self->send(c, shutdown_atom::value);
  run();
}

CAF_TEST(only the newest keep checkpoints stay) {
  auto c = spawn(2);
  for (int64_t step : {10, 20, 30}) {
    auto a = write(c, step, "{}");
    CAF_CHECK(a->value.has_value());
  }
  CAF_CHECK(!fs::exists(dir / "step-00000010"));
  CAF_CHECK(fs::exists(dir / "step-00000020"));
  CAF_CHECK(fs::exists(dir / "step-00000030"));
  self->send(c, shutdown_atom::value);
  run();
}

CAF_TEST(a failed write is answered with bad_input naming the folder and the checkpointer carries on) {
  auto c = spawn();
  snapshot_desc unknown{0, 5, 987654321};  // no such snapshot
  auto a = ask<std::string>(sys, c, unknown, std::string("{}"));
  run();
  CAF_REQUIRE(a->error.has_value());
  CAF_CHECK(is(*a->error, errc::bad_input));
  auto text = sys.render(*a->error);
  CAF_MESSAGE(text);
  CAF_CHECK(contains(text, "step-00000005"));
  CAF_CHECK(!fs::exists(dir / "step-00000005"));
  // Still there for the next one.
  auto b = write(c, 6, "{}");
  CAF_REQUIRE(b->value.has_value());
  CAF_CHECK(fs::exists(dir / "step-00000006"));
  CAF_CHECK_EQUAL(gpu::transport::live_handles(), handles_at_start);
  self->send(c, shutdown_atom::value);
  run();
}

CAF_TEST(an unexpected message is answered with unexpected_message) {
  auto c = spawn();
  auto a = ask<std::string>(sys, caf::actor_cast<caf::actor>(c), snapshot_desc{});
  run();
  CAF_REQUIRE(a->error.has_value());
  CAF_CHECK(is(*a->error, errc::unexpected_message));
  CAF_CHECK(contains(sys.render(*a->error), "tandem.checkpointer cannot handle"));
  self->send(c, shutdown_atom::value);
  run();
}

CAF_TEST(shutdown ends the checkpointer) {
  auto c = spawn();
  auto ex = watch(sys, c);
  run();
  self->send(c, shutdown_atom::value);
  expect((shutdown_atom), from(self).to(c));
  run();
  CAF_REQUIRE_EQUAL(ex->reasons.size(), 1u);
  CAF_CHECK(ex->reasons[0] == caf::exit_reason::normal);
}

CAF_TEST(the checkpoint router answers with the node checkpointer answer or with its loss when it dies mid-write) {
  // A node's checkpointer that never answers (its node is about to be
  // lost); the router's request must not hang on it (CAF 0.17 never
  // answers a request to a remote actor that is gone).
  auto silent = sys.spawn([](checkpointer_actor::pointer me) -> checkpointer_actor::behavior_type {
    return {
      [me](const snapshot_desc&, const std::string&) -> caf::result<std::string> {
        return me->make_response_promise<std::string>();  // never delivered
      },
      [me](shutdown_atom) { me->quit(); },
      [](vitals_atom) { return actor_vitals{}; },
    };
  });
  auto local = spawn();
  auto router = spawn_checkpoint_router(sys, {local, silent}, {"", "gpu-b"}, 0, caf::actor{});
  sched.run();  // messages only: the 30 min write deadline never fires here
  // Drafter 0's snapshot goes to this process's checkpointer.
  snapshot_desc snap0{0, 3, engine.snapshot()};
  auto a = ask<std::string>(sys, router, snap0, std::string(R"({"step":3})"));
  sched.run();
  CAF_REQUIRE(a->value.has_value());
  CAF_CHECK_EQUAL(*a->value, (dir / "step-00000003").string());
  // Drafter 1's goes to gpu-b's, which dies before answering.
  snapshot_desc snap1{1, 4, 0};
  auto b = ask<std::string>(sys, router, snap1, std::string(R"({"step":4})"));
  sched.run();
  CAF_CHECK(!b->value && !b->error);  // waiting
  caf::anon_send_exit(silent, caf::exit_reason::remote_link_unreachable);
  sched.run();
  CAF_REQUIRE(b->error.has_value());
  const auto text = sys.render(*b->error);
  CAF_MESSAGE(text);
  CAF_CHECK(contains(text, node_lost_prefix));
  CAF_CHECK(contains(text, "gpu-b"));
  // No door: the next snapshot of drafter 1 has no checkpointer and says so.
  auto c = ask<std::string>(sys, router, snap1, std::string(R"({"step":4})"));
  sched.run();
  CAF_REQUIRE(c->error.has_value());
  CAF_CHECK(contains(sys.render(*c->error), "checkpointer is gone"));
  self->send(router, shutdown_atom::value);
  sched.run();
}

CAF_TEST_FIXTURE_SCOPE_END()
