// Coordinator protocol (messages/coordinator.hpp) on CAF's deterministic
// scheduler, against the fake peers of fake_peers.hpp: credits, routing,
// the drafter's data wait, failures and their rollback with the real
// supervisor restarting the fake drafters (death, non-finite loss, step
// timeout on the deterministic clock, restart budget), stop, max_steps,
// checkpoints, and errors reaching the run request.  The run request comes
// from an event-based launcher actor with an error callback, as in
// tools/tandem/run.cpp.
//
// Timers: the coordinator's watchdog tick, restart backoff and request
// timeouts live on the deterministic clock.  The tests drive messages with
// `sched.run()` (messages only) and time with `advance_time`, never the
// fixture's `run()`, which would fire the self-re-arming tick forever.
#define CAF_SUITE coordinator_protocol

#include <algorithm>
#include <numeric>
#include <map>

// Before dsl.hpp: its `inject` macro would rewrite drafter_engine::inject.
#include "actors/ledger.hpp"
#include "fake_peers.hpp"

#include "dsl.hpp"

using namespace tandem;
using namespace tandem::test;
using namespace std::chrono_literals;

namespace {

struct setup {
  int32_t targets = 1;
  int64_t samples = 12;
  int64_t batch_samples = 2;
  int32_t drafters = 1;
  coordinator_options opts;
  supervisor_options sup;  ///< the real supervisor restarts the fake drafters
  setup() {
    opts.credits = 2;
    opts.epochs = 1;
    opts.checkpoint_every = 0;
    opts.step_timeout_s = 5;
    sup.backoff_s = {0.5};
    sup.restart_budget = 3;
  }
};

struct fixture : test_coordinator_fixture<config> {
  world_ptr w = std::make_shared<peer_world>();
  coordinator_actor coordinator;
  supervisor_actor supervisor;
  coordinator_peers peers;
  std::vector<fake_target_actor> targets;
  fake_checkpointer_actor checkpointer;
  std::vector<caf::actor> everyone;  ///< stopped when the test ends

  ~fixture() override {
    for (auto& a : everyone)
      caf::anon_send_exit(a, caf::exit_reason::kill);
    for (auto& d : w->incarnations)
      caf::anon_send_exit(d, caf::exit_reason::kill);
    sched.run();
  }

  fake_drafter_actor spawn_drafter_incarnation(int32_t index, int64_t step,
                                               std::vector<int64_t> weights) {
    auto d = sys.spawn(fake_drafter, index, w->incarnations.size(), step, std::move(weights),
                       coordinator, w);
    w->incarnations.push_back(d);
    return d;
  }

  fixture() {
    // A test that fails midway may leave actors waiting; never block in
    // the actor system's destructor for them.
    sys.await_actors_before_shutdown(false);
  }

  /// Spawns the coordinator and its fake peers, and starts the run.
  void start(setup s) {
    spawn_all(std::move(s));
    launch(peers);
  }

  /// Spawns the coordinator and its fake peers.
  void spawn_all(setup s) {
    w->batch_samples = s.batch_samples;
    s.opts.num_samples = s.samples;
    auto coord_handle = std::make_shared<coordinator_actor>();
    s.sup.respawn_drafter = [this, coord_handle](int32_t index, const std::string& ckpt) {
      w->respawns.emplace_back(index, ckpt);
      int64_t step = 0;
      std::vector<int64_t> weights;
      if (ckpt.rfind(memory_restore_prefix, 0) == 0) {
        const auto k = std::stoll(ckpt.substr(memory_restore_prefix.size()));
        auto it = w->memory.find(index);
        if (w->memory_gone || it == w->memory.end() || it->second.first != k) {
          w->next_dies_at_start = true;
          return drafter_actor{spawn_drafter_incarnation(index, 0, {})};
        }
        step = it->second.first;
        weights = it->second.second;
      } else if (!ckpt.empty()) {
        step = w->checkpoints.at(ckpt).first;
        weights = w->checkpoints.at(ckpt).second;
      }
      return drafter_actor{spawn_drafter_incarnation(index, step, std::move(weights))};
    };
    // Targets and prefetches spawned again start as a new process would:
    // nothing held, no credit (the world's records outlive incarnations).
    s.sup.respawn_target = [this, coord_handle](int32_t i) {
      auto& t = w->targets[static_cast<size_t>(i)];
      t.hold = false;
      t.held.clear();
      ++w->target_respawns;
      targets[static_cast<size_t>(i)] = sys.spawn(fake_target, i, *coord_handle, w);
      everyone.push_back(caf::actor_cast<caf::actor>(targets[static_cast<size_t>(i)]));
      return target_actor{targets[static_cast<size_t>(i)]};
    };
    s.sup.respawn_prefetch = [this, coord_handle](int32_t i) {
      auto& p = w->prefetch[static_cast<size_t>(i)];
      p.credit = 0;
      p.queue.clear();
      p.exhausted = true;
      ++w->prefetch_respawns;
      auto fresh = sys.spawn(fake_prefetch, i, *coord_handle, w);
      everyone.push_back(caf::actor_cast<caf::actor>(fresh));
      return prefetch_actor{fresh};
    };
    supervisor = spawn_supervisor(sys, s.sup);
    everyone.push_back(caf::actor_cast<caf::actor>(supervisor));
    s.opts.supervisor = supervisor;
    coordinator = spawn_coordinator(sys, s.opts);
    *coord_handle = coordinator;
    everyone.push_back(caf::actor_cast<caf::actor>(coordinator));
    w->prefetch.resize(static_cast<size_t>(s.targets));
    w->targets.resize(static_cast<size_t>(s.targets));
    for (int64_t k = 0; k < s.samples; ++k)
      w->prefetch[static_cast<size_t>(k % s.targets)].share.push_back(k);
    for (int32_t i = 0; i < s.targets; ++i) {
      peers.prefetch.push_back(sys.spawn(fake_prefetch, i, coordinator, w));
      targets.push_back(sys.spawn(fake_target, i, coordinator, w));
      peers.targets.push_back(targets.back());
      everyone.push_back(caf::actor_cast<caf::actor>(peers.prefetch.back()));
      everyone.push_back(caf::actor_cast<caf::actor>(targets.back()));
    }
    for (int32_t d = 0; d < s.drafters; ++d)
      peers.drafters.push_back(spawn_drafter_incarnation(d, 0, {}));
    checkpointer = sys.spawn(fake_checkpointer, w);
    peers.checkpointer = checkpointer;
    peers.metrics = sys.spawn(fake_metrics, w);
    everyone.push_back(caf::actor_cast<caf::actor>(checkpointer));
    everyone.push_back(caf::actor_cast<caf::actor>(peers.metrics));
  }

  /// `o` with a supervisor of its own (coordinators outside the fixture's run).
  coordinator_options supervised(coordinator_options o) {
    o.supervisor = spawn_supervisor(sys, supervisor_options{});
    everyone.push_back(caf::actor_cast<caf::actor>(o.supervisor));
    return o;
  }

  /// The launcher: asks for the run and records its answer.
  /// spawn_all, an eval actor (fake_eval) among the peers, launch.
  void start_with_eval(setup s) {
    spawn_all(s);
    auto ev = sys.spawn(fake_eval, w);
    everyone.push_back(caf::actor_cast<caf::actor>(ev));
    peers.eval = ev;
    launch(peers);
  }

  void launch(coordinator_peers p) {
    auto wp = w;
    auto to = coordinator;
    sys.spawn([wp, to, p](caf::event_based_actor* me) {
      me->request(to, caf::infinite, run_atom::value, p)
        .then([me, wp](run_summary& s) { wp->summary = s; me->quit(); },
              [me, wp](caf::error& e) { wp->error = e; me->quit(); });
    });
  }

  /// spawn_all and launch, with a host checkpointer (restore points in
  /// shared memory, checkpoint.host_every).
  void launch_with_host(const setup& s) {
    spawn_all(s);
    auto host = sys.spawn(fake_host_checkpointer, w);
    everyone.push_back(caf::actor_cast<caf::actor>(host));
    peers.host_checkpointer = host;
    launch(peers);
  }

  /// The steps of the restore points the host checkpointer wrote, and of
  /// the checkpoints the checkpointer wrote, in order.
  std::vector<int64_t> host_steps() const {
    std::vector<int64_t> out;
    for (const auto& x : w->host_written)
      out.push_back(x.step);
    return out;
  }
  std::vector<int64_t> checkpoint_steps() const {
    std::vector<int64_t> out;
    for (const auto& x : w->written)
      out.push_back(x.step);
    return out;
  }

  /// After a launch whose drafter dies taking the snapshot of
  /// w->die_on_snapshot_at: runs to that death, lets the restart's backoff
  /// pass (the new incarnation does not die there), runs to the end; the run
  /// answered, without error, after one restart.
  void run_past_the_snapshot_death() {
    sched.run();
    w->die_on_snapshot_at = -1;
    advance_time(500ms);  // the restart's backoff
    sched.run();
    CAF_REQUIRE(w->summary.has_value());
    CAF_CHECK(!w->error);
    CAF_CHECK_EQUAL(w->events_named("drafter_restarted").size(), 1u);
  }

  nlohmann::json status() {
    auto a = ask<std::string>(sys, coordinator, status_atom::value);
    sched.run();
    CAF_REQUIRE(a->value.has_value());
    return nlohmann::json::parse(*a->value);
  }

  /// After one data-parallel failure: the backoff passes and the run of 16
  /// samples (4 group steps) ends; the failed drafter was respawned from
  /// `checkpoint` and the second group's rank 0 is `root`, at `step`.
  void finish_regrouped(const std::string& checkpoint, int root, int64_t step) {
    advance_time(500ms);
    sched.run();
    CAF_REQUIRE(w->summary.has_value());
    CAF_CHECK(!w->error);
    CAF_REQUIRE_EQUAL(w->respawns.size(), 1u);
    CAF_CHECK_EQUAL(w->respawns[0].second, checkpoint);
    auto formed = w->events_named("group_formed");
    CAF_REQUIRE_EQUAL(formed.size(), 2u);
    CAF_CHECK_EQUAL(formed[1]["root"], root);
    CAF_CHECK_EQUAL(formed[1]["step"], step);
    CAF_CHECK_EQUAL(w->summary->steps, 4);
    CAF_CHECK_EQUAL(w->summary->samples_committed, 16);
  }

  fake_drafter_actor drafter() const { return w->incarnations.back(); }

  /// How often each sample is in the final weights.
  std::map<int64_t, int> final_counts() const {
    std::map<int64_t, int> n;
    for (auto s : w->final_weights)
      ++n[s];
    return n;
  }

  /// Every sample 0..samples-1 exactly `times` times in the final weights.
  void check_exactly(int64_t samples, int times) {
    auto n = final_counts();
    CAF_CHECK_EQUAL(static_cast<int64_t>(n.size()), samples);
    for (auto& [sample, count] : n)
      TANDEM_CHECK_MSG(count == times, "sample " << sample << " is in the final weights "
                                                 << count << " times");
  }

  /// No batch or feature handle left unreleased, none released twice.
  void check_handles_released() {
    for (auto& p : w->prefetch) {
      CAF_CHECK(p.outstanding.empty());
      CAF_CHECK_EQUAL(p.bad_releases, 0);
    }
    for (auto& t : w->targets) {
      CAF_CHECK(t.outstanding.empty());
      CAF_CHECK_EQUAL(t.bad_releases, 0);
    }
  }
};

std::set<int64_t> samples_of(const std::vector<batch_desc>& batches) {
  std::set<int64_t> out;
  for (auto& b : batches)
    out.insert(b.sample_ids.begin(), b.sample_ids.end());
  return out;
}

} // namespace

CAF_TEST_FIXTURE_SCOPE(coordinator_protocol_tests, fixture)

