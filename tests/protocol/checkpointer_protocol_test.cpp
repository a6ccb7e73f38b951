// Checkpointer protocol (messages/checkpointer.hpp): the real checkpointer
// actor of actors/checkpointer.cpp, scheduled on CAF's deterministic test
// coordinator, writing into a scratch folder on the CPU.  The snapshots are
// real (a 1-layer DFlash drafter engine over the parity fixtures' tiny
// Qwen3, through its torch-free facade).  A write is answered with its
// folder, holds the runtime's JSON verbatim, releases the snapshot, and
// keeps only the newest `keep`; a failed write is answered with bad_input
// naming the folder and the checkpointer carries on.
#define CAF_SUITE checkpointer_protocol

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

CAF_TEST_FIXTURE_SCOPE_END()
