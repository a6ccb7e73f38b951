// Supervisor protocol (messages/supervisor.hpp): the real supervisor of
// actors/supervisor.cpp on CAF's deterministic scheduler, with a recording
// coordinator (support.hpp) and idle drafter and worker stand-ins.  A drafter's death is
// reported, not restarted; a restart request kills a live incarnation (whose
// death is then not reported), waits its backoff on the deterministic
// clock, spawns from the named checkpoint and announces the new incarnation;
// the budget counts failures within window_s and refuses past it with a
// report; a drafter that ended with errc::bad_input (deterministic: a
// truncated target file) is refused its restart at once; the other workers'
// deaths are escalated; after shutdown nothing happens.  A target or
// prefetch that dies is reported (worker_down) and restarted when asked,
// under the same budget; one that ends with bad input is escalated.  (The coordinator's side, with this supervisor in the loop, is
// coordinator_protocol_test.cpp.)
#define CAF_SUITE supervisor_protocol

#include <algorithm>
#include <utility>

#include "actors/spawn.hpp"
#include "messages/node.hpp"
#include "support.hpp"

#include "dsl.hpp"

using namespace tandem;
using namespace tandem::test;
using namespace std::chrono_literals;

namespace {

/// A drafter that only exists: the supervisor watches, kills and replaces it.
drafter_actor::behavior_type idle_drafter(drafter_actor::pointer self) {
  return {
    [](work_item&) {},
    [](group_id_atom) { return std::vector<uint8_t>{}; },
    [](group_spec&) { return int64_t{0}; },
    [](snapshot_atom) -> caf::result<snapshot_desc> {
      return make_error(errc::unexpected_message, "idle drafter: no snapshots");
    },
    [](heartbeat_atom) { return int64_t{0}; },
    [self](shutdown_atom) { self->quit(); },
    [](snapshot_poll_atom) {},
    [](fault_atom, const std::string&, int64_t) {},
    [](vitals_atom) { return actor_vitals{}; },
  };
}

/// Ends `h` with `why` as its exit reason (what an exception in a real
/// worker's handler does); caf::anon_send_exit takes only exit_reason codes.
template <class Handle>
void end_with(const Handle& h, caf::error why) {
  auto ptr = caf::actor_cast<caf::strong_actor_ptr>(h);
  ptr->enqueue(nullptr, caf::make_message_id(),
               caf::make_message(caf::exit_msg{ptr->address(), std::move(why)}), nullptr);
}

struct fixture : test_coordinator_fixture<config> {
  std::shared_ptr<coordinator_log> log = std::make_shared<coordinator_log>();
  coordinator_actor coord = sys.spawn(recording_coordinator, log);
  std::vector<std::pair<int32_t, std::string>> respawns;  ///< (index, checkpoint) asked of the spawner
  int worker_respawns = 0;                                ///< targets and prefetches spawned again
  supervisor_actor sup;
  coordinator_peers peers;
  std::vector<caf::actor> everyone;

  fixture() {
    sys.await_actors_before_shutdown(false);
  }

  ~fixture() override {
    for (auto& a : everyone)
      caf::anon_send_exit(a, caf::exit_reason::kill);
    for (auto& [d, h] : log->up)
      caf::anon_send_exit(h, caf::exit_reason::kill);
    sched.run();
  }

  supervisor_options options(int64_t budget = 3, std::vector<double> backoff = {0.5},
                             double window_s = 600) {
    supervisor_options o;
    o.restart_budget = budget;
    o.backoff_s = std::move(backoff);
    o.window_s = window_s;
    o.respawn_drafter = [this](int32_t index, const std::string& from) {
      respawns.emplace_back(index, from);
      return drafter_actor{sys.spawn(idle_drafter)};
    };
    auto sink = [](caf::event_based_actor*) -> caf::behavior { return {[](caf::ok_atom) {}}; };
    o.respawn_target = [this, sink](int32_t) {
      ++worker_respawns;
      auto a = sys.spawn(sink);
      everyone.push_back(a);
      return caf::actor_cast<target_actor>(a);
    };
    o.respawn_prefetch = [this, sink](int32_t) {
      ++worker_respawns;
      auto a = sys.spawn(sink);
      everyone.push_back(a);
      return caf::actor_cast<prefetch_actor>(a);
    };
    return o;
  }