CAF_TEST(work flows prefetch to target to drafter and the run ends after its epochs) {
  setup s;
  s.opts.epochs = 2;
  start(s);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  const auto& sum = *w->summary;
  CAF_CHECK_EQUAL(sum.stop_reason, "epochs");
  CAF_CHECK_EQUAL(sum.steps, 12);  // 2 epochs x 6 batches of 2 samples
  CAF_CHECK_EQUAL(sum.epochs_completed, 2);
  CAF_CHECK_EQUAL(sum.samples_committed, 12);
  CAF_CHECK_EQUAL(sum.first_loss, 4.875);
  CAF_CHECK_EQUAL(sum.last_loss, 5.0 - 12 * 0.125);
  CAF_CHECK_EQUAL(sum.checkpoint, "ckpt/step-12");
  // Every step trained a batch from the prefetch with that batch's features
  // from its target; batch ids are the ledger's, each used once.
  CAF_REQUIRE_EQUAL(w->steps.size(), 12u);
  std::set<int64_t> ids;
  std::map<int64_t, std::vector<int64_t>> per_epoch;
  for (auto& st : w->steps) {
    const auto& item = st.work;
    CAF_CHECK_EQUAL(item.features.batch_id, item.batch.batch_id);
    CAF_CHECK_EQUAL(item.features.target, item.batch.source);
    CAF_CHECK(item.batch.batch_id >= 0);
    CAF_CHECK(ids.insert(item.batch.batch_id).second);
    auto& sent = w->prefetch[0].sent;
    CAF_CHECK(std::any_of(sent.begin(), sent.end(), [&](const batch_desc& b) {
      return b.handle == item.batch.handle && b.sample_ids == item.batch.sample_ids;
    }));
    auto& v = per_epoch[item.batch.epoch];
    v.insert(v.end(), item.batch.sample_ids.begin(), item.batch.sample_ids.end());
  }
  CAF_REQUIRE_EQUAL(per_epoch.size(), 2u);
  for (auto& [epoch, v] : per_epoch) {
    std::sort(v.begin(), v.end());
    std::vector<int64_t> all(12);
    std::iota(all.begin(), all.end(), 0);
    CAF_CHECK(v == all);
  }
  check_exactly(12, 2);
  // Metrics got every report as the drafter sent it, in order.
  CAF_REQUIRE_EQUAL(w->reports.size(), 12u);
  for (size_t i = 0; i < 12; ++i)
    CAF_CHECK_EQUAL(w->reports[i].step, static_cast<int64_t>(i + 1));
  // A checkpoint at each epoch end, carrying the ledger as of its step.
  CAF_REQUIRE_EQUAL(w->written.size(), 2u);
  CAF_CHECK_EQUAL(w->written[0].step, 6);
  CAF_CHECK_EQUAL(w->written[1].step, 12);
  CAF_CHECK_EQUAL(w->extras[0]["step"], 6);
  CAF_CHECK_EQUAL(w->extras[0]["epoch"], 0);
  CAF_CHECK_EQUAL(w->extras[1]["epoch"], 1);
  CAF_CHECK_EQUAL(w->events_named("epoch").size(), 2u);
  CAF_CHECK_EQUAL(w->events_named("checkpoint").size(), 2u);
  auto end = w->events_named("end");
  CAF_REQUIRE_EQUAL(end.size(), 1u);
  CAF_CHECK_EQUAL(end[0]["reason"], "epochs");
  check_handles_released();
  CAF_CHECK(w->snapshots.empty());  // every snapshot handed to the checkpointer
}

CAF_TEST(the coordinator gathers the vitals of every actor in a fixed order) {
  setup s;
  s.drafters = 2;
  start(s);
  auto a = ask<std::vector<actor_vitals>>(sys, coordinator, vitals_all_atom::value, int64_t{500});
  sched.run();
  CAF_REQUIRE(a->value.has_value());
  std::vector<std::string> names;
  for (const auto& v : *a->value) {
    names.push_back(v.role + " " + std::to_string(v.index));
    CAF_CHECK(v.answered);
  }
  CAF_CHECK_EQUAL(names, (std::vector<std::string>{"coordinator 0", "prefetch 0", "target 0", "drafter 0",
                                                   "drafter 1", "checkpointer 0", "metrics 0", "supervisor 0"}));
  const auto& own = a->value->front();
  CAF_CHECK_EQUAL(own.actor_id, coordinator->id());
  CAF_CHECK_GREATER_OR_EQUAL(own.handled, 2u);  // the run request, this one
  CAF_CHECK_EQUAL(own.last_message, "run");
  // The real supervisor counts too.  The question is urgent: it may be
  // answered before the supervise message queued ahead of it.
  const auto& sup = a->value->back();
  CAF_CHECK(sup.handled == 1u || (sup.handled == 2u && sup.last_message == "supervise"));
  CAF_CHECK_EQUAL(sup.actor_id, supervisor->id());
}

CAF_TEST(an actor that has ended is listed down among the vitals) {
  setup s;
  start_with_eval(s);
  caf::anon_send_exit(peers.eval, caf::exit_reason::kill);  // the eval actor is not watched
  sched.run_once();
  auto a = ask<std::vector<actor_vitals>>(sys, coordinator, vitals_all_atom::value, int64_t{500});
  sched.run();
  CAF_REQUIRE(a->value.has_value());
  bool seen = false;
  for (const auto& v : *a->value) {
    if (v.role == "eval") {
      seen = true;
      CAF_CHECK(!v.answered);
      CAF_CHECK(v.down);
    } else {
      CAF_CHECK(v.answered && !v.down);
    }
  }
  CAF_CHECK(seen);
}

CAF_TEST(credits bound the batches in flight per target) {
  setup s;
  s.targets = 2;
  s.samples = 16;  // 8 batches of 1 per prefetch
  s.batch_samples = 1;
  s.opts.credits = 3;
  w->script = {act::hang};
  start(s);
  sched.run();
  // The drafter holds its first item: each prefetch stages exactly its
  // credits and stops; the targets hold no more than that; the coordinator
  // queues what the drafter cannot take yet, bounded by the credits.
  for (auto& p : w->prefetch) {
    CAF_CHECK_EQUAL(p.outstanding.size(), 3u);
    CAF_CHECK_EQUAL(p.credits_received, 3);
    CAF_CHECK_EQUAL(p.sent.size(), 3u);
  }
  for (auto& t : w->targets)
    CAF_CHECK_EQUAL(t.outstanding.size(), 3u);
  auto st = status();
  CAF_CHECK_EQUAL(st["in_flight"], 6);
  CAF_CHECK_EQUAL(st["queued"], 5);
  CAF_CHECK_EQUAL(st["busy"], 1);
  CAF_CHECK_EQUAL(st["ledger"]["issued"], 6);
  CAF_CHECK_EQUAL(w->work_received, 1);
  // One step done: one batch retired, one credit back to its prefetch,
  // one new batch from it; the rest runs to the end under the same bound.
  self->send(drafter(), go_atom::value);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK_EQUAL(w->summary->steps, 16);
  for (auto& p : w->prefetch) {
    CAF_CHECK_EQUAL(p.max_outstanding, 3u);
    CAF_CHECK_EQUAL(p.sent.size(), 8u);
  }
  for (auto& t : w->targets)
    CAF_CHECK_LESS_OR_EQUAL(t.max_outstanding, 3u);
  check_exactly(16, 1);
  check_handles_released();
}

CAF_TEST(the drafter data wait reaches the metrics) {
  setup s;
  s.samples = 4;
  start(s);
  // The target sits on the first batches for 2 s of (deterministic) time.
  w->targets[0].hold = true;
  sched.run();
  CAF_CHECK_EQUAL(w->targets[0].held.size(), 2u);
  CAF_CHECK_EQUAL(w->work_received, 0);
  advance_time(2s);
  sched.run();
  self->send(targets[0], go_atom::value);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_REQUIRE_EQUAL(w->reports.size(), 2u);
  CAF_CHECK_EQUAL(w->reports[0].wait_ms, 2000.0);  // idle until the features came
  CAF_CHECK_EQUAL(w->reports[1].wait_ms, 0.0);     // the next item was queued already
  CAF_CHECK_EQUAL(w->reports[0].compute_ms, 3.0);
}

CAF_TEST(a drafter that dies is respawned from the newest checkpoint and the prefetch rewound to it) {
  setup s;
  s.opts.checkpoint_every = 2;
  w->script = {act::ok, act::ok, act::ok, act::die};
  start(s);
  auto first = drafter();
  auto exit1 = watch(sys, first);
  sched.run();
  // Steps 1-2 are durable (checkpoint at step 2); step 3 is trained but not
  // durable; step 4 died.  Everything after step 2 goes back to pending.
  CAF_REQUIRE_EQUAL(exit1->reasons.size(), 1u);
  CAF_CHECK(is(exit1->reasons[0], errc::device_failure));
  CAF_CHECK(!w->summary && !w->error);
  CAF_REQUIRE_EQUAL(w->written.size(), 1u);
  CAF_CHECK_EQUAL(w->written[0].step, 2);
  auto failed = w->events_named("drafter_failed");
  CAF_REQUIRE_EQUAL(failed.size(), 1u);
  CAF_CHECK_EQUAL(failed[0]["restore_step"], 2);
  CAF_CHECK_EQUAL(failed[0]["steps_lost"], 1);
  CAF_CHECK_EQUAL(failed[0]["checkpoint"], "ckpt/step-2");
  CAF_CHECK(contains(failed[0]["reason"].get<std::string>(), "injected failure"));
  // Re-issued: every sample sent before the failure and not in steps 1-2;
  // the prefetch starts the epoch again from what steps 1-2 hold.
  std::set<int64_t> durable;
  for (auto& st : w->steps)
    if (st.step <= 2)
      durable.insert(st.work.batch.sample_ids.begin(), st.work.batch.sample_ids.end());
  std::set<int64_t> expected;
  for (auto x : samples_of(w->prefetch[0].sent))
    if (!durable.count(x))
      expected.insert(x);
  CAF_REQUIRE_EQUAL(w->prefetch[0].starts.size(), 2u);
  const auto& rewound = w->prefetch[0].starts[1];
  CAF_CHECK_EQUAL(std::set<int64_t>(rewound.begin(), rewound.end()), durable);
  CAF_CHECK_EQUAL(failed[0]["samples_reissued"], static_cast<int64_t>(expected.size()));
  // No restart before the backoff (0.5 s); then one, from the checkpoint.
  CAF_CHECK(w->respawns.empty());
  advance_time(500ms);
  sched.run();
  CAF_REQUIRE_EQUAL(w->respawns.size(), 1u);
  CAF_CHECK_EQUAL(w->respawns[0].first, 0);
  CAF_CHECK_EQUAL(w->respawns[0].second, "ckpt/step-2");
  CAF_CHECK_EQUAL(w->events_named("drafter_restarted").size(), 1u);
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->summary->steps, 6);
  CAF_CHECK_EQUAL(w->summary->samples_committed, 12);
  check_exactly(12, 1);
  check_handles_released();
}

CAF_TEST(a drafter with a restore point in device memory is restored from it and loses no step) {
  setup s;
  s.opts.checkpoint_every = 2;
  w->memory_tier = true;
  w->script = {act::ok, act::ok, act::ok, act::die};
  start(s);
  sched.run();
  // Step 3 is not durable, but the restore point holds it: nothing rolls back
  // except the batch in flight.
  auto failed = w->events_named("drafter_failed");
  CAF_REQUIRE_EQUAL(failed.size(), 1u);
  CAF_CHECK_EQUAL(failed[0]["restore_step"], 3);
  CAF_CHECK_EQUAL(failed[0]["steps_lost"], 0);
  CAF_CHECK_EQUAL(failed[0]["restore_from"], "memory");
  advance_time(500ms);
  sched.run();
  CAF_REQUIRE_EQUAL(w->respawns.size(), 1u);
  CAF_CHECK_EQUAL(w->respawns[0].second, "memory:3");
  auto restarted = w->events_named("drafter_restarted");
  CAF_REQUIRE_EQUAL(restarted.size(), 1u);
  CAF_CHECK_EQUAL(restarted[0]["from"], "memory (step 3)");
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->summary->steps, 6);
  check_exactly(12, 1);
  check_handles_released();
}

