#pragma once
/// Fake peers of the coordinator (coordinator_protocol_test.cpp): plain
/// event-based typed actors that implement messages/{prefetch,target,
/// drafter,checkpointer,metrics}.hpp without LibTorch, scripted by the test
/// and recording what they see in one shared `peer_world` (everything runs
/// on the deterministic scheduler, on the test thread).
///
/// The fakes behave like the real workers where the coordinator can tell:
/// - prefetch packs only against credits, discovers the end of an epoch only
///   while it holds a credit (as actors/prefetch.cpp's pump does), packs
///   re-issued samples first, and frees a batch only on `release`;
/// - target turns each batch into a work item (or holds batches until `go`);
/// - drafter follows a script per work item (ok, non-finite, die, hang) and
///   measures its idle time on the actor clock, so the test controls it;
///   its "weights" are the list of samples trained into them, which
///   snapshots, checkpoints and restarts carry: the final weights must hold
///   every sample exactly once per epoch (DESIGN.md §3 "exactly once");
/// - checkpointer answers `ckpt/step-<k>` (or an error, or holds until `go`).
/// The extra `go` message of some fakes is test control: the coordinator
/// only sees their protocol interface.

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/metrics_lines.hpp"
#include "actors/spawn.hpp"
#include "support.hpp"

namespace tandem::test {

using go_atom = caf::atom_constant<caf::atom("go")>;

using fake_target_actor = target_actor::extend<caf::reacts_to<go_atom>>;
using fake_drafter_actor = drafter_actor::extend<caf::reacts_to<go_atom>>;
using fake_checkpointer_actor = checkpointer_actor::extend<caf::reacts_to<go_atom>>;

/// The vitals a fake answers (messages/vitals.hpp): who it is, and that
/// it answered; what it handled is the real actors' to count.
inline auto fake_vitals(std::string role, int32_t index) {
  return [role, index](vitals_atom) {
    actor_vitals v;
    v.role = role;
    v.index = index;
    v.answered = true;
    v.last_message = "fake";
    return v;
  };
}

/// What a fake drafter does with one work item.
enum class act {
  ok,    ///< trains: a finite step report
  nan,   ///< reports finite = false (no update)
  die,   ///< quits with errc::device_failure (an exception in the real step)
  hang,  ///< keeps the item and answers only on `go` (a hung step)
  skip,  ///< reports finite = false with a finite loss (a data-parallel peer's NaN
         ///< made the averaged gradient non-finite: every rank skipped the update)
  cut,   ///< reports group_failed at its current step: a survivor whose step's
         ///< collective was cut short by a dead peer (its guarded update skipped)
  lost,  ///< reports group_failed with step -1: a state it cannot vouch for
  die_after,  ///< trains (its gradient is in the step's collective), then quits
              ///< without a report: died after the all-reduce
  lose_device,  ///< quits with errc::device_lost (a sticky CUDA error)
  no_input,  ///< reports lost_input: the item's payloads never arrived over its
             ///< link (its target died, the link failed); nothing trained
};

struct peer_world {
  // -- prefetch -------------------------------------------------------------
  struct prefetch_rec {
    std::vector<int64_t> share;       ///< this prefetch's samples, every epoch
    std::deque<int64_t> queue;        ///< left in the current epoch
    int64_t epoch = -1;
    int64_t generation = -1;
    std::vector<std::vector<int64_t>> starts;  ///< each epoch message's `done` (a rollback's rewind too)
    int32_t credit = 0;               ///< granted and unused
    int64_t credits_received = 0;
    bool exhausted = true;
    std::set<uint64_t> outstanding;   ///< batches sent and not released
    size_t max_outstanding = 0;
    std::vector<std::vector<int64_t>> reissues;
    std::vector<batch_desc> sent;
    int bad_releases = 0;             ///< unknown or repeated handles
  };
  std::vector<prefetch_rec> prefetch;
  int64_t batch_samples = 2;
  uint64_t next_handle = 1;