  /// A supervisor watching `drafters` idle drafters and one idle stand-in
  /// for every other worker.
  void start(supervisor_options o, int drafters = 2) {
    sup = spawn_supervisor(sys, std::move(o));
    everyone.push_back(caf::actor_cast<caf::actor>(sup));
    for (int d = 0; d < drafters; ++d) {
      peers.drafters.push_back(sys.spawn(idle_drafter));
      everyone.push_back(caf::actor_cast<caf::actor>(peers.drafters.back()));
    }
    auto sink = [](caf::event_based_actor*) -> caf::behavior { return {[](caf::ok_atom) {}}; };
    auto stand_in = [&]() {
      auto a = sys.spawn(sink);
      everyone.push_back(a);
      return a;
    };
    peers.targets.push_back(caf::actor_cast<target_actor>(stand_in()));
    peers.prefetch.push_back(caf::actor_cast<prefetch_actor>(stand_in()));
    peers.checkpointer = caf::actor_cast<checkpointer_actor>(stand_in());
    peers.metrics = caf::actor_cast<metrics_actor>(stand_in());
    caf::anon_send(sup, supervise_atom::value, coord, peers);
    sched.run();
  }

  std::shared_ptr<answer<restart_plan>> restart(int32_t d, std::string why, std::string from) {
    auto a = ask<restart_plan>(sys, sup, restart_atom::value, d, std::move(why), std::move(from));
    sched.run();
    return a;
  }
};

} // namespace

CAF_TEST_FIXTURE_SCOPE(supervisor_protocol_tests, fixture)

CAF_TEST(a drafter that dies is reported and restarted only when the coordinator asks) {
  start(options());
  auto gone = watch(sys, peers.drafters[1]);
  end_with(peers.drafters[1], make_error(errc::device_failure, "CUDA error: boom"));
  sched.run();
  CAF_REQUIRE_EQUAL(gone->reasons.size(), 1u);
  CAF_REQUIRE_EQUAL(log->down.size(), 1u);
  CAF_CHECK_EQUAL(log->down[0].first, 1);
  CAF_CHECK(contains(log->down[0].second, "CUDA error: boom"));
  advance_time(10s);
  sched.run();
  CAF_CHECK(respawns.empty());  // no restart without the coordinator's request
  // The request: counted, answered with the plan, respawned after the backoff.
  auto plan = restart(1, "drafter 1 died", "ckpt/step-4");
  CAF_REQUIRE(plan->value.has_value());
  CAF_CHECK_EQUAL(plan->value->restart, 1);
  CAF_CHECK_EQUAL(plan->value->budget, 3);
  CAF_CHECK_EQUAL(plan->value->backoff_s, 0.5);
  advance_time(499ms);
  sched.run();
  CAF_CHECK(respawns.empty());
  advance_time(1ms);
  sched.run();
  CAF_REQUIRE_EQUAL(respawns.size(), 1u);
  CAF_CHECK_EQUAL(respawns[0].first, 1);
  CAF_CHECK_EQUAL(respawns[0].second, "ckpt/step-4");
  CAF_REQUIRE_EQUAL(log->up.size(), 1u);
  CAF_CHECK_EQUAL(log->up[0].first, 1);
  CAF_CHECK(log->up[0].second != peers.drafters[1]);
  // The new incarnation is watched like the first.
  end_with(log->up[0].second, make_error(errc::device_failure, "again"));
  sched.run();
  CAF_REQUIRE_EQUAL(log->down.size(), 2u);
  CAF_CHECK_EQUAL(log->down[1].first, 1);
  CAF_CHECK(contains(log->down[1].second, "again"));
  CAF_CHECK(log->escalated.empty());
}

CAF_TEST(a restart kills a live incarnation without reporting its death) {
  start(options());
  auto gone = watch(sys, peers.drafters[0]);
  auto plan = restart(0, "drafter 0: non-finite loss at step 3", "");
  CAF_REQUIRE(plan->value.has_value());
  CAF_REQUIRE_EQUAL(gone->reasons.size(), 1u);
  CAF_CHECK(gone->reasons[0] == caf::exit_reason::kill);
  CAF_CHECK(log->down.empty());
  advance_time(500ms);
  sched.run();
  CAF_REQUIRE_EQUAL(respawns.size(), 1u);
  CAF_CHECK_EQUAL(respawns[0].second, "");  // fresh weights
  CAF_CHECK_EQUAL(log->up.size(), 1u);
}