CAF_TEST(a batch packed before its prefetch saw the rollback is dropped and its credit returned) {
  setup s;
  s.opts.checkpoint_every = 2;
  w->script = {act::ok, act::ok, act::ok, act::die};
  start(s);
  sched.run();  // step 4 dies: rolled back to step 2, the prefetch rewound (generation 2)
  auto& p = w->prefetch[0];
  CAF_REQUIRE_EQUAL(p.starts.size(), 2u);
  CAF_REQUIRE_EQUAL(p.generation, 2);
  CAF_REQUIRE(!p.queue.empty());
  // A batch of generation 1 that was on its way when the rollback came, with
  // a sample the rewound prefetch packs again: issuing it would train that
  // sample twice (the ledger would refuse the second batch).
  batch_desc stale;
  stale.generation = 1;
  stale.source = 0;
  stale.sample_ids = {p.queue.back()};
  stale.rows = 1;
  stale.seq_len = 16;
  stale.handle = w->next_handle++;
  p.outstanding.insert(stale.handle);
  const auto credits = p.credits_received;
  caf::anon_send(coordinator, stale);
  sched.run();
  CAF_CHECK_EQUAL(p.credits_received, credits + 1);  // its credit back
  CAF_CHECK(!p.outstanding.count(stale.handle));     // released
  advance_time(500ms);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->summary->samples_committed, 12);
  check_exactly(12, 1);
  check_handles_released();
}

CAF_TEST(a restore point in device memory that is gone falls back to the newest checkpoint) {
  setup s;
  s.opts.checkpoint_every = 2;
  w->memory_tier = true;
  w->memory_gone = true;
  w->script = {act::ok, act::ok, act::ok, act::die};
  start(s);
  sched.run();
  advance_time(500ms);
  sched.run();  // the incarnation restoring memory:3 dies at once
  advance_time(2s);
  sched.run();
  auto failed = w->events_named("drafter_failed");
  CAF_REQUIRE_EQUAL(failed.size(), 2u);
  CAF_CHECK_EQUAL(failed[0]["restore_from"], "memory");
  CAF_CHECK_EQUAL(failed[1]["restore_from"], "checkpoint");
  CAF_CHECK_EQUAL(failed[1]["restore_step"], 2);
  CAF_CHECK_EQUAL(failed[1]["steps_lost"], 1);  // step 3: only the memory held it
  CAF_REQUIRE_EQUAL(w->respawns.size(), 2u);
  CAF_CHECK_EQUAL(w->respawns[0].second, "memory:3");
  CAF_CHECK_EQUAL(w->respawns[1].second, "ckpt/step-2");
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK_EQUAL(w->summary->steps, 6);
  check_exactly(12, 1);
  check_handles_released();
}

CAF_TEST(a drafter that dies while the final checkpoint is taken ends the run with an error naming the durable step) {
  setup s;
  s.opts.checkpoint_every = 2;
  s.opts.max_steps = 4;
  w->die_on_snapshot_at = 4;
  start(s);
  sched.run();
  advance_time(500ms);
  sched.run();
  // Steps 3-4 existed only in the drafter that died: the run must not report
  // success for them.
  CAF_CHECK(!w->summary);
  CAF_REQUIRE(w->error.has_value());
  const auto text = sys.render(*w->error);
  CAF_CHECK(contains(text, "ckpt/step-2, holds step 2"));
  CAF_CHECK(contains(text, "steps 3..4 are lost"));
  auto end = w->events_named("end");
  CAF_REQUIRE_EQUAL(end.size(), 1u);
  CAF_CHECK_EQUAL(end[0]["durable_step"], 2);
  CAF_CHECK(contains(end[0]["error"].get<std::string>(), "steps 3..4 are lost"));
  check_handles_released();
}

CAF_TEST(a non-finite loss is a failure and restarts from fresh weights without a checkpoint) {
  setup s;
  w->script = {act::ok, act::nan};
  start(s);
  auto first = drafter();
  auto exit1 = watch(sys, first);
  sched.run();
  // The non-finite report reaches the metrics; the drafter is replaced.
  CAF_REQUIRE_EQUAL(w->reports.size(), 2u);
  CAF_CHECK(!w->reports[1].finite);
  CAF_REQUIRE_EQUAL(exit1->reasons.size(), 1u);
  CAF_CHECK(exit1->reasons[0] == caf::exit_reason::kill);
  auto failed = w->events_named("drafter_failed");
  CAF_REQUIRE_EQUAL(failed.size(), 1u);
  CAF_CHECK(contains(failed[0]["reason"].get<std::string>(), "non-finite"));
  CAF_CHECK_EQUAL(failed[0]["restore_step"], 0);
  advance_time(500ms);
  sched.run();
  CAF_REQUIRE_EQUAL(w->respawns.size(), 1u);
  CAF_CHECK_EQUAL(w->respawns[0].second, "");  // no checkpoint yet: fresh weights
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK_EQUAL(w->summary->steps, 6);
  check_exactly(12, 1);
  check_handles_released();
}

CAF_TEST(an idle drafter that misses its heartbeat is a failure and is restarted) {
  setup s;
  s.opts.heartbeat_s = 3;
  start(s);
  w->targets[0].hold = true;  // no features: the drafter stays idle
  w->mute_heartbeat = true;
  auto first = drafter();
  auto exit1 = watch(sys, first);
  sched.run();
  CAF_CHECK_EQUAL(w->work_received, 0);
  // 3.25 s: asked; 5 s: still within heartbeat_s of the question.
  advance_time(3250ms);
  sched.run();
  advance_time(1750ms);
  sched.run();
  CAF_CHECK(w->events_named("drafter_failed").empty());
  // 6.5 s: no answer for more than 3 s.
  advance_time(1500ms);
  sched.run();
  auto failed = w->events_named("drafter_failed");
  CAF_REQUIRE_EQUAL(failed.size(), 1u);
  CAF_CHECK(contains(failed[0]["reason"].get<std::string>(), "drafter 0 missed its heartbeat"));
  CAF_CHECK(contains(failed[0]["reason"].get<std::string>(), "runtime.heartbeat_s"));
  CAF_REQUIRE_EQUAL(exit1->reasons.size(), 1u);
  CAF_CHECK(exit1->reasons[0] == caf::exit_reason::kill);
  // The restart answers its heartbeats: no second failure.
  w->mute_heartbeat = false;
  advance_time(1s);
  sched.run();
  CAF_CHECK_EQUAL(w->respawns.size(), 1u);
  for (int i = 0; i < 10; ++i) {
    advance_time(1s);
    sched.run();
  }
  CAF_CHECK_EQUAL(w->events_named("drafter_failed").size(), 1u);
}

CAF_TEST(a drafter that answers its heartbeats is left alone) {
  setup s;
  s.opts.heartbeat_s = 2;
  start(s);
  w->targets[0].hold = true;
  sched.run();
  for (int i = 0; i < 40; ++i) {
    advance_time(500ms);
    sched.run();
  }
  CAF_CHECK(w->events_named("drafter_failed").empty());
  CAF_CHECK(w->respawns.empty());
}

CAF_TEST(a step that overruns step_timeout_s on the deterministic clock is a failure) {
  setup s;
  s.opts.step_timeout_s = 5;
  w->script = {act::hang};
  start(s);
  auto first = drafter();
  auto exit1 = watch(sys, first);
  sched.run();
  CAF_CHECK_EQUAL(w->work_received, 1);
  // 4 s into the step: the watchdog ticks, nothing happens.
  advance_time(4s);
  sched.run();
  CAF_CHECK(w->events_named("drafter_failed").empty());
  CAF_CHECK(exit1->reasons.empty());
  // 6 s: hung.
  advance_time(2s);
  sched.run();
  auto failed = w->events_named("drafter_failed");
  CAF_REQUIRE_EQUAL(failed.size(), 1u);
  CAF_CHECK(contains(failed[0]["reason"].get<std::string>(), "drafter 0 hung"));
  CAF_CHECK(contains(failed[0]["reason"].get<std::string>(), "step_timeout_s"));
  CAF_REQUIRE_EQUAL(exit1->reasons.size(), 1u);
  CAF_CHECK(exit1->reasons[0] == caf::exit_reason::kill);
  // A late report of the replaced incarnation is ignored.
  step_report late;
  late.drafter = 0;
  late.step = 1;
  late.batch_id = 0;
  late.loss = 1;
  caf::send_as(caf::actor_cast<caf::actor>(first), coordinator, late);
  sched.run();
  CAF_CHECK(w->reports.empty());
  auto st = status();
  CAF_CHECK_EQUAL(st["step"], 0);
  advance_time(500ms);
  sched.run();
  CAF_REQUIRE_EQUAL(w->respawns.size(), 1u);
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK_EQUAL(w->summary->steps, 6);
  check_exactly(12, 1);
  check_handles_released();
}

CAF_TEST(past the restart budget the run request gets an error naming the drafter) {
  setup s;
  s.sup.restart_budget = 1;
  w->script = {act::die, act::die};
  start(s);
  sched.run();
  advance_time(500ms);
  sched.run();
  CAF_CHECK_EQUAL(w->respawns.size(), 1u);
  CAF_CHECK(!w->summary);
  CAF_REQUIRE(w->error.has_value());
  CAF_CHECK(is(*w->error, errc::device_failure));
  auto text = sys.render(*w->error);
  CAF_MESSAGE(text);
  CAF_CHECK(contains(text, "drafter 0 failed 2 times"));
  CAF_CHECK(contains(text, "restart budget 1"));
  CAF_CHECK(contains(text, "injected failure"));
  CAF_CHECK_EQUAL(w->events_named("budget_exhausted").size(), 1u);
  // No further restart is scheduled.
  advance_time(10s);
  sched.run();
  CAF_CHECK_EQUAL(w->respawns.size(), 1u);
}

CAF_TEST(failures older than window_s do not count against the budget) {
  setup s;
  s.sup.restart_budget = 1;
  s.sup.window_s = 60;
  s.opts.step_timeout_s = 100;
  w->script = {act::die, act::ok, act::hang};
  start(s);
  sched.run();
  advance_time(500ms);
  sched.run();
  CAF_CHECK_EQUAL(w->respawns.size(), 1u);
  CAF_CHECK_EQUAL(w->steps.size(), 1u);  // the second item hangs
  // The second failure (a hang past step_timeout_s) comes 100 s after the
  // first, which has left the 60 s window: a restart, not the end.
  advance_time(101s);
  sched.run();
  CAF_CHECK_EQUAL(w->events_named("drafter_failed").size(), 2u);
  CAF_CHECK(!w->error);
  advance_time(500ms);
  sched.run();
  CAF_CHECK_EQUAL(w->respawns.size(), 2u);
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  check_exactly(12, 1);
}

CAF_TEST(stop waits for the step in progress then checkpoints and answers) {
  setup s;
  w->script = {act::hang};
  start(s);
  sched.run();
  const auto credits_before = w->prefetch[0].credits_received;
  self->send(coordinator, stop_atom::value);
  sched.run();
  CAF_CHECK(!w->summary);  // the drafter is mid-step
  CAF_CHECK_EQUAL(w->work_received, 1);
  self->send(drafter(), go_atom::value);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->summary->stop_reason, "signal");
  CAF_CHECK_EQUAL(w->summary->steps, 1);
  CAF_CHECK_EQUAL(w->summary->checkpoint, "ckpt/step-1");
  CAF_REQUIRE_EQUAL(w->written.size(), 1u);
  CAF_CHECK_EQUAL(w->written[0].step, 1);
  CAF_CHECK_EQUAL(w->work_received, 1);  // nothing dispatched after the stop
  CAF_CHECK_EQUAL(w->prefetch[0].credits_received, credits_before);  // no credit either
  // The checkpoint's ledger commits exactly the one trained batch.
  CAF_CHECK_EQUAL(w->extras[0]["step"], 1);
  check_handles_released();
}