  // -- target ---------------------------------------------------------------
  struct target_rec {
    bool hold = false;
    bool stay_held = false;           ///< `go` forwards what is held but keeps holding later batches
    std::deque<batch_desc> held;
    std::set<uint64_t> outstanding;   ///< feature handles sent and not released
    size_t max_outstanding = 0;
    int bad_releases = 0;
  };
  std::vector<target_rec> targets;

  // -- drafter --------------------------------------------------------------
  std::deque<act> script;             ///< one per work item; empty: ok
  std::map<int32_t, std::deque<act>> drafter_script;  ///< per drafter index, before `script`
  std::vector<fake_drafter_actor> incarnations;  ///< every drafter spawned, in order
  struct step_rec {
    size_t incarnation = 0;
    int64_t step = 0;
    work_item work;
    int64_t generation = 0;           ///< the data-parallel group it trained in (0: none)
    int32_t drafter = 0;
  };
  std::vector<step_rec> steps;        ///< every finite step any incarnation took
  struct armed_fault {
    int32_t drafter = 0;
    std::string kind;
    int64_t at_step = 0;
  };
  std::vector<armed_fault> faults_armed;  ///< fault_atom messages the drafters received
  int64_t log_every = 0;                  ///< the last log_every_atom the metrics actor received
  int64_t work_received = 0;
  int target_respawns = 0, prefetch_respawns = 0;  ///< supervisor respawns (coordinator tests)
  std::vector<std::pair<int32_t, std::string>> respawns;  ///< (index, checkpoint)
  std::vector<int64_t> final_weights; ///< the newest incarnation's, kept up to date
  std::map<uint64_t, std::pair<int64_t, std::vector<int64_t>>> snapshots;  ///< handle -> (step, weights)
  double loss = 5.0;
  bool mute_heartbeat = false;        ///< heartbeats are never answered (a stuck drafter)
  /// Restore points in device memory (checkpoint.memory_every = 1): every
  /// finite step keeps (step, weights) per drafter and reports it; a respawn
  /// from "memory:<k>" takes them, or dies at once when `memory_gone`.
  bool memory_tier = false;
  bool memory_gone = false;
  std::map<int32_t, std::pair<int64_t, std::vector<int64_t>>> memory;
  int64_t die_on_snapshot_at = -1;    ///< a snapshot asked at this step kills the drafter instead
  /// With snapshot_polls: that snapshot is begun (its promise made) and the
  /// drafter dies at its poll, the promise never answered (the real drafter
  /// failing while its copy runs: a dead actor answers nothing).
  bool die_polling_snapshot = false;
  /// Snapshots answer as the real drafter's do, through a snapshot_poll_atom
  /// it sends itself (so work already in its mailbox comes first), instead
  /// of at once; work that arrives meanwhile is counted.
  bool snapshot_polls = false;
  int64_t work_while_snapshotting = 0;
  std::vector<int64_t> steps_while_snapshotting;  ///< the steps that work trained
  bool next_dies_at_start = false;    ///< the next incarnation fails its restore (quits at once)
  std::set<int32_t> muted;            ///< these drafters' heartbeats are never answered
  /// Data-parallel groups: every join (drafter, rank, world, generation),
  /// and per generation rank 0's (step, weights) that the others take.
  struct join_rec {
    int32_t drafter = 0, rank = 0, world = 0;
    int64_t generation = 0;
  };
  std::vector<join_rec> joins;
  std::map<int64_t, std::pair<int64_t, std::vector<int64_t>>> group_root;
  int64_t ids_made = 0;

  // -- checkpointer ---------------------------------------------------------
  bool hold_writes = false;
  int fail_writes = 0;                ///< answer this many writes with an error
  std::vector<snapshot_desc> written;
  std::vector<snapshot_desc> host_written;  ///< by fake_host_checkpointer (restore points in shared memory)
  std::vector<nlohmann::json> host_extras;
  std::vector<nlohmann::json> extras;
  std::map<std::string, std::pair<int64_t, std::vector<int64_t>>> checkpoints;  ///< dir -> (step, weights)

  // -- eval -----------------------------------------------------------------
  std::vector<int64_t> evaluated;     ///< the steps of the snapshots fake_eval measured
  bool eval_fails = false;            ///< fake_eval answers with an error

  // -- metrics --------------------------------------------------------------
  std::vector<step_report> reports;
  std::vector<nlohmann::json> events;