CAF_TEST(past the budget a restart is refused with a report naming the drafter and its failures) {
  start(options(1, {0.5}, 60));
  auto first = restart(0, "drafter 0 hung: step 2", "ckpt/step-1");
  CAF_REQUIRE(first->value.has_value());
  auto second = restart(0, "drafter 0 died at step 2: boom", "ckpt/step-1");
  CAF_REQUIRE(second->error.has_value());
  CAF_CHECK(is(*second->error, errc::device_failure));
  const auto text = sys.render(*second->error);
  CAF_MESSAGE(text);
  CAF_CHECK(contains(text, "drafter 0 failed 2 times within 60 s (restart budget 1)"));
  CAF_CHECK(contains(text, "hung: step 2"));
  CAF_CHECK(contains(text, "boom"));
  advance_time(10s);
  sched.run();
  CAF_CHECK(respawns.empty());  // the first restart, still in its backoff, is cancelled
  // Given up for good: a later request is refused too, and drafter 1 is unaffected.
  auto third = restart(0, "again", "");
  CAF_REQUIRE(third->error.has_value());
  CAF_CHECK(contains(sys.render(*third->error), "past its restart budget"));
  auto other = restart(1, "drafter 1 died", "");
  CAF_CHECK(other->value.has_value());
}

CAF_TEST(failures older than window_s leave the budget) {
  start(options(1, {0.5}, 60));
  CAF_REQUIRE(restart(0, "first", "")->value.has_value());
  advance_time(61s);
  sched.run();
  auto later = restart(0, "second", "");
  CAF_REQUIRE(later->value.has_value());
  CAF_CHECK_EQUAL(later->value->restart, 1);
}

CAF_TEST(backoff grows per restart and its last value repeats) {
  start(options(5, {1, 2}), 1);
  std::vector<double> waits;
  for (int i = 0; i < 3; ++i) {
    auto p = restart(0, "failure " + std::to_string(i), "");
    CAF_REQUIRE(p->value.has_value());
    waits.push_back(p->value->backoff_s);
    advance_time(3s);
    sched.run();
  }
  CAF_CHECK_EQUAL(waits, (std::vector<double>{1, 2, 2}));
  CAF_CHECK_EQUAL(respawns.size(), 3u);
}

CAF_TEST(hurry starts a drafter waiting out its backoff now and its timer then does nothing) {
  // The run stops (a signal) while drafter 1 waits out a 1-hour backoff:
  // the coordinator's hurry spawns it at once from the same restore point.
  start(options(3, {3600}));
  auto plan = restart(1, "drafter 1 died", "ckpt/step-4");
  CAF_REQUIRE(plan->value.has_value());
  CAF_CHECK_EQUAL(plan->value->backoff_s, 3600);
  caf::anon_send(sup, hurry_atom::value);
  sched.run();
  CAF_REQUIRE_EQUAL(respawns.size(), 1u);
  CAF_CHECK_EQUAL(respawns[0].first, 1);
  CAF_CHECK_EQUAL(respawns[0].second, "ckpt/step-4");
  CAF_REQUIRE_EQUAL(log->up.size(), 1u);
  advance_time(3601s);  // the backoff's own timer: the drafter is up, nothing more
  sched.run();
  CAF_CHECK_EQUAL(respawns.size(), 1u);
  caf::anon_send(sup, hurry_atom::value);  // nothing waiting: nothing spawned
  sched.run();
  CAF_CHECK_EQUAL(respawns.size(), 1u);
}