CAF_TEST(a stop while a drafter waits out an hour of backoff restarts it at once and ends with a checkpoint) {
  // A signal must not wait for the backoff: the coordinator hurries the
  // supervisor, the drafter comes back from its checkpoint now, and the run
  // ends "signal" with nothing trained lost.
  setup s;
  s.opts.checkpoint_every = 2;
  s.sup.backoff_s = {3600};
  w->script = {act::ok, act::ok, act::die};
  start(s);
  sched.run();
  CAF_REQUIRE_EQUAL(w->events_named("drafter_failed").size(), 1u);
  CAF_CHECK(w->respawns.empty());  // in its backoff
  self->send(coordinator, stop_atom::value);
  sched.run();
  CAF_REQUIRE_EQUAL(w->respawns.size(), 1u);  // at once, no time advanced
  CAF_CHECK_EQUAL(w->respawns[0].second, "ckpt/step-2");
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->summary->stop_reason, "signal");
  CAF_CHECK_EQUAL(w->summary->steps, 2);  // step 3 died; the checkpoint holds 2
  CAF_CHECK_EQUAL(w->summary->checkpoint, "ckpt/step-2");
  check_handles_released();
}

CAF_TEST(with checkpoint_on_stop false a stop ends without a checkpoint) {
  // checkpoint.on_signal = false: the step in progress finishes, nothing is
  // written, and the ledger commits nothing beyond the last durable state.
  setup s;
  s.opts.checkpoint_on_stop = false;
  w->script = {act::hang};
  start(s);
  sched.run();
  self->send(coordinator, stop_atom::value);
  sched.run();
  CAF_CHECK(!w->summary);  // the drafter is mid-step
  self->send(drafter(), go_atom::value);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->summary->stop_reason, "signal");
  CAF_CHECK_EQUAL(w->summary->steps, 1);
  CAF_CHECK_EQUAL(w->summary->checkpoint, "");
  CAF_CHECK_EQUAL(w->summary->samples_committed, 0);
  CAF_CHECK(w->written.empty());
  check_handles_released();
}

CAF_TEST(a stop that arrives while an epoch-end checkpoint is being written ends the run) {
  // The epoch's last step is trained and its checkpoint is being written
  // when SIGTERM comes: the stop waits for that checkpoint, which already
  // holds every step, then answers (it hung before: nothing looked again
  // once the checkpoint was done).
  setup s;
  s.opts.epochs = 3;
  w->hold_writes = true;
  start(s);
  sched.run();
  CAF_REQUIRE_EQUAL(w->steps.size(), 6u);  // epoch 0 trained, its checkpoint held
  CAF_CHECK(w->events_named("checkpoint").empty());
  self->send(coordinator, stop_atom::value);
  sched.run();
  CAF_CHECK(!w->summary);
  self->send(checkpointer, go_atom::value);  // the write completes now
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->summary->stop_reason, "signal");
  CAF_CHECK_EQUAL(w->summary->steps, 6);
  CAF_CHECK_EQUAL(w->summary->checkpoint, "ckpt/step-6");
  CAF_CHECK_EQUAL(w->written.size(), 1u);  // nothing new to write after it
  CAF_CHECK_EQUAL(w->steps.size(), 6u);
  check_handles_released();
}

/// Steps 1..n trained the samples of a fault-free run, in its order: step k
/// the k-th pair of the one prefetch's share.
void check_fault_free_order(const peer_world& w, int64_t n) {
  std::map<int64_t, std::vector<int64_t>> final_steps;  // the last incarnation's step k
  for (const auto& st : w.steps)
    final_steps[st.step] = st.work.batch.sample_ids;
  CAF_REQUIRE_EQUAL(static_cast<int64_t>(final_steps.size()), n);
  for (auto& [k, ids] : final_steps)
    CAF_CHECK_EQUAL(ids, (std::vector<int64_t>{2 * k - 2, 2 * k - 1}));
}

CAF_TEST(a target that dies is restarted and its batches issued again so the run trains what a fault-free run trains) {
  // The supervisor reports it (worker_down); nothing is dispatched while it
  // is down; its new incarnation comes after the backoff; once the step in
  // progress ends, every prefetch is rewound to that step (no training is
  // rolled back) and the rest of the epoch is the fault-free run's.
  setup s;
  w->script = {act::ok, act::ok, act::hang};
  start(s);
  sched.run();
  CAF_REQUIRE_EQUAL(w->steps.size(), 2u);  // the third item hangs at the drafter
  caf::anon_send_exit(targets[0], caf::exit_reason::kill);
  sched.run();
  auto failed = w->events_named("actor_failed");
  CAF_REQUIRE_EQUAL(failed.size(), 1u);
  CAF_CHECK_EQUAL(failed[0]["role"], "target");
  CAF_CHECK_EQUAL(failed[0]["index"], 0);
  CAF_CHECK_EQUAL(failed[0]["restart"], 1);
  CAF_CHECK(w->events_named("escalated").empty());
  CAF_CHECK_EQUAL(w->target_respawns, 0);
  advance_time(500ms);  // the backoff
  sched.run();
  CAF_CHECK_EQUAL(w->target_respawns, 1);
  CAF_CHECK_EQUAL(w->events_named("actor_restarted").size(), 1u);
  CAF_CHECK(w->events_named("reissued").empty());  // step 3 is still in progress
  self->send(drafter(), go_atom::value);
  sched.run();
  auto reissued = w->events_named("reissued");
  CAF_REQUIRE_EQUAL(reissued.size(), 1u);
  CAF_CHECK_EQUAL(reissued[0]["step"], 3);
  // The rewind: the epoch again minus what steps 1-3 hold.
  CAF_REQUIRE_EQUAL(w->prefetch[0].starts.size(), 2u);
  CAF_CHECK_EQUAL(std::set<int64_t>(w->prefetch[0].starts[1].begin(), w->prefetch[0].starts[1].end()),
                  (std::set<int64_t>{0, 1, 2, 3, 4, 5}));
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->summary->steps, 6);
  CAF_CHECK_EQUAL(w->summary->samples_committed, 12);
  check_exactly(12, 1);
  check_fault_free_order(*w, 6);
  check_handles_released();
  CAF_CHECK_EQUAL(w->respawns.size(), 0u);  // the drafter kept its state
}

CAF_TEST(a work item whose payloads never arrive is issued again with nothing rolled back) {
  // A drafter pulling over an NCCL link whose target died (or whose link
  // failed) reports lost_input: nothing trained; the batches in flight go
  // out again from the ledger's step, as for a replaced target, and the run
  // trains what a fault-free run trains.
  setup s;
  w->script = {act::ok, act::ok, act::no_input};
  start(s);
  sched.run();
  auto reissued = w->events_named("reissued");
  CAF_REQUIRE_EQUAL(reissued.size(), 1u);
  CAF_CHECK_EQUAL(reissued[0]["step"], 2);
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->summary->steps, 6);
  CAF_CHECK_EQUAL(w->summary->samples_committed, 12);
  check_exactly(12, 1);
  check_fault_free_order(*w, 6);
  check_handles_released();
  CAF_CHECK_EQUAL(w->respawns.size(), 0u);  // the drafter kept its state
  CAF_CHECK(w->events_named("drafter_failed").empty());
}

CAF_TEST(a prefetch that dies is restarted with a whole window of credit and the run ends exact) {
  setup s;
  w->script = {act::ok, act::ok, act::ok, act::hang};
  start(s);
  sched.run();
  CAF_REQUIRE_EQUAL(w->steps.size(), 3u);
  caf::anon_send_exit(peers.prefetch[0], caf::exit_reason::kill);
  sched.run();
  auto failed = w->events_named("actor_failed");
  CAF_REQUIRE_EQUAL(failed.size(), 1u);
  CAF_CHECK_EQUAL(failed[0]["role"], "prefetch");
  advance_time(500ms);  // its new incarnation is up while step 4 is still in progress
  sched.run();
  CAF_CHECK_EQUAL(w->prefetch_respawns, 1);
  CAF_CHECK(w->events_named("reissued").empty());
  // Step 4 ends: its credit does not go to the new incarnation (the whole
  // window comes with the rewind), then the rewind.
  self->send(drafter(), go_atom::value);
  sched.run();
  auto reissued = w->events_named("reissued");
  CAF_REQUIRE_EQUAL(reissued.size(), 1u);
  CAF_CHECK_EQUAL(reissued[0]["step"], 4);
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->summary->steps, 6);
  check_exactly(12, 1);
  check_fault_free_order(*w, 6);
  check_handles_released();
  CAF_CHECK(w->prefetch[0].max_outstanding <= 2u);  // never past runtime.credits
}

CAF_TEST(a target past its restart budget stops the run with a checkpoint and then an error naming it) {
  setup s;
  s.sup.restart_budget = 0;
  w->script = {act::ok, act::hang};
  start(s);
  sched.run();
  caf::anon_send_exit(targets[0], caf::exit_reason::kill);
  sched.run();
  CAF_CHECK(!w->error);  // the step in progress finishes first
  self->send(drafter(), go_atom::value);
  sched.run();
  CAF_REQUIRE(w->error.has_value());
  const auto text = sys.render(*w->error);
  CAF_MESSAGE(text);
  CAF_CHECK(contains(text, "target 0 failed 1 times"));
  CAF_CHECK(contains(text, "restart budget 0"));
  CAF_CHECK(contains(text, "stopped after step 2, checkpoint ckpt/step-2"));
  CAF_CHECK_EQUAL(w->target_respawns, 0);
  CAF_REQUIRE_EQUAL(w->written.size(), 1u);
  CAF_CHECK_EQUAL(w->written[0].step, 2);
}
CAF_TEST(batches still at a target when a run stops are released when they come back) {
  setup s;
  start(s);
  w->targets[0].hold = true;
  sched.run();
  CAF_CHECK_EQUAL(w->targets[0].held.size(), 2u);
  self->send(coordinator, stop_atom::value);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK_EQUAL(w->summary->stop_reason, "signal");
  CAF_CHECK_EQUAL(w->summary->steps, 0);
  self->send(targets[0], go_atom::value);
  sched.run();
  CAF_CHECK_EQUAL(w->work_received, 0);
  check_handles_released();
}

CAF_TEST(max_steps ends the run with a final checkpoint) {
  setup s;
  s.opts.max_steps = 3;
  start(s);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK_EQUAL(w->summary->stop_reason, "max_steps");
  CAF_CHECK_EQUAL(w->summary->steps, 3);
  CAF_CHECK_EQUAL(w->summary->checkpoint, "ckpt/step-3");
  CAF_CHECK_EQUAL(w->summary->samples_committed, 6);
  CAF_CHECK_EQUAL(w->steps.size(), 3u);
  check_handles_released();
}

CAF_TEST(a fault or a learning-rate change for a step past max_steps is refused naming the last step) {
  // max_steps 3, paused at step 0: step 3 is the last one, step 4 never comes.
  setup s;
  s.opts.max_steps = 3;
  start(s);
  ask<std::string>(sys, coordinator, control_command{"pause", "tester"});
  sched.run();
  control_command late_fault{"fault", "tester"};
  late_fault.drafter = 0;
  late_fault.kind = "throw";
  late_fault.at_step = 4;
  auto f = ask<std::string>(sys, coordinator, late_fault);
  control_command late_lr{"lr_scale", "tester"};
  late_lr.value = 0.5;
  late_lr.at_step = 4;
  auto l = ask<std::string>(sys, coordinator, late_lr);
  control_command last_lr{"lr_scale", "tester"};
  last_lr.value = 0.5;
  last_lr.at_step = 3;
  auto ok = ask<std::string>(sys, coordinator, last_lr);
  sched.run();
  CAF_REQUIRE(f->error.has_value());
  CAF_CHECK(is(*f->error, errc::bad_input));
  CAF_CHECK(contains(sys.render(*f->error), "step 4 is past the run's last step (3, train.max_steps)"));
  CAF_CHECK(w->faults_armed.empty());
  CAF_REQUIRE(l->error.has_value());
  CAF_CHECK(contains(sys.render(*l->error), "step 4 is past the run's last step"));
  CAF_REQUIRE(ok->value.has_value());
  CAF_CHECK_EQUAL(*ok->value, "learning-rate multiplier 0.5 from step 3");
  ask<std::string>(sys, coordinator, control_command{"resume", "tester"});
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK_EQUAL(w->summary->stop_reason, "max_steps");
  CAF_REQUIRE_EQUAL(w->steps.size(), 3u);
  CAF_CHECK_EQUAL(w->steps.back().work.lr_scale, 0.5);
  check_handles_released();
}