  // -- the launcher ----------------------------------------------------------
  std::optional<run_summary> summary;
  std::optional<caf::error> error;

  std::vector<nlohmann::json> events_named(const std::string& name) const {
    std::vector<nlohmann::json> out;
    for (auto& e : events)
      if (e.value("event", "") == name)
        out.push_back(e);
    return out;
  }
};

using world_ptr = std::shared_ptr<peer_world>;

// ------------------------------------------------------------------ prefetch

struct fake_prefetch_state {
  static inline const char* name = "fake.prefetch";
};

inline prefetch_actor::behavior_type
fake_prefetch(prefetch_actor::stateful_pointer<fake_prefetch_state> self, int32_t index,
              coordinator_actor coordinator, world_ptr w) {
  auto pump = [self, index, coordinator, w] {
    auto& p = w->prefetch[static_cast<size_t>(index)];
    while (p.credit > 0 && !p.exhausted) {
      if (p.queue.empty()) {
        p.exhausted = true;
        self->send(coordinator, exhausted_atom::value, index, p.epoch, p.generation);
        break;
      }
      batch_desc b;
      b.epoch = p.epoch;
      b.generation = p.generation;
      b.source = index;
      for (int64_t k = 0; k < w->batch_samples && !p.queue.empty(); ++k) {
        b.sample_ids.push_back(p.queue.front());
        p.queue.pop_front();
      }
      b.rows = 1;
      b.seq_len = 16;
      b.real_tokens = 10 * static_cast<int64_t>(b.sample_ids.size());
      b.handle = w->next_handle++;
      p.outstanding.insert(b.handle);
      p.max_outstanding = std::max(p.max_outstanding, p.outstanding.size());
      --p.credit;
      p.sent.push_back(b);
      self->send(coordinator, std::move(b));
    }
  };
  return {
    fake_vitals("prefetch", index),
    [=](epoch_atom, int64_t epoch, int64_t generation, const std::vector<int64_t>& done) {
      auto& p = w->prefetch[static_cast<size_t>(index)];
      p.epoch = epoch;
      p.generation = generation;
      p.starts.push_back(done);
      p.queue.clear();
      std::set<int64_t> skip(done.begin(), done.end());
      for (auto s : p.share)
        if (!skip.count(s))
          p.queue.push_back(s);
      p.exhausted = false;
      pump();
    },
    [=](credit_atom, int32_t n) {
      auto& p = w->prefetch[static_cast<size_t>(index)];
      p.credit += n;
      p.credits_received += n;
      pump();
    },
    [=](reissue_atom, const std::vector<int64_t>& ids) {
      auto& p = w->prefetch[static_cast<size_t>(index)];
      p.reissues.push_back(ids);
      p.queue.insert(p.queue.begin(), ids.begin(), ids.end());
      p.exhausted = false;
      pump();
    },
    [=](release_atom, uint64_t h) {
      auto& p = w->prefetch[static_cast<size_t>(index)];
      if (p.outstanding.erase(h) == 0)
        ++p.bad_releases;
    },
    [self](shutdown_atom) { self->quit(); },
  };
}

// -------------------------------------------------------------------- target

struct fake_target_state {
  static inline const char* name = "fake.target";
};

inline fake_target_actor::behavior_type
fake_target(fake_target_actor::stateful_pointer<fake_target_state> self, int32_t index,
            coordinator_actor coordinator, world_ptr w) {
  auto forward = [self, index, coordinator, w](batch_desc b) {
    auto& t = w->targets[static_cast<size_t>(index)];
    work_item item;
    item.features.batch_id = b.batch_id;
    item.features.target = index;
    item.features.shape = {b.rows, b.seq_len, 5 * 64};
    item.features.handle = w->next_handle++;
    item.features.forward_ms = 1;
    t.outstanding.insert(item.features.handle);
    t.max_outstanding = std::max(t.max_outstanding, t.outstanding.size());
    item.batch = std::move(b);
    self->send(coordinator, std::move(item));
  };
  return {
    fake_vitals("target", index),
    [=](batch_desc& b) {
      auto& t = w->targets[static_cast<size_t>(index)];
      if (t.hold)
        t.held.push_back(std::move(b));
      else
        forward(std::move(b));
    },
    [=](go_atom) {
      auto& t = w->targets[static_cast<size_t>(index)];
      t.hold = t.stay_held;
      while (!t.held.empty()) {
        auto b = std::move(t.held.front());
        t.held.pop_front();
        forward(std::move(b));
      }
    },
    [=](release_atom, uint64_t h) {
      auto& t = w->targets[static_cast<size_t>(index)];
      if (t.outstanding.erase(h) == 0)
        ++t.bad_releases;
    },
    // Fake drafters share the process: nothing is ever pulled over a link.
    [=](link_atom, int32_t) -> caf::result<std::vector<uint8_t>> {
      return make_error(errc::bad_input, "fake target: no NCCL links");
    },
    [=](pull_atom, int32_t, const std::vector<uint64_t>&) -> caf::result<pulled> {
      return make_error(errc::bad_input, "fake target: no NCCL links");
    },
    [self](shutdown_atom) { self->quit(); },
  };
}

// ------------------------------------------------------------------- drafter

struct fake_drafter_state {
  static inline const char* name = "fake.drafter";
  size_t incarnation = 0;
  int64_t step = 0;
  std::vector<int64_t> weights;       ///< samples trained into these weights
  caf::actor_clock::time_point idle_since;
  std::optional<work_item> held;
  int64_t generation = 0;             ///< of the group joined last
  std::optional<caf::typed_response_promise<snapshot_desc>> snapshot_reply;  ///< snapshot_polls: answered on the poll
  snapshot_desc snapshot;
};

inline fake_drafter_actor::behavior_type
fake_drafter(fake_drafter_actor::stateful_pointer<fake_drafter_state> self, int32_t index,
             size_t incarnation, int64_t step, std::vector<int64_t> weights,
             coordinator_actor coordinator, world_ptr w) {
  auto& st = self->state;
  if (std::exchange(w->next_dies_at_start, false))
    self->quit(make_error(errc::device_failure, "the restore point in device memory is gone"));
  st.incarnation = incarnation;  // its position in w->incarnations
  st.step = step;
  st.weights = std::move(weights);
  st.idle_since = self->clock().now();
  w->final_weights = st.weights;
  auto train = [self, index, coordinator, w](const work_item& item, bool finite, bool own_nan = true) {
    auto& s = self->state;
    step_report r;
    r.drafter = index;
    r.batch_id = item.batch.batch_id;
    r.real_tokens = item.batch.real_tokens;
    r.scored_tokens = r.real_tokens / 2;
    r.compute_ms = 3;
    r.wait_ms = std::chrono::duration<double, std::milli>(self->clock().now() - s.idle_since).count();
    r.finite = finite;
    r.contributed = item.contribute;
    if (finite) {
      ++s.step;
      if (s.snapshot_reply) {
        ++w->work_while_snapshotting;
        w->steps_while_snapshotting.push_back(s.step);
      }
      if (item.contribute)
        s.weights.insert(s.weights.end(), item.batch.sample_ids.begin(), item.batch.sample_ids.end());
      if (s.incarnation + 1 == w->incarnations.size())
        w->final_weights = s.weights;
      w->loss -= 0.125;
      r.loss = w->loss;
      r.accuracy = 0.5;
      w->steps.push_back({s.incarnation, s.step, item, s.generation, index});
      if (w->memory_tier) {
        w->memory[index] = {s.step, s.weights};
        r.restore_point = s.step;
      }
    } else {
      r.loss = own_nan ? std::numeric_limits<double>::quiet_NaN() : w->loss;
    }
    r.step = s.step;
    s.idle_since = self->clock().now();
    self->send(coordinator, r);
  };
  auto cut_short = [self, index, coordinator](const work_item& item, int64_t state_step) {
    step_report r;
    r.drafter = index;
    r.batch_id = item.batch.batch_id;
    r.finite = false;
    r.contributed = item.contribute;
    r.group_failed = true;
    r.step = state_step;
    self->state.idle_since = self->clock().now();
    self->send(coordinator, r);
  };
  return {
    fake_vitals("drafter", index),
    [=](const work_item& item) {
      ++w->work_received;
      auto what = act::ok;
      auto own = w->drafter_script.find(index);
      if (own != w->drafter_script.end() && !own->second.empty()) {
        what = own->second.front();
        own->second.pop_front();
      } else if (!w->script.empty()) {
        what = w->script.front();
        w->script.pop_front();
      }
      switch (what) {
        case act::ok: train(item, true); break;
        case act::nan: train(item, false); break;
        case act::skip: train(item, false, false); break;
        case act::die:
          self->quit(make_error(errc::device_failure,
                                "step " + std::to_string(self->state.step + 1) + ": injected failure"));
          break;
        case act::lose_device:
          self->quit(make_error(errc::device_lost, "step " + std::to_string(self->state.step + 1)
                                                     + ": an illegal memory access was encountered"));
          break;
        case act::hang: self->state.held = item; break;
        case act::cut: cut_short(item, self->state.step); break;
        case act::lost: cut_short(item, -1); break;
        case act::no_input: {
          step_report r;
          r.drafter = index;
          r.batch_id = item.batch.batch_id;
          r.step = self->state.step;
          r.contributed = item.contribute;
          r.lost_input = true;
          self->send(coordinator, r);
          break;
        }
        case act::die_after: {
          auto& st = self->state;
          ++st.step;
          if (item.contribute)
            st.weights.insert(st.weights.end(), item.batch.sample_ids.begin(), item.batch.sample_ids.end());
          w->steps.push_back({st.incarnation, st.step, item, st.generation, index});
          self->quit(make_error(errc::device_failure,
                                "step " + std::to_string(st.step) + ": injected failure after the collective"));
          break;
        }
      }
    },
    [=](go_atom) {
      if (auto item = std::move(self->state.held)) {
        self->state.held.reset();
        train(*item, true);
      }
    },
    [=](group_id_atom) {
      ++w->ids_made;
      return std::vector<uint8_t>(8, static_cast<uint8_t>(w->ids_made));
    },
    [=](const group_spec& g) -> caf::result<int64_t> {
      // Rank 0's state is "broadcast": the others take its step and weights.
      auto& s = self->state;
      w->joins.push_back({index, g.rank, g.world, g.generation});
      s.generation = g.generation;
      if (g.rank == 0) {
        w->group_root[g.generation] = {s.step, s.weights};
      } else {
        auto it = w->group_root.find(g.generation);
        if (it == w->group_root.end())
          return make_error(errc::timeout, "rank 0 never joined");
        s.step = it->second.first;
        s.weights = it->second.second;
      }
      return s.step;
    },
    [=](snapshot_atom) -> caf::result<snapshot_desc> {
      auto& s = self->state;
      if (s.step == w->die_on_snapshot_at && !(w->snapshot_polls && w->die_polling_snapshot)) {
        auto err = make_error(errc::device_failure, "snapshot at step " + std::to_string(s.step) + ": injected failure");
        self->quit(err);
        return err;
      }
      snapshot_desc d{index, s.step, w->next_handle++};
      w->snapshots[d.handle] = {s.step, s.weights};
      if (!w->snapshot_polls)
        return d;
      s.snapshot = d;
      s.snapshot_reply = self->make_response_promise<snapshot_desc>();
      self->send(self, snapshot_poll_atom::value);
      return *s.snapshot_reply;
    },
    [=](heartbeat_atom) {
      auto rp = self->make_response_promise<int64_t>();
      if (!w->mute_heartbeat && w->muted.count(index) == 0)
        rp.deliver(self->state.step);
      return rp;
    },
    [self](shutdown_atom) { self->quit(); },
    [=](snapshot_poll_atom) {
      auto& s = self->state;
      if (s.snapshot_reply && w->die_polling_snapshot && s.step == w->die_on_snapshot_at) {
        self->quit(make_error(errc::device_failure, "snapshot at step " + std::to_string(s.step) + ": injected failure"));
        return;
      }
      if (s.snapshot_reply) {
        s.snapshot_reply->deliver(s.snapshot);
        s.snapshot_reply.reset();
      }
    },
    [=](fault_atom, const std::string& kind, int64_t at_step) { w->faults_armed.push_back({index, kind, at_step}); },
  };
}

// -------------------------------------------------------------- checkpointer

struct fake_checkpointer_state {
  static inline const char* name = "fake.checkpointer";
  struct pending {
    caf::typed_response_promise<std::string> promise;
    snapshot_desc snap;
    std::string extra;
  };
  std::deque<pending> held;
};

inline fake_checkpointer_actor::behavior_type
fake_checkpointer(fake_checkpointer_actor::stateful_pointer<fake_checkpointer_state> self,
                  world_ptr w) {
  auto write = [w](const snapshot_desc& snap, const std::string& extra) -> caf::expected<std::string> {
    const auto dir = "ckpt/step-" + std::to_string(snap.step);
    if (w->fail_writes > 0) {
      --w->fail_writes;
      return make_error(errc::bad_input, "checkpoint " + dir + ": disk full");
    }
    w->written.push_back(snap);
    w->extras.push_back(nlohmann::json::parse(extra));
    w->checkpoints[dir] = w->snapshots.at(snap.handle);
    w->snapshots.erase(snap.handle);  // released, as the real checkpointer does
    return dir;
  };
  return {
    fake_vitals("checkpointer", 0),
    [=](const snapshot_desc& snap, const std::string& extra) -> caf::result<std::string> {
      if (!w->hold_writes) {
        auto r = write(snap, extra);
        if (r)
          return *r;
        return r.error();
      }
      auto promise = self->make_response_promise<std::string>();
      self->state.held.push_back({promise, snap, extra});
      return promise;
    },
    [=](go_atom) {
      w->hold_writes = false;
      while (!self->state.held.empty()) {
        auto p = std::move(self->state.held.front());
        self->state.held.pop_front();
        auto r = write(p.snap, p.extra);
        if (r)
          p.promise.deliver(*r);
        else
          p.promise.deliver(r.error());
      }
    },
    [self](shutdown_atom) { self->quit(); },
  };
}

/// The host checkpointer (restore points in shared memory): writes
/// "shm/step-<k>" into host_written and releases the snapshot.
inline checkpointer_actor::behavior_type
fake_host_checkpointer(checkpointer_actor::pointer self, world_ptr w) {
  return {
    fake_vitals("checkpointer", 1),
    [w](const snapshot_desc& snap, const std::string& extra) -> std::string {
      w->host_written.push_back(snap);
      w->host_extras.push_back(nlohmann::json::parse(extra));
      w->snapshots.erase(snap.handle);
      return "shm/step-" + std::to_string(snap.step);
    },
    [self](shutdown_atom) { self->quit(); },
  };
}

// ---------------------------------------------------------------------- eval

/// The eval actor: "measures" τ = 1 + step / 10 of each snapshot (or fails
/// with eval_fails), records the step, releases the snapshot.
inline eval_actor::behavior_type fake_eval(eval_actor::pointer self, world_ptr w) {
  return {
    fake_vitals("eval", 0),
    [w](const snapshot_desc& snap) -> eval_event {
      w->snapshots.erase(snap.handle);
      eval_event e;
      e.step = snap.step;
      if (w->eval_fails) {
        e.error = "fake: out of memory";
        return e;
      }
      w->evaluated.push_back(snap.step);
      e.tau = 1.0 + static_cast<double>(snap.step) / 10.0;
      e.prompts = 2;
      e.cycles = 10;
      return e;
    },
    [](eval_next_atom) {},
    [self](shutdown_atom) { self->quit(); },
  };
}

// ------------------------------------------------------------------- metrics

inline metrics_actor::behavior_type fake_metrics(metrics_actor::pointer self, world_ptr w) {
  return {
    fake_vitals("metrics", 0),
    [w](const step_report& r) { w->reports.push_back(r); },
    [w](const run_event& e) { w->events.push_back(event_line(e)); },
    [w](event_atom, const std::string& json) { w->events.push_back(nlohmann::json::parse(json)); },
    [w](log_every_atom, int64_t n) { w->log_every = n; },
    [self](shutdown_atom) { self->quit(); },
  };
}

} // namespace tandem::test