CAF_TEST(a drafter that ends with bad input is not restarted: the restart is refused at once) {
  // Issue 19: a truncated target file fails every incarnation the same way,
  // so four restarts with backoff only delay the error.  The death is
  // reported as any other (the coordinator rolls back and asks); the
  // restart is refused with errc::bad_input and the drafter's own reason,
  // not counted against the budget, and nothing is respawned.
  start(options(3, {0.5}));
  const std::string reason = "drafter 0: config/t/model.safetensors: truncated: header length "
                             "1024 goes past the end of the file (100 bytes)";
  end_with(peers.drafters[0], make_error(errc::bad_input, reason));
  sched.run();
  CAF_REQUIRE_EQUAL(log->down.size(), 1u);
  CAF_CHECK(contains(log->down[0].second, "model.safetensors: truncated"));
  auto refused = restart(0, "drafter 0 died at step 1: " + log->down[0].second, "");
  CAF_REQUIRE(refused->error.has_value());
  CAF_CHECK(is(*refused->error, errc::bad_input));
  const auto text = sys.render(*refused->error);
  CAF_MESSAGE(text);
  CAF_CHECK(contains(text, "drafter 0 cannot start"));
  CAF_CHECK(contains(text, "model.safetensors: truncated: header length 1024"));
  CAF_CHECK(contains(text, "not retried"));
  advance_time(60s);
  sched.run();
  CAF_CHECK(respawns.empty());
  CAF_CHECK(log->up.empty());
  // A later request is refused too; another drafter's failure is still
  // restarted as before.
  CAF_CHECK(restart(0, "again", "")->error.has_value());
  end_with(peers.drafters[1], make_error(errc::device_failure, "CUDA error: boom"));
  sched.run();
  auto other = restart(1, "drafter 1 died", "");
  CAF_REQUIRE(other->value.has_value());
  CAF_CHECK_EQUAL(other->value->restart, 1);
  advance_time(500ms);
  sched.run();
  CAF_CHECK_EQUAL(respawns.size(), 1u);
}

CAF_TEST(a worker that ends with a lost device context is reported as device_lost and not restarted) {
  // A sticky CUDA error: no restart in this process can work, whoever saw
  // it (a drafter or a target); the coordinator hears device_lost, never a
  // drafter's death to roll back and restart.
  start(options(3, {0.5}));
  end_with(peers.drafters[0], make_error(errc::device_lost, "step 4: an illegal memory access was encountered"));
  sched.run();
  CAF_REQUIRE_EQUAL(log->device_lost.size(), 1u);
  CAF_CHECK(contains(log->device_lost[0], "illegal memory access"));
  CAF_CHECK(log->down.empty());
  end_with(peers.targets[0], make_error(errc::device_lost, "target 0, batch 3: illegal memory access"));
  sched.run();
  CAF_REQUIRE_EQUAL(log->device_lost.size(), 2u);
  CAF_CHECK(log->escalated.empty());
  advance_time(60s);
  sched.run();
  CAF_CHECK(respawns.empty());
}

CAF_TEST(a target or prefetch that dies is reported and restarted when asked and watched again) {
  start(options(1, {0.5}));
  end_with(peers.targets[0], make_error(errc::device_failure, "out of memory"));
  sched.run();
  CAF_REQUIRE_EQUAL(log->workers_down.size(), 1u);
  CAF_CHECK(contains(log->workers_down[0], "target 0: target 0 ended"));
  CAF_CHECK(contains(log->workers_down[0], "out of memory"));
  CAF_CHECK(log->escalated.empty());
  advance_time(10s);
  sched.run();
  CAF_CHECK_EQUAL(worker_respawns, 0);  // only when the coordinator asks
  auto plan = ask<restart_plan>(sys, sup, restart_atom::value, std::string("target"), int32_t{0},
                                std::string("target 0 died"));
  sched.run();
  CAF_REQUIRE(plan->value.has_value());
  CAF_CHECK_EQUAL(plan->value->restart, 1);
  CAF_CHECK_EQUAL(plan->value->backoff_s, 0.5);
  advance_time(500ms);
  sched.run();
  CAF_CHECK_EQUAL(worker_respawns, 1);
  CAF_REQUIRE_EQUAL(log->workers_up.size(), 1u);
  CAF_CHECK_EQUAL(log->workers_up[0], "target 0");
  // The prefetch likewise; a second target failure within the window is
  // past the budget of 1: refused with a report naming it.
  end_with(peers.prefetch[0], make_error(errc::device_failure, "pinned memory"));
  sched.run();
  CAF_REQUIRE_EQUAL(log->workers_down.size(), 2u);
  CAF_CHECK(contains(log->workers_down[1], "prefetch 0"));
  auto again = ask<restart_plan>(sys, sup, restart_atom::value, std::string("target"), int32_t{0},
                                 std::string("target 0 died again"));
  sched.run();
  CAF_REQUIRE(again->error.has_value());
  CAF_CHECK(contains(sys.render(*again->error), "target 0 failed 2 times"));
  auto none = ask<restart_plan>(sys, sup, restart_atom::value, std::string("target"), int32_t{5},
                                std::string("?"));
  sched.run();
  CAF_REQUIRE(none->error.has_value());
  CAF_CHECK(log->escalated.empty());
}