CAF_TEST(restore points in shared memory are taken every host_every steps and commit nothing) {
  // host_every 2 over 6 steps: restore points at 2, 4 and 6; the epoch's
  // checkpoint at step 6 waits for the drafter's copy of the restore point
  // of that step and is taken right after it (one snapshot at a time).
  setup s;
  s.opts.host_every = 2;
  launch_with_host(s);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(host_steps(), (std::vector<int64_t>{2, 4, 6}));
  auto points = w->events_named("restore_point");
  CAF_REQUIRE_EQUAL(points.size(), 3u);
  CAF_CHECK_EQUAL(points[0]["tier"], "host");
  CAF_CHECK_EQUAL(points[0]["dir"], "shm/step-2");
  // Each restore point carries the ledger its step holds, for a new worker.
  CAF_REQUIRE_EQUAL(w->host_extras.size(), 3u);
  CAF_CHECK_EQUAL(w->host_extras[1]["step"], 4);
  // Only the checkpoint commits: one, at the epoch's end, all 12 samples.
  auto ckpts = w->events_named("checkpoint");
  CAF_REQUIRE_EQUAL(ckpts.size(), 1u);
  CAF_CHECK_EQUAL(ckpts[0]["step"], 6);
  CAF_CHECK_EQUAL(ckpts[0]["committed_now"], 12);
  CAF_CHECK_EQUAL(w->summary->checkpoint, "ckpt/step-6");
  check_exactly(12, 1);
  check_handles_released();
}

CAF_TEST(a single drafter trains on while a restore point copies up to the next snapshot step) {
  // host_every 3, checkpoint_every 4, 12 steps; each snapshot answers a
  // turn later, as the real drafter's poll does.  The restore points of
  // steps 6 and 9 copy while steps 7 and 10 train; that of step 3 does
  // not (step 4 is a checkpoint's: taken at its very step), nor do the
  // checkpoints (their copies hold the drafter).  Each restore point and
  // checkpoint holds its own step's weights and ledger; the epoch's end,
  // at step 12, is in step 12's checkpoint already and not written twice.
  setup s;
  s.samples = 24;
  s.opts.host_every = 3;
  s.opts.checkpoint_every = 4;
  s.opts.credits = 4;  // features queued ahead: work is there to send
  w->snapshot_polls = true;
  launch_with_host(s);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->steps_while_snapshotting, (std::vector<int64_t>{7, 10}));
  CAF_CHECK_EQUAL(host_steps(), (std::vector<int64_t>{3, 6, 9}));
  CAF_REQUIRE_EQUAL(w->host_extras.size(), 3u);
  CAF_CHECK_EQUAL(w->host_extras[1]["step"], 6);
  CAF_CHECK_EQUAL(w->host_extras[2]["step"], 9);
  CAF_CHECK_EQUAL(checkpoint_steps(), (std::vector<int64_t>{4, 8, 12}));
  for (const auto& [dir, held] : w->checkpoints)  // 2 samples a step
    CAF_CHECK_EQUAL(static_cast<int64_t>(held.second.size()), 2 * held.first);
  check_exactly(24, 1);
  check_handles_released();
}

CAF_TEST(a drafter that dies in a step sent beside its restore point copy does not hold up the next restore point) {
  // host_every 3, 12 steps, restore points in device memory: step 7 is sent
  // while the restore point of step 6 copies, and the drafter dies in it,
  // its snapshot never answered (a dead actor answers nothing).  The
  // restore point of step 6 is given up with it; the new incarnation
  // (restored from device memory, step 6) takes those of steps 9 and 12 at
  // their steps, not after the lost request's 10-minute deadline.
  setup s;
  s.samples = 24;
  s.opts.credits = 4;
  s.opts.host_every = 3;
  w->snapshot_polls = true;
  w->memory_tier = true;
  w->script = {act::ok, act::ok, act::ok, act::ok, act::ok, act::ok, act::die};
  launch_with_host(s);
  sched.run();
  advance_time(500ms);  // the restart's backoff
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->events_named("drafter_failed").size(), 1u);
  CAF_CHECK_EQUAL(host_steps(), (std::vector<int64_t>{3, 9, 12}));
  CAF_CHECK_EQUAL(w->summary->steps, 12);
  check_exactly(24, 1);
  check_handles_released();
}

CAF_TEST(a drafter lost with its restore point snapshot at the epoch end is checkpointed once it is back) {
  // host_every 6 over a 6-step epoch: the restore point of step 6 is asked
  // first, the epoch's checkpoint waits for it, and the drafter dies taking
  // that snapshot.  Restored from device memory at step 6 (nothing lost),
  // the new incarnation takes the epoch's checkpoint and the run ends.
  setup s;
  s.opts.host_every = 6;
  w->memory_tier = true;
  w->die_on_snapshot_at = 6;
  launch_with_host(s);
  run_past_the_snapshot_death();
  CAF_CHECK_EQUAL(w->summary->stop_reason, "epochs");
  CAF_CHECK_EQUAL(checkpoint_steps(), (std::vector<int64_t>{6}));
  check_exactly(12, 1);
  check_handles_released();
}

CAF_TEST(evaluations take snapshots every eval_every steps and the final weights once) {
  // eval_every 2 over a 6-step epoch: evaluations of steps 2, 4 and 6, each
  // an "eval" event; the epoch's checkpoint at step 6 follows the eval's
  // snapshot of that step; step 6 is evaluated already, so the end adds none.
  setup s;
  s.opts.eval_every = 2;
  start_with_eval(s);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->evaluated, (std::vector<int64_t>{2, 4, 6}));
  auto evals = w->events_named("eval");
  CAF_REQUIRE_EQUAL(evals.size(), 3u);
  CAF_CHECK_EQUAL(evals[2]["step"], 6);
  CAF_CHECK_EQUAL(evals[2]["tau"], 1.6);
  CAF_CHECK_EQUAL(w->summary->eval_step, 6);
  CAF_CHECK_EQUAL(w->summary->eval_tau, 1.6);
  auto ckpts = w->events_named("checkpoint");
  CAF_REQUIRE_EQUAL(ckpts.size(), 1u);
  CAF_CHECK_EQUAL(ckpts[0]["step"], 6);
  check_exactly(12, 1);
  check_handles_released();
}

CAF_TEST(the run waits for its final evaluation and answers after it) {
  // eval_every 0, at_end: one evaluation, of the final step, whose event
  // comes before the end event; the summary carries its τ.
  setup s;
  s.opts.max_steps = 3;
  start_with_eval(s);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK_EQUAL(w->evaluated, (std::vector<int64_t>{3}));
  CAF_CHECK_EQUAL(w->summary->eval_step, 3);
  size_t eval_at = 0, end_at = 0;
  for (size_t i = 0; i < w->events.size(); ++i) {
    if (w->events[i].value("event", "") == "eval")
      eval_at = i;
    if (w->events[i].value("event", "") == "end")
      end_at = i;
  }
  CAF_CHECK(eval_at < end_at);
  check_handles_released();
}

CAF_TEST(a failed evaluation is an event and training goes on) {
  setup s;
  s.opts.eval_every = 2;
  w->eval_fails = true;
  start_with_eval(s);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->summary->steps, 6);
  CAF_CHECK_EQUAL(w->summary->eval_step, -1);
  auto evals = w->events_named("eval");
  CAF_REQUIRE(!evals.empty());
  CAF_CHECK_EQUAL(evals[0]["error"], "fake: out of memory");
  check_exactly(12, 1);
  check_handles_released();
}

CAF_TEST(a drafter that dies taking the snapshot for an evaluation does not hold up the evaluations after it) {
  // eval_every 2 over a 6-step epoch, restore points in device memory: the
  // drafter dies while it copies the snapshot of step 2 for the evaluation,
  // its answer never sent (a dead actor answers nothing).  The evaluation
  // is given up with it (its event carries the error); the new
  // incarnation, restored at step 2, is evaluated at steps 4 and 6 and the
  // run ends, not after the lost request's 10-minute deadline.
  setup s;
  s.opts.eval_every = 2;
  w->memory_tier = true;
  w->snapshot_polls = true;
  w->die_polling_snapshot = true;
  w->die_on_snapshot_at = 2;
  start_with_eval(s);
  run_past_the_snapshot_death();
  CAF_CHECK_EQUAL(w->evaluated, (std::vector<int64_t>{4, 6}));
  auto evals = w->events_named("eval");
  CAF_REQUIRE_EQUAL(evals.size(), 3u);
  CAF_CHECK_EQUAL(evals[0]["step"], 2);
  CAF_CHECK(evals[0].value("error", "").find("failed before its snapshot for the evaluation came") != std::string::npos);
  CAF_CHECK_EQUAL(w->summary->eval_step, 6);
  check_exactly(12, 1);
  check_handles_released();
}

CAF_TEST(a lost device context fails the run at once without a restart) {
  // device_lost: nothing on the device can run again in this process (no
  // restart, no last snapshot); the end event names the durable step.
  setup s;
  s.opts.checkpoint_every = 2;
  w->script = {act::ok, act::ok, act::ok, act::lose_device};
  start(s);
  sched.run();
  CAF_REQUIRE(w->error.has_value());
  CAF_CHECK(!w->summary);
  CAF_CHECK(is(*w->error, errc::device_lost));
  CAF_CHECK(contains(sys.render(*w->error), "illegal memory access"));
  CAF_CHECK(w->events_named("drafter_failed").empty());
  advance_time(5s);
  sched.run();
  CAF_CHECK(w->respawns.empty());
  auto end = w->events_named("end");
  CAF_REQUIRE_EQUAL(end.size(), 1u);
  CAF_CHECK_EQUAL(end[0]["reason"], "error");
  CAF_CHECK_EQUAL(end[0]["durable_step"], 2);
}

CAF_TEST(a checkpointer error reaches the run request) {
  setup s;
  s.samples = 4;
  w->fail_writes = 1;
  start(s);
  sched.run();
  CAF_CHECK(!w->summary);
  CAF_REQUIRE(w->error.has_value());
  CAF_CHECK(is(*w->error, errc::bad_input));
  CAF_CHECK(contains(sys.render(*w->error), "disk full"));
}

CAF_TEST(a checkpoint written after a failure does not move the restore point) {
  // The write of the step-2 snapshot is still in progress when the drafter
  // dies at step 4: the run rolls back to the last durable state (none), and
  // the late step-2 checkpoint holds weights of the abandoned history.
  setup s;
  s.opts.checkpoint_every = 2;
  w->hold_writes = true;
  w->script = {act::ok, act::ok, act::ok, act::die};
  start(s);
  sched.run();
  auto failed = w->events_named("drafter_failed");
  CAF_REQUIRE_EQUAL(failed.size(), 1u);
  CAF_CHECK_EQUAL(failed[0]["restore_step"], 0);
  self->send(checkpointer, go_atom::value);  // the write completes now
  sched.run();
  CAF_CHECK_EQUAL(w->events_named("checkpoint_discarded").size(), 1u);
  auto st = status();
  CAF_CHECK_EQUAL(st["step"], 0);
  advance_time(500ms);
  sched.run();
  CAF_REQUIRE_EQUAL(w->respawns.size(), 1u);
  CAF_CHECK_EQUAL(w->respawns[0].second, "");
  CAF_REQUIRE(w->summary.has_value());
  check_exactly(12, 1);
  check_handles_released();
}

CAF_TEST(checkpoints that come due while one is written coalesce into the newest state) {
  setup s;
  s.opts.checkpoint_every = 2;
  w->hold_writes = true;  // the step-2 write takes longer than the steps after it
  start(s);
  sched.run();
  std::vector<int64_t> skipped;
  for (auto& e : w->events_named("checkpoint_skipped")) {
    skipped.push_back(e["step"].get<int64_t>());
    CAF_CHECK_EQUAL(e["writing"], 2);
  }
  CAF_CHECK_EQUAL(skipped, (std::vector<int64_t>{4, 6}));
  CAF_CHECK(w->written.empty());
  self->send(checkpointer, go_atom::value);  // the step-2 write ends; the newest (6, the epoch's end) is next
  sched.run();
  std::vector<int64_t> written;
  for (auto& x : w->written)
    written.push_back(x.step);
  CAF_CHECK_EQUAL(written, (std::vector<int64_t>{2, 6}));
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK_EQUAL(w->summary->checkpoint, "ckpt/step-6");
  check_exactly(12, 1);
  check_handles_released();
}

CAF_TEST(run requests are checked and answered with errors) {
  setup s;
  start(s);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  // A second coordinator for the malformed requests.
  auto c2 = spawn_coordinator(sys, coordinator_options{});
  everyone.push_back(caf::actor_cast<caf::actor>(c2));
  auto none = peers;
  none.drafters.clear();
  auto a = ask<run_summary>(sys, c2, run_atom::value, none);
  sched.run();
  CAF_REQUIRE(a->error.has_value());
  CAF_CHECK(is(*a->error, errc::bad_input));
  CAF_CHECK(contains(sys.render(*a->error), "no drafter"));
  auto uneven = peers;
  uneven.targets.push_back(uneven.targets.front());
  auto b = ask<run_summary>(sys, c2, run_atom::value, uneven);
  sched.run();
  CAF_REQUIRE(b->error.has_value());
  CAF_CHECK(contains(sys.render(*b->error), "one prefetch per target"));
  // A coordinator that is running refuses a second run.
  auto c3 = spawn_coordinator(sys, supervised([] {
    coordinator_options o;
    o.num_samples = 4;
    return o;
  }()));
  everyone.push_back(caf::actor_cast<caf::actor>(c3));
  coordinator_peers idle;  // peers that never answer: the run stays in progress
  auto dummy = [](caf::event_based_actor*) -> caf::behavior { return {[](caf::ok_atom) {}}; };
  auto sink = sys.spawn(dummy);
  everyone.push_back(sink);
  idle.prefetch.push_back(caf::actor_cast<prefetch_actor>(sink));
  idle.targets.push_back(caf::actor_cast<target_actor>(sink));
  idle.drafters.push_back(caf::actor_cast<drafter_actor>(sink));
  idle.checkpointer = caf::actor_cast<checkpointer_actor>(sink);
  idle.metrics = caf::actor_cast<metrics_actor>(sink);
  auto first = ask<run_summary>(sys, c3, run_atom::value, idle);
  auto second = ask<run_summary>(sys, c3, run_atom::value, idle);
  sched.run();
  CAF_CHECK(!first->answered());
  CAF_REQUIRE(second->error.has_value());
  CAF_CHECK(contains(sys.render(*second->error), "already in progress"));
  // Without a supervisor nothing could restart a drafter: refused.
  auto c4 = spawn_coordinator(sys, [] {
    coordinator_options o;
    o.num_samples = 12;
    return o;
  }());
  everyone.push_back(caf::actor_cast<caf::actor>(c4));
  auto unsupervised = ask<run_summary>(sys, c4, run_atom::value, peers);
  sched.run();
  CAF_REQUIRE(unsupervised->error.has_value());
  CAF_CHECK(is(*unsupervised->error, errc::bad_input));
  CAF_CHECK(contains(sys.render(*unsupervised->error), "no supervisor"));
}

CAF_TEST(a resume ledger that does not fit is an error for the run request) {
  // Checked before the run's response promise exists: an error returned
  // after it would be dropped by CAF and the launcher would wait forever.
  setup s;
  s.opts.resume_ledger = sample_ledger(5).save();  // the dataset has 12 samples
  s.opts.resume_step = 40;
  spawn_all(s);
  launch(peers);
  sched.run();
  CAF_REQUIRE(w->error.has_value());
  CAF_CHECK(is(*w->error, errc::bad_input));
  CAF_CHECK(contains(sys.render(*w->error), "covers 5 samples, the dataset has 12"));
  CAF_CHECK_EQUAL(w->work_received, 0);
  CAF_CHECK_EQUAL(w->prefetch[0].credits_received, 0);
  // Malformed text too (the ledger's parser throws).
  auto c2 = spawn_coordinator(sys, supervised([] {
    coordinator_options o;
    o.num_samples = 12;
    o.resume_ledger = "{not json";
    return o;
  }()));
  everyone.push_back(caf::actor_cast<caf::actor>(c2));
  auto a = ask<run_summary>(sys, c2, run_atom::value, peers);
  sched.run();
  CAF_REQUIRE(a->error.has_value());
  CAF_CHECK(is(*a->error, errc::bad_input));
  CAF_CHECK(contains(sys.render(*a->error), "resume"));
}

CAF_TEST(a resumed run continues from its ledger and step) {
  // Samples 0-5 were committed by the checkpoint at step 3 (2 per batch).
  sample_ledger done(12);
  auto b = done.issue({0, 1, 2, 3, 4, 5});
  done.trained(b, 3);
  done.durable(3);
  setup s;
  s.opts.resume_ledger = done.save();
  s.opts.resume_step = 3;
  s.opts.resume_checkpoint = "ckpt/step-3";
  w->checkpoints["ckpt/step-3"] = {3, {0, 1, 2, 3, 4, 5}};
  spawn_all(s);
  // The drafter restored from that checkpoint replaces the fresh one.
  caf::anon_send_exit(w->incarnations[0], caf::exit_reason::kill);
  w->incarnations.clear();
  peers.drafters = {spawn_drafter_incarnation(0, 3, {0, 1, 2, 3, 4, 5})};
  launch(peers);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK_EQUAL(w->summary->steps, 6);  // 3 + the 3 batches of samples 6-11
  CAF_CHECK_EQUAL(w->summary->samples_committed, 12);
  CAF_CHECK_EQUAL(samples_of(w->prefetch[0].sent), (std::set<int64_t>{6, 7, 8, 9, 10, 11}));
  check_exactly(12, 1);
}