CAF_TEST(a target with bad input or a checkpointer or the metrics actor that ends is escalated) {
  start(options());
  end_with(peers.targets[0], make_error(errc::bad_input, "target 0: model.safetensors is truncated"));
  sched.run();
  CAF_REQUIRE_EQUAL(log->escalated.size(), 1u);
  CAF_CHECK(contains(log->escalated[0], "truncated"));
  CAF_CHECK(contains(log->escalated[0], "bad input is not retried"));
  CAF_CHECK(std::count(log->order.begin(), log->order.end(), "escalate_bad_input") == 1);  // tagged
  CAF_CHECK(log->workers_down.empty());
  end_with(peers.checkpointer, make_error(errc::bad_input, "disk full"));
  sched.run();
  CAF_REQUIRE_EQUAL(log->escalated.size(), 2u);
  CAF_CHECK(contains(log->escalated[1], "the checkpointer ended"));
  CAF_CHECK(contains(log->escalated[1], "not restarted"));
  CAF_CHECK(log->down.empty());
}

CAF_TEST(a drafter its node refuses is escalated and tagged as bad input when that is why) {
  // A cluster run: the door spawns drafters on their nodes.  Drafter 0's
  // node refuses it for bad input (its checkpoint there does not load),
  // drafter 1's never joins again (a timeout): both are escalated, only the
  // first as bad input; neither is spawned in this process.
  auto o = options();
  o.drafter_nodes = {"gpu-b", "gpu-c"};
  auto door = sys.spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](spawn_drafter_atom, const std::string& node, int32_t d, const std::string& from,
               const coordinator_actor&) -> caf::result<drafter_actor> {
      if (d == 0)
        return make_error(errc::bad_input, "drafter 0 on " + node + ": " + from + " does not load");
      return make_error(errc::timeout, "node " + node + " did not join again");
    }};
  });
  everyone.push_back(door);
  o.cluster_door = door;
  start(std::move(o));
  for (int32_t d : {0, 1}) {
    end_with(peers.drafters[static_cast<size_t>(d)], make_error(errc::device_failure, "gone"));
    sched.run();
    auto plan = restart(d, "drafter died", "ckpt/step-4");
    CAF_REQUIRE(plan->value.has_value());
    advance_time(1s);
    sched.run();
  }
  CAF_REQUIRE_EQUAL(log->escalated.size(), 2u);
  CAF_CHECK(contains(log->escalated[0], "could not be restarted on node 'gpu-b'"));
  CAF_CHECK(contains(log->escalated[0], "does not load"));
  CAF_CHECK(contains(log->escalated[1], "could not be restarted on node 'gpu-c'"));
  CAF_CHECK_EQUAL(std::count(log->order.begin(), log->order.end(), "escalate_bad_input"), 1);
  CAF_CHECK_EQUAL(std::count(log->order.begin(), log->order.end(), "escalate"), 1);
  CAF_CHECK(log->up.empty());
  CAF_CHECK(respawns.empty());
}

CAF_TEST(after shutdown the drafters are shut down and nothing is restarted or reported) {
  start(options());
  auto kept = watch(sys, peers.drafters[1]);
  CAF_REQUIRE(restart(0, "nan", "")->value.has_value());
  caf::anon_send(sup, shutdown_atom::value);
  sched.run();
  CAF_REQUIRE_EQUAL(kept->reasons.size(), 1u);
  CAF_CHECK(kept->reasons[0] == caf::exit_reason::normal);  // asked to shut down
  advance_time(10s);
  sched.run();
  CAF_CHECK(respawns.empty());
  CAF_CHECK(log->up.empty());
  CAF_CHECK(log->down.empty());
  CAF_CHECK(log->escalated.empty());
}

CAF_TEST(an unexpected message is answered with unexpected_message) {
  start(options());
  auto a = ask<std::string>(sys, caf::actor_cast<caf::actor>(sup), std::string("hello"));
  sched.run();
  CAF_REQUIRE(a->error.has_value());
  CAF_CHECK(is(*a->error, errc::unexpected_message));
  CAF_CHECK(contains(sys.render(*a->error), "tandem.supervisor cannot handle"));
  CAF_CHECK(log->down.empty());  // it keeps supervising
}

CAF_TEST_FIXTURE_SCOPE_END()