/// A run resumed at the epoch's last step (6; all 12 samples committed)
/// from `from` on disk or from a restore point in shared memory: the
/// checkpoints it writes to disk before it ends.
std::vector<int64_t> resumed_at_the_end(fixture& f, bool on_disk) {
  sample_ledger done(12);
  for (int64_t k = 0; k < 6; ++k) {
    auto b = done.issue({2 * k, 2 * k + 1});
    done.trained(b, k + 1);
  }
  done.durable(6);
  setup s;
  s.opts.resume_ledger = done.save();
  s.opts.resume_step = 6;
  s.opts.resume_checkpoint = on_disk ? "ckpt/step-6" : "shm/step-6";
  s.opts.resume_on_disk = on_disk;
  std::vector<int64_t> all{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  f.w->checkpoints[s.opts.resume_checkpoint] = {6, all};
  f.spawn_all(s);
  caf::anon_send_exit(f.w->incarnations[0], caf::exit_reason::kill);
  f.w->incarnations.clear();
  f.peers.drafters = {f.spawn_drafter_incarnation(0, 6, all)};
  f.launch(f.peers);
  f.sched.run();
  CAF_REQUIRE(f.w->summary.has_value());
  CAF_CHECK(!f.w->error);
  CAF_CHECK_EQUAL(f.w->summary->stop_reason, "epochs");
  CAF_CHECK_EQUAL(f.w->summary->steps, 6);
  return f.checkpoint_steps();
}

CAF_TEST(a run resumed at its end from a restore point in shared memory writes that step to disk) {
  // The worker's restore point is removed once the run ends with everything
  // on disk: the end must write it there first.
  CAF_CHECK_EQUAL(resumed_at_the_end(*this, false), (std::vector<int64_t>{6}));
  CAF_CHECK_EQUAL(w->summary->checkpoint, "ckpt/step-6");
}

CAF_TEST(a run resumed at its end from a checkpoint on disk writes nothing again) {
  CAF_CHECK_EQUAL(resumed_at_the_end(*this, true), (std::vector<int64_t>{}));
}

/// Contributing samples of the steps in `steps`, sorted (repeats kept).
std::vector<int64_t> contributed(const std::vector<peer_world::step_rec>& steps) {
  std::vector<int64_t> out;
  for (auto& st : steps)
    if (st.work.contribute)
      out.insert(out.end(), st.work.batch.sample_ids.begin(), st.work.batch.sample_ids.end());
  std::sort(out.begin(), out.end());
  return out;
}

/// Contributing samples of the training the final weights hold after one
/// re-formed group: the first group's steps up to `restore_step`, then every
/// later group's.
std::vector<int64_t> kept_samples(const std::vector<peer_world::step_rec>& steps,
                                  int64_t restore_step) {
  std::vector<peer_world::step_rec> kept;
  for (auto& st : steps)
    if ((st.generation == 1 && st.step <= restore_step) || st.generation >= 2)
      kept.push_back(st);
  return contributed(kept);
}

std::vector<int64_t> iota_to(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

CAF_TEST(data-parallel drafters form one group and step in lockstep with a padded epoch tail) {
  setup s;
  s.drafters = 2;
  s.samples = 14;  // 7 batches: 3 full group steps and a tail of one
  s.opts.credits = 4;
  start(s);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  // One group: drafter 0 is rank 0 and made the id; drafter 1 joined as rank 1.
  CAF_REQUIRE_EQUAL(w->joins.size(), 2u);
  CAF_CHECK_EQUAL(w->ids_made, 1);
  for (auto& j : w->joins) {
    CAF_CHECK_EQUAL(j.generation, 1);
    CAF_CHECK_EQUAL(j.world, 2);
    CAF_CHECK_EQUAL(j.rank, j.drafter);
  }
  CAF_CHECK_EQUAL(w->events_named("group_formed").size(), 1u);
  // 4 group steps, each dispatched to both ranks at the same step.
  CAF_CHECK_EQUAL(w->summary->steps, 4);
  CAF_CHECK_EQUAL(w->summary->samples_committed, 14);
  CAF_REQUIRE_EQUAL(w->steps.size(), 8u);
  std::map<int64_t, std::set<int32_t>> ranks_at;
  int padded = 0;
  for (auto& st : w->steps) {
    ranks_at[st.step].insert(st.drafter);
    padded += !st.work.contribute;
  }
  CAF_CHECK_EQUAL(ranks_at.size(), 4u);
  for (auto& [step, ranks] : ranks_at)
    CAF_CHECK_EQUAL(ranks.size(), 2u);
  // The tail: one real batch, one copy that contributes nothing.
  CAF_CHECK_EQUAL(padded, 1);
  CAF_CHECK(contributed(w->steps) == iota_to(14));
  // Metrics see the contributing reports only.
  CAF_CHECK_EQUAL(w->reports.size(), 7u);
  CAF_REQUIRE_EQUAL(w->written.size(), 1u);
  CAF_CHECK_EQUAL(w->written[0].step, 4);
  check_handles_released();
}

CAF_TEST(a data-parallel drafter that dies is restarted and the group re-formed from its restored state) {
  setup s;
  s.drafters = 2;
  s.samples = 16;  // 8 batches, 4 group steps
  s.opts.credits = 4;
  s.opts.checkpoint_every = 2;
  w->drafter_script[1] = {act::ok, act::ok, act::ok, act::die};  // dies in group step 4
  // The survivor cannot say where its state is: back to the checkpoint.
  w->drafter_script[0] = {act::ok, act::ok, act::ok, act::lost};
  // The broken group's communicators are aborted for the survivors at once.
  std::vector<std::pair<std::vector<uint8_t>, std::string>> aborted;
  s.opts.abort_group = [&aborted](const std::vector<uint8_t>& id, const std::string& why) {
    aborted.emplace_back(id, why);
  };
  start(s);
  sched.run();
  CAF_CHECK(!w->summary && !w->error);
  auto failed = w->events_named("drafter_failed");
  CAF_REQUIRE_EQUAL(failed.size(), 1u);
  CAF_CHECK_EQUAL(failed[0]["drafter"], 1);
  CAF_REQUIRE_EQUAL(aborted.size(), 1u);
  CAF_CHECK(aborted[0].first == std::vector<uint8_t>(8, 1));  // the first group's id (fake_peers)
  TANDEM_CHECK_MSG(aborted[0].second.find("drafter 1") != std::string::npos, aborted[0].second);
  CAF_CHECK_EQUAL(failed[0]["restore_step"], 2);
  CAF_CHECK_EQUAL(failed[0]["steps_lost"], 1);
  // The second group's rank 0 is the restarted drafter (restored from the
  // checkpoint); the survivor takes its state.
  finish_regrouped("ckpt/step-2", /*root=*/1, /*step=*/2);
  CAF_CHECK_EQUAL(w->respawns[0].first, 1);
  // Exactly once: the durable steps of the first group plus every step of
  // the second cover each sample once; step 3 (trained, not durable) does
  // not count.
  CAF_CHECK(kept_samples(w->steps, 2) == iota_to(16));
  CAF_CHECK(std::any_of(w->steps.begin(), w->steps.end(),
                        [](auto& st) { return st.generation == 1 && st.step == 3; }));
  CAF_CHECK_EQUAL(aborted.size(), 1u);  // the second group ended cleanly
  check_handles_released();
}

CAF_TEST(a data-parallel drafter that dies inside a step loses no step when the survivor skipped its update) {
  setup s;
  s.drafters = 2;
  s.samples = 16;  // 8 batches, 4 group steps
  s.opts.credits = 4;
  s.opts.checkpoint_every = 2;
  w->drafter_script[1] = {act::ok, act::ok, act::ok, act::die};  // dies in group step 4
  w->drafter_script[0] = {act::ok, act::ok, act::ok, act::cut};  // its collective cut short
  int aborts = 0;
  s.opts.abort_group = [&aborts](const std::vector<uint8_t>&, const std::string&) { ++aborts; };
  start(s);
  sched.run();
  auto failed = w->events_named("drafter_failed");
  CAF_REQUIRE_EQUAL(failed.size(), 1u);
  CAF_CHECK_EQUAL(failed[0]["drafter"], 1);
  CAF_CHECK_EQUAL(failed[0]["restore_from"], "peers");
  CAF_CHECK_EQUAL(failed[0]["restore_step"], 3);
  CAF_CHECK_EQUAL(failed[0]["steps_lost"], 0);
  CAF_CHECK_EQUAL(aborts, 1);
  finish_regrouped("ckpt/step-2", /*root=*/0, /*step=*/3);  // respawned from step 2, then the survivor's broadcast
  // Step 3 of the first group stays (no rollback); step 4 is trained again.
  CAF_CHECK(kept_samples(w->steps, 3) == iota_to(16));
  check_handles_released();
}

CAF_TEST(a checkpoint being written when a data-parallel drafter dies stays valid when the survivor holds the state) {
  setup s;
  s.drafters = 2;
  s.samples = 16;  // 8 batches, 4 group steps
  s.opts.credits = 4;
  s.opts.checkpoint_every = 2;
  w->hold_writes = true;  // the step-2 checkpoint is still being written at step 4
  w->drafter_script[1] = {act::ok, act::ok, act::ok, act::die};
  w->drafter_script[0] = {act::ok, act::ok, act::ok, act::cut};
  start(s);
  sched.run();
  auto failed = w->events_named("drafter_failed");
  CAF_REQUIRE_EQUAL(failed.size(), 1u);
  CAF_CHECK_EQUAL(failed[0]["restore_from"], "peers");
  CAF_CHECK_EQUAL(failed[0]["steps_lost"], 0);
  self->send(checkpointer, go_atom::value);  // the write completes now
  sched.run();
  // Nothing was rolled back past step 2: its checkpoint is a restore point.
  CAF_CHECK_EQUAL(w->events_named("checkpoint_discarded").size(), 0u);
  auto written = w->events_named("checkpoint");
  CAF_REQUIRE(!written.empty());
  CAF_CHECK_EQUAL(written[0]["step"], 2);
  advance_time(500ms);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->summary->steps, 4);
  CAF_CHECK_EQUAL(w->summary->samples_committed, 16);
  CAF_CHECK(kept_samples(w->steps, 3) == iota_to(16));
  check_handles_released();
}

CAF_TEST(a drafter restarted from an older checkpoint than one written meanwhile does not lead the next group) {
  // Drafter 0 answers the step-2 snapshot, then dies in step 3; the
  // survivor skipped that update.  Its restart names the checkpoint durable
  // then (none); the step-2 write completes before it comes up.  Its
  // weights are not step 2's: the survivor must be the next group's rank 0.
  setup s;
  s.drafters = 2;
  s.samples = 16;  // 8 batches, 4 group steps
  s.opts.credits = 4;
  s.opts.checkpoint_every = 2;
  w->hold_writes = true;
  w->drafter_script[0] = {act::ok, act::ok, act::die};
  w->drafter_script[1] = {act::ok, act::ok, act::cut};
  start(s);
  sched.run();
  auto failed = w->events_named("drafter_failed");
  CAF_REQUIRE_EQUAL(failed.size(), 1u);
  CAF_CHECK_EQUAL(failed[0]["drafter"], 0);
  CAF_CHECK_EQUAL(failed[0]["restore_from"], "peers");
  CAF_CHECK_EQUAL(failed[0]["restore_step"], 2);
  self->send(checkpointer, go_atom::value);  // step 2 becomes durable before the restart
  sched.run();
  // Respawned from what was durable when it failed (nothing); the survivor
  // leads the next group, not the fresh incarnation.
  finish_regrouped("", /*root=*/1, /*step=*/2);
  CAF_CHECK(kept_samples(w->steps, 2) == iota_to(16));
  check_handles_released();
}

CAF_TEST(a step completed by the survivor of a rank that died after its collective counts toward max_steps) {
  setup s;
  s.drafters = 2;
  s.samples = 16;
  s.opts.credits = 4;
  s.opts.checkpoint_every = 2;
  s.opts.max_steps = 3;
  w->drafter_script[1] = {act::ok, act::ok, act::die_after};  // step 3 is in the survivor
  start(s);
  sched.run();
  advance_time(500ms);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->summary->steps, 3);
  CAF_CHECK_EQUAL(w->summary->stop_reason, "max_steps");
  CAF_CHECK(std::none_of(w->steps.begin(), w->steps.end(), [](auto& st) { return st.step > 3; }));
  CAF_CHECK_EQUAL(w->summary->samples_committed, 12);  // 3 steps of 2 batches of 2
  check_handles_released();
}

CAF_TEST(a checkpoint due at a step the survivor completed is taken from the survivor) {
  // Drafter 0 dies after the collective of step 2, where a checkpoint is
  // due: drafter 1 holds step 2 and is the one snapshotted.
  setup s;
  s.drafters = 2;
  s.samples = 16;
  s.opts.credits = 4;
  s.opts.checkpoint_every = 2;
  w->drafter_script[0] = {act::ok, act::die_after};
  start(s);
  sched.run();
  auto written = w->events_named("checkpoint");
  CAF_REQUIRE(!written.empty());
  CAF_CHECK_EQUAL(written[0]["step"], 2);
  CAF_REQUIRE(!w->written.empty());
  CAF_CHECK_EQUAL(w->written[0].drafter, 1);
  CAF_CHECK_EQUAL(w->written[0].step, 2);
  advance_time(500ms);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->summary->steps, 4);
  CAF_CHECK_EQUAL(w->summary->samples_committed, 16);
  CAF_CHECK(kept_samples(w->steps, 2) == iota_to(16));
  check_handles_released();
}

CAF_TEST(a data-parallel drafter that dies after the collective of its step leaves the whole step in the survivor) {
  setup s;
  s.drafters = 2;
  s.samples = 16;  // 8 batches, 4 group steps
  s.opts.credits = 4;
  s.opts.checkpoint_every = 2;
  w->drafter_script[1] = {act::ok, act::ok, act::ok, act::die_after};  // its gradient is in step 4
  start(s);
  sched.run();
  auto failed = w->events_named("drafter_failed");
  CAF_REQUIRE_EQUAL(failed.size(), 1u);
  CAF_CHECK_EQUAL(failed[0]["drafter"], 1);
  CAF_CHECK_EQUAL(failed[0]["restore_from"], "peers");
  CAF_CHECK_EQUAL(failed[0]["restore_step"], 4);
  CAF_CHECK_EQUAL(failed[0]["steps_lost"], 0);
  CAF_CHECK_EQUAL(failed[0]["samples_reissued"], 0);  // every sample is trained
  advance_time(500ms);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->summary->steps, 4);
  CAF_CHECK_EQUAL(w->summary->samples_committed, 16);
  CAF_CHECK(kept_samples(w->steps, 4) == iota_to(16));
  check_handles_released();
}

CAF_TEST(a non-finite loss in a group loses no step: the survivors hold the state) {
  setup s;
  s.drafters = 2;
  s.samples = 16;  // 8 batches, 4 group steps
  s.opts.credits = 4;
  s.opts.checkpoint_every = 0;  // no checkpoint: a rollback would lose everything
  w->drafter_script[1] = {act::ok, act::ok, act::nan};
  w->drafter_script[0] = {act::ok, act::ok, act::skip};  // every rank skips the NaN step
  start(s);
  sched.run();
  auto failed = w->events_named("drafter_failed");
  CAF_REQUIRE_EQUAL(failed.size(), 1u);
  CAF_CHECK_EQUAL(failed[0]["drafter"], 1);
  CAF_CHECK_EQUAL(failed[0]["restore_from"], "peers");
  CAF_CHECK_EQUAL(failed[0]["restore_step"], 2);
  CAF_CHECK_EQUAL(failed[0]["steps_lost"], 0);
  CAF_CHECK_EQUAL(failed[0]["samples_reissued"], 8);  // in flight: the NaN step's 2 batches, 2 queued
  finish_regrouped("", /*root=*/0, /*step=*/2);  // no checkpoint: fresh, then the survivor's broadcast
  CAF_CHECK(kept_samples(w->steps, 2) == iota_to(16));
  check_handles_released();
}

CAF_TEST(a data-parallel drafter that misses its heartbeat between steps loses no step) {
  setup s;
  s.drafters = 2;
  s.opts.heartbeat_s = 3;
  s.opts.checkpoint_every = 0;  // no checkpoint: only the survivor holds step 1
  start(s);
  w->targets[0].hold = true;
  w->targets[0].stay_held = true;
  sched.run();
  caf::anon_send(targets[0], go_atom::value);  // the two held batches: one group step
  sched.run();
  CAF_REQUIRE_EQUAL(w->steps.size(), 2u);
  CAF_CHECK_EQUAL(w->steps[0].step, 1);
  // Both idle, the group at rest; drafter 1 stops answering.
  w->muted.insert(1);
  advance_time(3250ms);
  sched.run();
  advance_time(3500ms);
  sched.run();
  auto failed = w->events_named("drafter_failed");
  CAF_REQUIRE_EQUAL(failed.size(), 1u);
  CAF_CHECK_EQUAL(failed[0]["drafter"], 1);
  CAF_CHECK(contains(failed[0]["reason"].get<std::string>(), "drafter 1 missed its heartbeat"));
  CAF_CHECK_EQUAL(failed[0]["restore_from"], "peers");
  CAF_CHECK_EQUAL(failed[0]["restore_step"], 1);
  CAF_CHECK_EQUAL(failed[0]["steps_lost"], 0);
  w->muted.clear();
  advance_time(500ms);  // the backoff: drafter 1 restarts (fresh), the group re-forms from drafter 0
  sched.run();
  auto formed = w->events_named("group_formed");
  CAF_REQUIRE_EQUAL(formed.size(), 2u);
  CAF_CHECK_EQUAL(formed[1]["root"], 0);
  CAF_CHECK_EQUAL(formed[1]["step"], 1);
  w->targets[0].stay_held = false;
  caf::anon_send(targets[0], go_atom::value);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->summary->steps, 3);  // 6 batches of 2 samples, 2 a step
  CAF_CHECK_EQUAL(w->summary->samples_committed, 12);
  CAF_CHECK(kept_samples(w->steps, 1) == iota_to(12));
  check_handles_released();
}

CAF_TEST(a data-parallel run needs credits for one batch per drafter) {
  setup s;
  s.drafters = 3;
  s.opts.credits = 2;
  start(s);
  sched.run();
  CAF_REQUIRE(w->error.has_value());
  CAF_CHECK(is(*w->error, errc::bad_input));
  CAF_CHECK(contains(sys.render(*w->error), "runtime.credits"));
}

CAF_TEST(an unexpected message is answered with unexpected_message) {
  setup s;
  start(s);
  sched.run();
  auto a = ask<std::string>(sys, caf::actor_cast<caf::actor>(coordinator), std::string("hello"));
  sched.run();
  CAF_REQUIRE(a->error.has_value());
  CAF_CHECK(is(*a->error, errc::unexpected_message));
  CAF_CHECK(contains(sys.render(*a->error), "hello"));
}

CAF_TEST(stop before the run starts ends the run at once) {
  // A signal can come before the launcher's run request is handled.
  setup s;
  spawn_all(s);
  self->send(coordinator, stop_atom::value);
  sched.run();
  launch(peers);
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK_EQUAL(w->summary->stop_reason, "signal");
  CAF_CHECK_EQUAL(w->summary->steps, 0);
  CAF_CHECK_EQUAL(w->work_received, 0);
  check_handles_released();
}

CAF_TEST(shutting the supervisor down ends the current drafter incarnations and shutting the coordinator down ends only it) {
  setup s;
  w->script = {act::die, act::hang};
  start(s);
  sched.run();
  advance_time(500ms);  // the backoff: the second incarnation takes the item and hangs
  sched.run();
  CAF_REQUIRE_EQUAL(w->respawns.size(), 1u);
  auto exit_c = watch(sys, coordinator);
  auto exit_d = watch(sys, drafter());
  sched.run();
  self->send(supervisor, shutdown_atom::value);
  sched.run();
  CAF_CHECK_EQUAL(exit_d->reasons.size(), 1u);
  CAF_CHECK_EQUAL(exit_c->reasons.size(), 0u);
  self->send(coordinator, shutdown_atom::value);
  sched.run();
  CAF_CHECK_EQUAL(exit_c->reasons.size(), 1u);
}

CAF_TEST(the control endpoint pauses the work then checkpoints at rest and resumes) {
  // The pause arrives right after the run request: no work goes out, the
  // targets fill their credits; a checkpoint then is written at once (no
  // step in progress); resume trains the epoch to its end, exactly once.
  setup s;
  start(s);
  auto paused = ask<std::string>(sys, coordinator, control_command{"pause", "tester"});
  sched.run();
  CAF_REQUIRE(paused->value.has_value());
  CAF_CHECK_EQUAL(*paused->value, "paused at step 0");
  CAF_CHECK(w->steps.empty());
  CAF_CHECK(!w->summary.has_value());
  auto st = status();
  CAF_CHECK_EQUAL(st["paused"], true);
  CAF_CHECK_EQUAL(st["queued"], 2);  // the credits' worth of features, waiting
  CAF_CHECK_EQUAL(st["drafters"][0]["state"], "idle");
  auto again = ask<std::string>(sys, coordinator, control_command{"pause", "tester"});
  auto ckpt = ask<std::string>(sys, coordinator, control_command{"checkpoint", "tester"});
  sched.run();
  CAF_CHECK_EQUAL(*again->value, "already paused at step 0");
  CAF_CHECK_EQUAL(*ckpt->value, "writing a checkpoint of step 0");
  CAF_REQUIRE_EQUAL(w->written.size(), 1u);
  CAF_CHECK_EQUAL(w->written[0].step, 0);
  auto resumed = ask<std::string>(sys, coordinator, control_command{"resume", "tester"});
  auto bogus = ask<std::string>(sys, coordinator, control_command{"frobnicate", "tester"});
  sched.run();
  CAF_CHECK_EQUAL(*resumed->value, "resumed at step 0");
  CAF_REQUIRE(bogus->error.has_value());
  CAF_CHECK(is(*bogus->error, errc::bad_input));
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK_EQUAL(w->summary->stop_reason, "epochs");
  CAF_CHECK_EQUAL(w->summary->steps, 6);
  auto control = w->events_named("control");
  CAF_REQUIRE_EQUAL(control.size(), 3u);  // the repeated pause and the unknown action did nothing
  CAF_CHECK_EQUAL(control[0]["action"], "pause");
  CAF_CHECK_EQUAL(control[0]["source"], "tester");
  CAF_CHECK_EQUAL(control[1]["action"], "checkpoint");
  CAF_CHECK_EQUAL(control[2]["action"], "resume");
  check_exactly(12, 1);
  check_handles_released();
}

CAF_TEST(stop through the control endpoint ends the run stopped with a checkpoint) {
  setup s;
  s.opts.epochs = 3;
  start(s);
  auto paused = ask<std::string>(sys, coordinator, control_command{"pause", "tester"});
  sched.run();
  auto resumed = ask<std::string>(sys, coordinator, control_command{"resume", "tester"});
  auto stop = ask<std::string>(sys, coordinator, control_command{"stop", "tester"});
  sched.run();
  CAF_REQUIRE(stop->value.has_value());
  CAF_CHECK(contains(*stop->value, "stopping after step"));
  CAF_REQUIRE(w->summary.has_value());
  CAF_CHECK(!w->error);
  CAF_CHECK_EQUAL(w->summary->stop_reason, "stopped");
  CAF_CHECK(w->summary->steps < 18);  // stopped before the third epoch's end
  CAF_REQUIRE(!w->written.empty());
  CAF_CHECK_EQUAL(w->written.back().step, w->summary->steps);  // nothing trained is lost
  auto end = w->events_named("end");
  CAF_REQUIRE_EQUAL(end.size(), 1u);
  CAF_CHECK_EQUAL(end[0]["reason"], "stopped");
  CAF_CHECK_EQUAL(end[0]["durable_step"], w->summary->steps);
  auto late = ask<std::string>(sys, coordinator, control_command{"resume", "tester"});
  sched.run();
  CAF_REQUIRE(late->error.has_value());  // nothing to resume once stopping
  check_handles_released();
}

CAF_TEST(the learning-rate multiplier goes out with the work from its step and into the checkpoints) {
  // Paused at step 0: lr_scale 0.5 from step 3, then 0.25 from step 5; a
  // step already under way (or done) is refused.  Every work item carries
  // the multiplier of the step it trains; the checkpoints' ledger holds the
  // schedule (a resume restores it); a fault goes to the drafter named.
  setup s;
  start(s);
  ask<std::string>(sys, coordinator, control_command{"pause", "tester"});
  sched.run();
  control_command half{"lr_scale", "tester"};
  half.value = 0.5;
  half.at_step = 3;
  auto a = ask<std::string>(sys, coordinator, half);
  control_command quarter{"lr_scale", "tester"};
  quarter.value = 0.25;
  quarter.at_step = 5;
  auto b = ask<std::string>(sys, coordinator, quarter);
  control_command past{"lr_scale", "tester"};
  past.value = 2;
  past.at_step = 0;  // default: the first step not yet sent (1, nothing is under way)
  control_command zero{"lr_scale", "tester"};
  zero.value = 0;
  auto z = ask<std::string>(sys, coordinator, zero);
  control_command fault{"fault", "tester"};
  fault.drafter = 0;
  fault.kind = "throw";
  fault.at_step = 4;
  auto f = ask<std::string>(sys, coordinator, fault);
  control_command nobody{"fault", "tester"};
  nobody.drafter = 3;
  nobody.kind = "throw";
  auto n = ask<std::string>(sys, coordinator, nobody);
  sched.run();
  CAF_REQUIRE(a->value.has_value());
  CAF_CHECK_EQUAL(*a->value, "learning-rate multiplier 0.5 from step 3");
  CAF_CHECK_EQUAL(*b->value, "learning-rate multiplier 0.25 from step 5");
  CAF_REQUIRE(z->error.has_value());
  CAF_CHECK(is(*z->error, errc::bad_input));
  CAF_REQUIRE(f->value.has_value());
  CAF_CHECK(contains(*f->value, "armed on drafter 0 for step 4"));
  CAF_REQUIRE(n->error.has_value());
  CAF_REQUIRE_EQUAL(w->faults_armed.size(), 1u);
  CAF_CHECK_EQUAL(w->faults_armed[0].kind, "throw");
  CAF_CHECK_EQUAL(w->faults_armed[0].at_step, 4);
  auto st = status();
  CAF_CHECK_EQUAL(st["lr_changes"].size(), 2u);
  CAF_CHECK_EQUAL(st["lr_scale"], 1.0);
  ask<std::string>(sys, coordinator, control_command{"resume", "tester"});
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  CAF_REQUIRE_EQUAL(w->steps.size(), 6u);
  for (const auto& x : w->steps)
    CAF_CHECK_EQUAL(x.work.lr_scale, x.step < 3 ? 1.0 : x.step < 5 ? 0.5 : 0.25);
  CAF_REQUIRE(!w->extras.empty());
  CAF_CHECK_EQUAL(w->extras.back()["lr_scale"], nlohmann::json::parse("[[3, 0.5], [5, 0.25]]"));
  // Once the steps are done, a change at an earlier step is refused.
  auto late = ask<std::string>(sys, coordinator, past);
  sched.run();
  CAF_CHECK(late->error.has_value());  // the run has ended: not possible now
  check_handles_released();
}

CAF_TEST(log_every goes to the metrics actor and the status shows it) {
  // Its first value is the plan's (train.log_every); a change is kept for
  // the status (GET /v1/status, GET /v1/config); a bad one changes nothing.
  setup s;
  s.opts.log_every = 10;
  start(s);
  ask<std::string>(sys, coordinator, control_command{"pause", "tester"});
  sched.run();
  const auto before = status();
  CAF_CHECK_EQUAL(before["log_every"], 10);
  control_command three{"log_every", "tester"};
  three.value = 3;
  auto a = ask<std::string>(sys, coordinator, three);
  control_command zero{"log_every", "tester"};
  zero.value = 0;
  auto z = ask<std::string>(sys, coordinator, zero);
  sched.run();
  CAF_REQUIRE(a->value.has_value());
  CAF_CHECK_EQUAL(*a->value, "a metrics line every 3 steps");
  CAF_REQUIRE(z->error.has_value());
  CAF_CHECK(is(*z->error, errc::bad_input));
  CAF_CHECK_EQUAL(w->log_every, 3);
  const auto after = status();
  CAF_CHECK_EQUAL(after["log_every"], 3);
  ask<std::string>(sys, coordinator, control_command{"resume", "tester"});
  sched.run();
  CAF_REQUIRE(w->summary.has_value());
  check_handles_released();
}

CAF_TEST_FIXTURE_SCOPE_END()
