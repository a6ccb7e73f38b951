// The coordinator: routes batches prefetch -> target -> drafter against
// credits, keeps the sample ledger, decides checkpoints, ends epochs and the
// run; detects drafter failures and rolls the ledger back for them (their
// restarts are the supervisor's, actors/supervisor.cpp).  Cooperative: its
// handlers only move descriptors and counters.
#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <optional>
#include <set>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/ledger.hpp"
#include "actors/runtime.hpp"
#include "messages/errors.hpp"

namespace tandem {

namespace {

struct flight {
  int32_t source = 0;         ///< prefetch (and target) index
  uint64_t batch_handle = 0;
  uint64_t features_handle = 0;
  int64_t real_tokens = 0;
};

struct coordinator_state {
  static inline const char* name = "tandem.coordinator";
  coordinator_options opts;
  coordinator_peers peers;
  std::optional<sample_ledger> ledger;
  caf::typed_response_promise<run_summary> promise;
  bool running = false;
  std::map<int64_t, flight> in_flight;  ///< by batch id
  std::deque<work_item> queue;          ///< features ready, waiting for a drafter
  std::deque<int32_t> idle;             ///< drafters without work
  std::set<int32_t> busy;
  std::vector<bool> exhausted;
  int64_t epoch = 0;
  int64_t step = 0;
  int64_t durable_step = -1;
  bool checkpointing = false;
  std::vector<std::function<void()>> after_checkpoint;
  bool stopping = false;
  bool stop_requested = false;          ///< a stop that came before the run request
  run_summary summary;
  std::string escalated;                ///< a worker that is not restarted ended: why ("" = none)
  bool have_first_loss = false;
  // Failures.
  std::map<int64_t, int32_t> sample_source;      ///< issued, not yet committed: which prefetch
  std::set<int64_t> abandoned;                   ///< rolled back while at a target
  std::vector<caf::actor_addr> drafter_addr;     ///< the live incarnation of each drafter
  // Times are the actor clock's (self->clock().now()), the clock that also fires the
  // watchdog tick and the heartbeats: steady_clock in production, the
  // deterministic clock in protocol tests.
  std::vector<caf::actor_clock::time_point> dispatched;  ///< when its step started
  std::vector<bool> down;                        ///< waiting for its restart
  std::vector<int64_t> restore_point;            ///< the step its next incarnation is restored to (the checkpoint named in its restart)
  std::vector<caf::actor_clock::time_point> last_heartbeat;  ///< last asked (idle drafters)
  std::vector<bool> heartbeat_pending;           ///< asked, no answer yet
  int64_t lineage = 0;                           ///< rollbacks to a checkpoint so far (a snapshot older than one is stale)
  // Data-parallel drafters (more than one): one NCCL group, lockstep steps.
  struct group_state {
    int64_t generation = 0;        ///< groups formed so far
    bool formed = false;           ///< a group is up and no rank has failed since
    bool forming = false;
    std::vector<uint8_t> nccl_id;  ///< of the group formed or being formed (abort_group)
    /// Ranks that failed inside the group step in flight, with why: the
    /// survivors' reports, still due, decide where training continues
    /// (resolve_group_failure).
    std::vector<std::pair<int32_t, std::string>> failed;
    int32_t ready = 0;             ///< drafters that answered before the group being formed
    int32_t joined = 0;            ///< join replies of the group being formed
    std::vector<bool> clean;       ///< holds the state the ledger's step says (restored or never diverged)
    /// The group step in flight: reports still due and what they trained.
    int32_t reports_due = 0;
    std::vector<step_report> reports;
    std::vector<int64_t> batches;  ///< the real batches of this step
  } group;
};

using self_ptr = coordinator_actor::stateful_pointer<coordinator_state>;

void event(self_ptr self, nlohmann::json j) {
  self->send(self->state.peers.metrics, event_atom::value, j.dump());
}

void release(self_ptr self, int32_t source, uint64_t batch_handle, uint64_t features_handle) {
  auto& s = self->state;
  if (batch_handle)
    self->send(s.peers.prefetch[static_cast<size_t>(source)], release_atom::value, batch_handle);
  if (features_handle)
    self->send(s.peers.targets[static_cast<size_t>(source)], release_atom::value, features_handle);
}

bool grouped(self_ptr self) {
  return self->state.peers.drafters.size() > 1;
}

/// Whether no more batches of this epoch can arrive: every prefetch is
/// exhausted and every batch in flight has its features (is queued).
bool epoch_tail(self_ptr self) {
  auto& s = self->state;
  for (bool e : s.exhausted)
    if (!e)
      return false;
  return s.queue.size() == s.in_flight.size();
}

/// Lockstep dispatch of one group step: all ranks idle, the group formed,
/// N queued batches (or fewer at the end of an epoch: the other ranks get a
/// copy with contribute = false, messages/drafter.hpp).
void dispatch_group(self_ptr self) {
  auto& s = self->state;
  const auto world = s.peers.drafters.size();
  if (s.stopping || !s.group.formed || s.group.forming || s.group.reports_due > 0
      || s.idle.size() != world || s.queue.empty())
    return;
  if (s.queue.size() < world && !epoch_tail(self))
    return;
  const auto now = self->clock().now();
  s.group.reports.clear();
  s.group.batches.clear();
  s.group.reports_due = static_cast<int32_t>(world);
  const work_item first = s.queue.front();
  s.idle.clear();
  for (size_t d = 0; d < world; ++d) {
    work_item w;
    if (!s.queue.empty()) {
      w = std::move(s.queue.front());
      s.queue.pop_front();
      s.group.batches.push_back(w.batch.batch_id);
    } else {
      w = first;
      w.contribute = false;
    }
    s.busy.insert(static_cast<int32_t>(d));
    s.dispatched[d] = now;
    self->send(s.peers.drafters[d], std::move(w));
  }
}

void dispatch(self_ptr self) {
  auto& s = self->state;
  if (grouped(self)) {
    dispatch_group(self);
    return;
  }
  while (!s.stopping && !s.idle.empty() && !s.queue.empty()) {
    auto d = s.idle.front();
    s.idle.pop_front();
    s.busy.insert(d);
    s.dispatched[static_cast<size_t>(d)] = self->clock().now();
    self->send(s.peers.drafters[static_cast<size_t>(d)], std::move(s.queue.front()));
    s.queue.pop_front();
  }
}

void fail(self_ptr self, const caf::error& err) {
  auto& s = self->state;
  if (s.running) {
    s.running = false;
    s.promise.deliver(err);
  }
}

std::string ledger_json(self_ptr self) {
  auto& s = self->state;
  // The checkpoint holds the weights after s.step (the drafter is idle when
  // a checkpoint is asked for), so its ledger commits what they include.
  return nlohmann::json{{"ledger", nlohmann::json::parse(s.ledger->save(s.step))},
                        {"step", s.step},
                        {"epoch", s.epoch}}
    .dump();
}

void try_complete(self_ptr self);
void maybe_end_epoch(self_ptr self);
void retire(self_ptr self, int64_t batch_id, int64_t step);
void after_step(self_ptr self);

/// Which drafter to snapshot: drafter 0, or with data-parallel drafters the
/// first that is up and holds the ledger's state (drafter 0 may be down
/// for a restart after a step its survivors completed).
int32_t snapshot_source(self_ptr self) {
  auto& s = self->state;
  if (grouped(self))
    for (size_t d = 0; d < s.peers.drafters.size(); ++d)
      if (!s.down[d] && s.group.clean[d])
        return static_cast<int32_t>(d);
  return 0;  // a single drafter (or none fit: the request fails and the continuations wait)
}

/// Snapshot a drafter holding the ledger's state, write it, mark the ledger
/// durable; then run the continuations queued meanwhile.
void checkpoint(self_ptr self, std::function<void()> then) {
  auto& s = self->state;
  if (then)
    s.after_checkpoint.push_back(std::move(then));
  if (s.checkpointing)
    return;
  s.checkpointing = true;
  const auto extra = ledger_json(self);
  const auto lineage = s.lineage;
  self->request(s.peers.drafters[static_cast<size_t>(snapshot_source(self))], std::chrono::minutes(10),
                snapshot_atom::value)
    .then(
      [self, extra, lineage](const snapshot_desc& snap) {
        self->request(self->state.peers.checkpointer, std::chrono::minutes(30), snap, extra)
          .then(
            [self, snap, lineage](const std::string& dir) {
              auto& s = self->state;
              if (s.lineage != lineage) {
                // A drafter failed after this snapshot and the run rolled
                // back past it: these weights are not the ones training
                // continues from, so they must not become the restore point
                // nor commit samples.  The continuations wait for the next
                // checkpoint; look again whether one is due now.
                s.checkpointing = false;
                spdlog::warn("checkpoint {} (step {}) predates a drafter failure: not used", dir,
                             snap.step);
                event(self, {{"event", "checkpoint_discarded"}, {"step", snap.step}, {"dir", dir}});
                try_complete(self);
                maybe_end_epoch(self);
                return;
              }
              const auto committed = s.ledger->durable(snap.step);
              s.durable_step = snap.step;
              s.summary.checkpoint = dir;
              s.checkpointing = false;
              event(self, {{"event", "checkpoint"}, {"step", snap.step}, {"dir", dir},
                           {"committed_now", committed},
                           {"committed", s.ledger->state_counts().committed}});
              auto todo = std::move(s.after_checkpoint);
              s.after_checkpoint.clear();
              for (auto& f : todo)
                f();
              // A stop that came while this checkpoint was written waited
              // for it (an epoch end's continuation does not look again).
              try_complete(self);
            },
            [self](const caf::error& err) { fail(self, err); });
      },
      [self](const caf::error& err) {
        // The drafter died before answering: supervision restarts it, and
        // the continuations wait for the next checkpoint.
        self->state.checkpointing = false;
        spdlog::warn("checkpoint: snapshot failed: {}", self->system().render(err));
      });
}

void deliver(self_ptr self) {
  auto& s = self->state;
  if (!s.running)
    return;
  s.running = false;
  s.summary.steps = s.step;
  s.summary.samples_committed = s.ledger->state_counts().committed;
  event(self, {{"event", "end"}, {"reason", s.summary.stop_reason}, {"steps", s.step},
               {"checkpoint", s.summary.checkpoint}});
  if (!s.escalated.empty()) {
    // The run stopped for a worker it cannot replace; its training is safe.
    s.promise.deliver(make_error(
      errc::device_failure,
      s.escalated + "; the run stopped after step " + std::to_string(s.step)
        + (s.summary.checkpoint.empty() ? std::string(" with no checkpoint")
                                        : ", checkpoint " + s.summary.checkpoint
                                            + " holds it (tandem run --resume continues)")));
    return;
  }
  s.promise.deliver(s.summary);
}

/// When stopping: once no drafter is mid-step, write the last checkpoint
/// (if there is anything new) and answer the run request.
void try_complete(self_ptr self) {
  auto& s = self->state;
  if (!s.stopping || !s.busy.empty() || s.checkpointing || s.group.forming)
    return;
  for (bool d : s.down)
    if (d)
      return;  // its restart calls back here
  // Everything not trained is abandoned: its samples stay uncommitted and
  // a resumed run issues them again.
  for (auto& [id, f] : s.in_flight) {
    if (f.features_handle)
      release(self, f.source, f.batch_handle, f.features_handle);
    else
      s.abandoned.insert(id);  // still at its target: released when it comes back
  }
  s.in_flight.clear();
  s.queue.clear();
  if (s.step > s.durable_step)
    checkpoint(self, [self] { deliver(self); });
  else
    deliver(self);
}

void finish(self_ptr self, const std::string& reason) {
  auto& s = self->state;
  if (s.stopping)
    return;
  s.stopping = true;
  s.summary.stop_reason = reason;
  try_complete(self);
}

void start_epoch(self_ptr self, const std::vector<int64_t>& done) {
  auto& s = self->state;
  s.exhausted.assign(s.peers.prefetch.size(), false);
  event(self, {{"event", "epoch"}, {"epoch", s.epoch}, {"samples", s.ledger->num_samples()},
               {"already_committed", static_cast<int64_t>(done.size())}});
  for (auto& p : s.peers.prefetch)
    self->send(p, epoch_atom::value, s.epoch, done);
}

void maybe_end_epoch(self_ptr self) {
  auto& s = self->state;
  if (s.stopping || s.checkpointing)
    return;
  for (bool e : s.exhausted)
    if (!e)
      return;
  if (!s.in_flight.empty() || !s.queue.empty() || !s.busy.empty())
    return;
  checkpoint(self, [self, e = s.epoch] {
    auto& s = self->state;
    if (s.epoch != e || s.stopping)
      return;  // already handled (a continuation can run late after a failure)
    for (bool x : s.exhausted)
      if (!x)
        return;
    if (!s.in_flight.empty() || !s.queue.empty() || !s.busy.empty())
      return;
    if (!s.ledger->epoch_complete()) {
      fail(self, make_error(errc::bad_input,
                            "epoch " + std::to_string(s.epoch) + " ended with "
                              + std::to_string(s.ledger->state_counts().committed) + " of "
                              + std::to_string(s.ledger->num_samples())
                              + " samples committed (ledger and data disagree)"));
      return;
    }
    ++s.summary.epochs_completed;
    if (s.epoch + 1 >= s.opts.epochs) {
      finish(self, "epochs");
      return;
    }
    s.ledger->next_epoch();
    ++s.epoch;
    start_epoch(self, {});
  });
}

void on_drafter_failure(self_ptr self, int32_t d, const std::string& reason,
                        bool peers_hold_state = false);

/// Data-parallel drafters between group steps: every live replica holds the
/// weights of the ledger's step (nothing half-applied).
bool group_at_rest(self_ptr self) {
  auto& s = self->state;
  return grouped(self) && s.group.formed && s.group.reports_due == 0 && s.busy.empty();
}

template <class T>
std::chrono::nanoseconds seconds_of(T s) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(s));
}

template <class JoinFailed>
void join_group(self_ptr self, int64_t gen, int32_t root, JoinFailed join_failed);

/// Data-parallel drafters: forms a new NCCL group once every drafter is up
/// and idle.  Rank 0 is a clean drafter (one holding the restore point's
/// state: at the start every drafter, after a failure the restarted one,
/// restored from the newest checkpoint); joining broadcasts its weights,
/// moments and step to the others.  A rank that cannot join is a failed
/// drafter; the others' joins then time out and are not counted against them.
void maybe_form_group(self_ptr self) {
  auto& s = self->state;
  const auto world = s.peers.drafters.size();
  if (!grouped(self) || !s.running || s.group.formed || s.group.forming)
    return;
  for (size_t d = 0; d < world; ++d)
    if (s.down[d])
      return;
  if (!s.busy.empty() || s.idle.size() != world)
    return;
  int32_t root = -1;
  for (size_t d = 0; d < world && root < 0; ++d)
    if (s.group.clean[d])
      root = static_cast<int32_t>(d);
  if (root < 0) {
    fail(self, make_error(errc::device_failure,
                          "data-parallel drafters: none holds the restore point's state"));
    return;
  }
  s.group.forming = true;
  s.group.joined = 0;
  s.group.ready = 0;
  const auto gen = ++s.group.generation;
  // Only the first failure of a generation is a drafter's fault.
  auto join_failed = [self, gen](int32_t d, caf::actor_addr addr, const std::string& what) {
    auto& s = self->state;
    if (s.group.generation != gen || !s.group.forming)
      return;
    s.group.forming = false;
    if (s.drafter_addr[static_cast<size_t>(d)] == addr && !s.down[static_cast<size_t>(d)])
      on_drafter_failure(self, d, what);
  };
  // First every drafter must be up: a restarted one answers only once it
  // has built its engine and restored its checkpoint (seconds at 8B), and
  // its peers' NCCL init must not start its deadline before that.
  for (size_t d = 0; d < world; ++d) {
    const auto addr = s.drafter_addr[d];
    self->request(s.peers.drafters[d], seconds_of(s.opts.step_timeout_s), heartbeat_atom::value)
      .then(
        [self, gen, root, join_failed](int64_t) {
          auto& s = self->state;
          if (s.group.generation != gen || !s.group.forming
              || ++s.group.ready < static_cast<int32_t>(s.peers.drafters.size()))
            return;
          join_group(self, gen, root, join_failed);
        },
        [self, gen, d, addr, join_failed](caf::error& e) {
          join_failed(static_cast<int32_t>(d), addr,
                      "drafter " + std::to_string(d) + " did not come up for data-parallel group "
                        + std::to_string(gen) + " within runtime.step_timeout_s: "
                        + self->system().render(e));
        });
  }
}

/// The second half of forming group `gen`: rank 0 makes the NCCL id, every
/// drafter joins with it.
template <class JoinFailed>
void join_group(self_ptr self, int64_t gen, int32_t root, JoinFailed join_failed) {
  auto& s = self->state;
  const auto timeout = seconds_of(s.opts.group_timeout_s + 30);
  const auto root_addr = s.drafter_addr[static_cast<size_t>(root)];
  self->request(s.peers.drafters[static_cast<size_t>(root)], timeout, group_id_atom::value)
    .then(
      [self, gen, root, timeout, join_failed](const std::vector<uint8_t>& id) {
        auto& s = self->state;
        if (s.group.generation != gen || !s.group.forming)
          return;
        s.group.nccl_id = id;
        const auto world = static_cast<int32_t>(s.peers.drafters.size());
        std::vector<int32_t> order{root};
        for (int32_t d = 0; d < world; ++d)
          if (d != root)
            order.push_back(d);
        for (int32_t rank = 0; rank < world; ++rank) {
          const auto d = order[static_cast<size_t>(rank)];
          const auto addr = s.drafter_addr[static_cast<size_t>(d)];
          group_spec g{id, rank, world, gen, s.opts.group_timeout_s};
          self->request(s.peers.drafters[static_cast<size_t>(d)], timeout, std::move(g))
            .then(
              [self, gen, root, world](int64_t step) {
                auto& s = self->state;
                if (s.group.generation != gen || !s.group.forming || ++s.group.joined < world)
                  return;
                s.group.forming = false;
                s.group.formed = true;
                s.group.clean.assign(static_cast<size_t>(world), true);
                if (step != s.step)
                  spdlog::warn("data-parallel group {}: rank 0 (drafter {}) is at step {}, the "
                               "ledger at {}", gen, root, step, s.step);
                event(self, {{"event", "group_formed"}, {"generation", gen}, {"world", world},
                             {"root", root}, {"step", step}});
                dispatch(self);
                try_complete(self);
                maybe_end_epoch(self);
              },
              [self, d, addr, gen, join_failed](caf::error& e) {
                join_failed(d, addr, "drafter " + std::to_string(d) + " could not join data-parallel group "
                                       + std::to_string(gen) + ": " + self->system().render(e));
              });
        }
      },
      [self, root, root_addr, gen, join_failed](caf::error& e) {
        join_failed(root, root_addr, "drafter " + std::to_string(root)
                                       + " could not create data-parallel group "
                                       + std::to_string(gen) + ": " + self->system().render(e));
      });
}

/// A drafter failed: roll back to the restore point, re-issue what was
/// lost, and restart it after its backoff — or end the run past the budget.
/// Data-parallel drafters: the group is broken for everyone and aborted
/// (abort_group); the survivors stay up.  `peers_hold_state`: the failure
/// left the survivors' weights at the ledger's step (it came between group
/// steps, or every rank skipped the step's update), so nothing is rolled
/// back but the batches in flight, and the next group takes a survivor's
/// state (DESIGN.md §3: restore from a healthy peer).  A failure inside a
/// group step waits for the survivors' reports first (resolve_group_failure).
/// Otherwise training rolls back to the newest checkpoint and the next group
/// takes the restarted drafter's restored state.
void roll_back_and_restart(self_ptr self, int32_t d, const std::string& reason, bool peers_hold_state);
void resolve_group_failure(self_ptr self);

void abort_group(self_ptr self, const std::string& why) {
  auto& s = self->state;
  if (!s.group.nccl_id.empty() && s.opts.abort_group)
    s.opts.abort_group(s.group.nccl_id, why);
  s.group.nccl_id.clear();
}

void on_drafter_failure(self_ptr self, int32_t d, const std::string& reason, bool peers_hold_state) {
  auto& s = self->state;
  const auto di = static_cast<size_t>(d);
  if (s.down[di] || !s.running)
    return;
  s.down[di] = true;
  // Forget the failed incarnation: its late messages no longer match (the
  // supervisor kills it if it is still alive).
  s.drafter_addr[di] = caf::actor_addr{};
  const bool was_busy = s.busy.erase(d) > 0;
  s.idle.erase(std::remove(s.idle.begin(), s.idle.end(), d), s.idle.end());
  if (grouped(self) && !peers_hold_state && s.group.formed && s.group.reports_due > 0) {
    // Inside a group step: abort the group so the survivors stop waiting
    // for this rank, and let their reports say where their states are (the
    // step before, their guarded update skipped, or this one, the
    // collective complete) before deciding what to roll back.
    abort_group(self, reason);
    s.group.failed.emplace_back(d, reason);
    if (was_busy)
      --s.group.reports_due;  // its report will not come
    else  // it reported, then died: its state is gone with it
      s.group.reports.erase(std::remove_if(s.group.reports.begin(), s.group.reports.end(),
                                           [d](const step_report& r) { return r.drafter == d; }),
                            s.group.reports.end());
    if (s.group.reports_due == 0)
      resolve_group_failure(self);
    return;
  }
  roll_back_and_restart(self, d, reason, peers_hold_state);
}

/// The group step's batches are trained into the weights of `step`: retire
/// them, count the step, and keep its loss (the mean over the contributing
/// ones of `reports`).
void count_group_step(self_ptr self, int64_t step, const std::vector<step_report>& reports) {
  auto& s = self->state;
  for (auto id : s.group.batches)
    retire(self, id, step);
  s.group.batches.clear();
  s.step = step;
  double loss = 0;
  int contributing = 0;
  for (const auto& x : reports)
    if (x.contributed) {
      loss += x.loss;
      ++contributing;
    }
  if (contributing == 0)
    return;
  loss /= contributing;
  if (!s.have_first_loss) {
    s.summary.first_loss = loss;
    s.have_first_loss = true;
  }
  s.summary.last_loss = loss;
}

/// Every survivor of the ranks that failed inside a group step has
/// reported.  Their states are the ledger's step (the guarded update was
/// skipped) or the next (the collective had completed: every rank's
/// gradient is in, so the step's batches are trained); with all of them
/// there, training continues from a survivor, losing no step.  A state
/// anywhere else (unknown) sends everyone back to the newest checkpoint.
void resolve_group_failure(self_ptr self) {
  auto& s = self->state;
  auto failed = std::move(s.group.failed);
  s.group.failed.clear();
  auto reports = std::move(s.group.reports);
  s.group.reports.clear();
  const int64_t before = s.step, after = s.step + 1;
  bool known = !reports.empty();
  bool any_after = false;
  for (const auto& r : reports) {
    known &= r.step == before || r.step == after;
    any_after |= r.step == after;
  }
  if (known && any_after) {
    // A survivor applied the whole step: its batches are in that state.
    std::vector<step_report> completed;
    for (const auto& r : reports)
      if (r.step == after && r.finite) {
        if (r.contributed)
          self->send(s.peers.metrics, r);
        completed.push_back(r);
      }
    count_group_step(self, after, completed);
  }
  if (known)  // the survivors at the step training continues from can lead the next group
    for (const auto& r : reports)
      s.group.clean[static_cast<size_t>(r.drafter)] = r.step == s.step;
  for (const auto& [d, why] : failed)
    roll_back_and_restart(self, d, why, known);
  if (known && any_after)
    after_step(self);  // the step counts: max_steps, a checkpoint due, the epoch's end
}

/// The failure's consequences once the drafter is marked down: the group
/// (if any) broken, the ledger rolled back to the restore point, what was
/// lost re-issued, the supervisor asked for a restart.
void roll_back_and_restart(self_ptr self, int32_t d, const std::string& reason, bool peers_hold_state) {
  auto& s = self->state;
  const auto di = static_cast<size_t>(d);
  if (!s.running)
    return;
  bool keep_state = false;
  if (grouped(self)) {
    // A healthy peer must remain to take the state from.
    if (peers_hold_state)
      for (size_t j = 0; j < s.peers.drafters.size(); ++j)
        keep_state |= j != di && !s.down[j] && s.group.clean[j];
    // Survivors blocked in the group's collective (or init) with the failed
    // rank would wait for group_timeout_s: abort it for them now.
    abort_group(self, reason);
    s.group.formed = false;
    s.group.forming = false;
    s.group.reports_due = 0;
    s.group.reports.clear();
    s.group.batches.clear();
    if (keep_state)
      s.group.clean[di] = false;  // restarted from an older checkpoint
    else
      s.group.clean.assign(s.peers.drafters.size(), false);  // all roll back below
  }
  // Roll back: everything after the restore point goes back to pending —
  // the newest checkpoint, or (survivors holding the state) the current step,
  // which returns only the batches in flight.  Only a rollback past the
  // current step makes a snapshot still being written stale.
  if (!keep_state)
    ++s.lineage;
  const int64_t restore_step = keep_state ? s.step : std::max<int64_t>(s.durable_step, 0);
  auto back = s.ledger->rollback(keep_state ? s.step : s.durable_step);
  const int64_t lost_steps = s.step - restore_step;
  s.step = restore_step;
  std::vector<int32_t> credit(s.peers.prefetch.size(), 0);
  for (auto& [id, fl] : s.in_flight) {
    ++credit[static_cast<size_t>(fl.source)];
    if (fl.features_handle)
      release(self, fl.source, fl.batch_handle, fl.features_handle);
    else
      s.abandoned.insert(id);  // still at its target: released when it comes back
  }
  s.in_flight.clear();
  s.queue.clear();
  std::vector<std::vector<int64_t>> reissue(s.peers.prefetch.size());
  for (auto id : back) {
    auto it = s.sample_source.find(id);
    const auto src = it == s.sample_source.end() ? 0 : it->second;
    reissue[static_cast<size_t>(src)].push_back(id);
    if (it != s.sample_source.end())
      s.sample_source.erase(it);
  }
  (void)s.ledger->take_reissue(back.size());  // the prefetches re-pack them
  for (size_t p = 0; p < s.peers.prefetch.size(); ++p) {
    if (!reissue[p].empty()) {
      s.exhausted[p] = false;
      self->send(s.peers.prefetch[p], reissue_atom::value, reissue[p]);
    }
    if (credit[p] > 0 && !s.stopping)
      self->send(s.peers.prefetch[p], credit_atom::value, credit[p]);
  }
  // The supervisor counts the failure against the restart budget and
  // restarts the drafter from the restore point after its backoff (the new
  // incarnation arrives as drafter_up), or refuses: then the run fails.
  nlohmann::json j{{"event", "drafter_failed"}, {"drafter", d}, {"reason", reason},
                   {"restore_step", s.step}, {"steps_lost", lost_steps},
                   {"restore_from", keep_state ? "peers" : "checkpoint"},
                   {"samples_reissued", static_cast<int64_t>(back.size())},
                   {"checkpoint", s.summary.checkpoint}};
  // The checkpoint named here is what the new incarnation holds, even if a
  // newer one is written before it comes up.
  s.restore_point[di] = std::max<int64_t>(s.durable_step, 0);
  self->request(s.opts.supervisor, std::chrono::minutes(1), restart_atom::value, d, reason,
                s.summary.checkpoint)
    .then(
      [self, j](const restart_plan& plan) mutable {
        j["restart"] = plan.restart;
        j["budget"] = plan.budget;
        j["backoff_s"] = plan.backoff_s;
        event(self, std::move(j));
      },
      [self, d](const caf::error& err) {
        event(self, {{"event", "budget_exhausted"}, {"drafter", d},
                     {"report", self->system().render(err)}});
        fail(self, err);
      });
}

/// Asks idle drafter `d` for a heartbeat when heartbeat_s has passed since
/// the last; no answer within heartbeat_s is a failure of that incarnation.
/// (A busy drafter's thread is inside its step: step_timeout_s covers it.)
void ask_heartbeat(self_ptr self, int32_t d, caf::actor_clock::time_point now) {
  auto& s = self->state;
  const auto di = static_cast<size_t>(d);
  if (s.down[di] || s.heartbeat_pending[di] || !s.peers.drafters[di]
      || std::chrono::duration<double>(now - s.last_heartbeat[di]).count() < s.opts.heartbeat_s)
    return;
  s.heartbeat_pending[di] = true;
  s.last_heartbeat[di] = now;
  const auto addr = s.drafter_addr[di];
  const auto timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(
    std::chrono::duration<double>(s.opts.heartbeat_s));
  self->request(s.peers.drafters[di], timeout, heartbeat_atom::value)
    .then(
      [self, di](int64_t) {
        self->state.heartbeat_pending[di] = false;
        self->state.last_heartbeat[di] = self->clock().now();
      },
      [self, d, di, addr](caf::error& e) {
        auto& s = self->state;
        s.heartbeat_pending[di] = false;
        if (s.drafter_addr[di] != addr || s.down[di])
          return;  // already replaced: not this incarnation's failure
        on_drafter_failure(self, d, "drafter " + std::to_string(d) + " missed its heartbeat: no answer within "
                                      + std::to_string(s.opts.heartbeat_s) + " s (runtime.heartbeat_s): "
                                      + self->system().render(e),
                           group_at_rest(self));
      });
}

/// The supervisor's new incarnation of drafter `d`, restored from the
/// checkpoint named in the restart request.
void on_drafter_up(self_ptr self, int32_t d, drafter_actor fresh) {
  auto& s = self->state;
  if (d < 0 || static_cast<size_t>(d) >= s.down.size())
    return;
  const auto di = static_cast<size_t>(d);
  if (!s.running || !s.down[di])
    return;  // the run ended meanwhile: the supervisor shuts it down with the rest
  s.peers.drafters[di] = fresh;
  s.drafter_addr[di] = fresh.address();
  s.down[di] = false;
  s.heartbeat_pending[di] = false;
  s.last_heartbeat[di] = self->clock().now();
  s.idle.push_back(d);
  if (grouped(self))  // restored from the checkpoint its restart named: the ledger's state only if nothing came after it
    s.group.clean[di] = s.restore_point[di] == s.step;
  event(self, {{"event", "drafter_restarted"}, {"drafter", d}, {"step", s.step},
               {"from", s.summary.checkpoint.empty() ? "fresh weights" : s.summary.checkpoint}});
  maybe_form_group(self);
  dispatch(self);
  try_complete(self);
}

/// After a step's accounting: the run's end, a checkpoint, the next work.
void after_step(self_ptr self) {
  auto& s = self->state;
  if (s.opts.max_steps > 0 && s.step >= s.opts.max_steps) {
    finish(self, "max_steps");
    return;
  }
  if (s.stopping) {
    try_complete(self);
    return;
  }
  if (s.opts.checkpoint_every > 0 && s.step % s.opts.checkpoint_every == 0)
    checkpoint(self, [self] { maybe_end_epoch(self); });
  dispatch(self);
  maybe_end_epoch(self);
}

/// The batch is trained into the weights of step `step`: retire it.
void retire(self_ptr self, int64_t batch_id, int64_t step) {
  auto& s = self->state;
  auto it = s.in_flight.find(batch_id);
  if (it != s.in_flight.end()) {
    release(self, it->second.source, it->second.batch_handle, it->second.features_handle);
    if (!s.stopping)
      self->send(s.peers.prefetch[static_cast<size_t>(it->second.source)], credit_atom::value,
                 int32_t{1});
    s.in_flight.erase(it);
  }
  s.ledger->trained(batch_id, step);
}

/// A data-parallel drafter's report.  The group step is accounted when all
/// N are in: every real batch retired at the common step, or — a rank with
/// a non-finite loss, or a collective that failed — a drafter failure.
void on_group_report(self_ptr self, const step_report& r) {
  auto& s = self->state;
  s.busy.erase(r.drafter);
  if (std::find(s.idle.begin(), s.idle.end(), r.drafter) == s.idle.end())
    s.idle.push_back(r.drafter);
  if (!s.group.failed.empty()) {
    // A survivor of a rank that failed inside this step: where is its state?
    s.group.reports.push_back(r);
    if (--s.group.reports_due == 0)
      resolve_group_failure(self);
    return;
  }
  if (!s.group.formed || s.group.reports_due == 0) {
    // A step cut short by a failure already handled: nothing to account.
    if (r.group_failed)
      event(self, {{"event", "group_step_abandoned"}, {"drafter", r.drafter}});
    maybe_form_group(self);
    try_complete(self);
    return;
  }
  s.group.reports.push_back(r);
  --s.group.reports_due;
  bool collective_failed = false;
  for (const auto& x : s.group.reports)
    collective_failed |= x.group_failed;
  if (s.group.reports_due > 0) {
    if (collective_failed && s.busy.size() == static_cast<size_t>(s.group.reports_due)) {
      // Every rank still busy kept its peers' collective from completing.
      for (auto d : std::vector<int32_t>(s.busy.begin(), s.busy.end()))
        on_drafter_failure(self, d, "drafter " + std::to_string(d) + " did not complete group step "
                                      + std::to_string(s.step + 1) + ": its peers' collective timed out");
    }
    return;
  }
  const auto reports = std::move(s.group.reports);
  s.group.reports.clear();
  if (collective_failed) {
    for (const auto& x : reports)
      if (x.group_failed) {
        on_drafter_failure(self, x.drafter, "drafter " + std::to_string(x.drafter) + ": the collective of group step "
                                               + std::to_string(s.step + 1) + " failed");
        return;
      }
  }
  for (const auto& x : reports)
    if (x.contributed)
      self->send(s.peers.metrics, x);
  for (const auto& x : reports)
    if (!x.finite) {
      // Every rank skipped the update (the averaged gradient is not
      // finite); the one whose own loss is not finite is the failure.
      int32_t culprit = x.drafter;
      for (const auto& y : reports)
        if (!std::isfinite(y.loss)) {
          culprit = y.drafter;
          break;
        }
      bool all_skipped = true;
      for (const auto& y : reports)
        all_skipped &= !y.finite;
      on_drafter_failure(self, culprit, "drafter " + std::to_string(culprit)
                                          + ": non-finite loss or gradient at step "
                                          + std::to_string(s.step + 1),
                         /*peers_hold_state=*/all_skipped);
      return;
    }
  const auto step = reports.front().step;
  for (const auto& x : reports)
    if (x.step != step) {
      fail(self, make_error(errc::device_failure,
                            "data-parallel drafters disagree on the step after a group step: drafter "
                              + std::to_string(reports.front().drafter) + " at " + std::to_string(step)
                              + ", drafter " + std::to_string(x.drafter) + " at " + std::to_string(x.step)));
      return;
    }
  count_group_step(self, step, reports);
  after_step(self);
}

} // namespace

coordinator_actor spawn_coordinator(caf::actor_system& sys, coordinator_options opts) {
  auto behavior = [](self_ptr self, coordinator_options o) -> coordinator_actor::behavior_type {
    self->state.opts = std::move(o);
    self->set_default_handler([](caf::scheduled_actor* me, caf::message_view& view)
                                -> caf::result<caf::message> {
      auto msg = view.copy_content_to_message();
      spdlog::error("tandem.coordinator cannot handle {}", caf::to_string(msg));
      return make_error(errc::unexpected_message, "coordinator cannot handle " + caf::to_string(msg));
    });
    return {
      [self](run_atom, coordinator_peers& peers) -> caf::result<run_summary> {
        auto& s = self->state;
        if (s.running)
          return make_error(errc::bad_input, "coordinator: a run is already in progress");
        if (peers.drafters.empty())
          return make_error(errc::bad_input, "coordinator: no drafter");
        if (peers.prefetch.size() != peers.targets.size() || peers.prefetch.empty())
          return make_error(errc::bad_input, "coordinator: one prefetch per target is required");
        if (peers.drafters.size() > 1
            && static_cast<size_t>(s.opts.credits) * peers.prefetch.size() < peers.drafters.size())
          return make_error(errc::bad_input,
                            "coordinator: runtime.credits (" + std::to_string(s.opts.credits) + ") x "
                              + std::to_string(peers.prefetch.size()) + " target(s) is less than the "
                              + std::to_string(peers.drafters.size())
                              + " data-parallel drafters: each group step needs one batch per drafter");
        if (!s.opts.supervisor)
          return make_error(errc::bad_input, "coordinator: no supervisor to restart drafters");
        // Everything that can fail is checked before the response promise
        // exists: once it does, CAF 0.17 drops an error returned here (the
        // request counts as answered) and the requester would wait forever.
        std::optional<sample_ledger> ledger;
        if (s.opts.resume_ledger.empty()) {
          ledger.emplace(s.opts.num_samples);
        } else {
          try {
            ledger.emplace(sample_ledger::restore(s.opts.resume_ledger));
          } catch (const std::exception& e) {
            return make_error(errc::bad_input, std::string("resume: the checkpoint's ledger: ") + e.what());
          }
          if (ledger->num_samples() != s.opts.num_samples)
            return make_error(errc::bad_input, "resume: the checkpoint's ledger covers "
                                                 + std::to_string(ledger->num_samples())
                                                 + " samples, the dataset has "
                                                 + std::to_string(s.opts.num_samples));
        }
        s.peers = std::move(peers);
        s.ledger = std::move(ledger);
        std::vector<int64_t> done;
        if (!s.opts.resume_ledger.empty()) {
          s.epoch = s.ledger->epoch();
          for (int64_t i = 0; i < s.ledger->num_samples(); ++i)
            if (s.ledger->is_committed(i))
              done.push_back(i);
          s.step = s.opts.resume_step;
          s.durable_step = s.opts.resume_step;
        }
        s.running = true;
        s.promise = self->make_response_promise<run_summary>();
        s.summary.checkpoint = s.opts.resume_checkpoint;
        if (s.stop_requested) {  // a stop came before this request: nothing to train
          s.summary.stop_reason = "signal";
          deliver(self);
          return s.promise;
        }
        const auto n = s.peers.drafters.size();
        s.drafter_addr.resize(n);
        s.dispatched.resize(n);
        s.last_heartbeat.assign(n, self->clock().now());
        s.heartbeat_pending.assign(n, false);
        s.down.assign(n, false);
        s.restore_point.assign(n, 0);
        for (size_t d = 0; d < n; ++d) {
          s.idle.push_back(static_cast<int32_t>(d));
          s.drafter_addr[d] = s.peers.drafters[d].address();
        }
        // The supervisor watches every worker from here on (first message
        // from this actor to it: every restart request comes after).
        self->send(s.opts.supervisor, supervise_atom::value,
                   caf::actor_cast<coordinator_actor>(self), s.peers);
        s.group.clean.assign(n, true);  // all start from the same restore point
        self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
        maybe_form_group(self);
        start_epoch(self, done);
        for (auto& p : s.peers.prefetch)
          self->send(p, credit_atom::value, s.opts.credits);
        return s.promise;
      },
      [self](stop_atom) {
        auto& s = self->state;
        if (!s.running) {
          // Before the run request (a signal can beat the launcher's
          // request), the run ends as soon as it is asked for; after the
          // run there is nothing to stop.
          if (!s.ledger)
            s.stop_requested = true;
          return;
        }
        finish(self, "signal");
      },
      [self](status_atom) -> std::string {
        auto& s = self->state;
        nlohmann::json j{{"running", s.running}, {"stopping", s.stopping}, {"epoch", s.epoch},
                         {"step", s.step},       {"in_flight", s.in_flight.size()},
                         {"queued", s.queue.size()}, {"busy", s.busy.size()}};
        if (s.ledger) {
          auto c = s.ledger->state_counts();
          j["ledger"] = {{"pending", c.pending}, {"issued", c.issued}, {"trained", c.trained},
                         {"committed", c.committed}};
        }
        return j.dump();
      },
      [self](batch_desc& batch) {
        auto& s = self->state;
        if (s.stopping) {
          release(self, batch.source, batch.handle, 0);
          return;
        }
        batch.batch_id = s.ledger->issue(batch.sample_ids);
        for (auto id : batch.sample_ids)
          s.sample_source[id] = batch.source;
        s.in_flight[batch.batch_id] = flight{batch.source, batch.handle, 0, batch.real_tokens};
        self->send(s.peers.targets[static_cast<size_t>(batch.source)], std::move(batch));
      },
      [self](exhausted_atom, int32_t source, int64_t epoch) {
        auto& s = self->state;
        if (epoch == s.epoch && source >= 0 && static_cast<size_t>(source) < s.exhausted.size())
          s.exhausted[static_cast<size_t>(source)] = true;
        maybe_end_epoch(self);
      },
      [self](work_item& w) {
        auto& s = self->state;
        if (s.abandoned.erase(w.batch.batch_id) > 0) {
          release(self, w.batch.source, w.batch.handle, w.features.handle);
          return;
        }
        auto it = s.in_flight.find(w.batch.batch_id);
        if (it == s.in_flight.end() || s.stopping) {
          release(self, w.batch.source, w.batch.handle, w.features.handle);
          if (it != s.in_flight.end())
            s.in_flight.erase(it);
          try_complete(self);
          return;
        }
        it->second.features_handle = w.features.handle;
        s.queue.push_back(std::move(w));
        dispatch(self);
      },
      [self](const step_report& r) {
        auto& s = self->state;
        if (r.drafter < 0 || static_cast<size_t>(r.drafter) >= s.drafter_addr.size()
            || self->current_sender() != s.drafter_addr[static_cast<size_t>(r.drafter)])
          return;  // a replaced incarnation's late report
        if (grouped(self)) {
          on_group_report(self, r);
          return;
        }
        if (!r.finite) {
          self->send(s.peers.metrics, r);
          on_drafter_failure(self, r.drafter, "drafter " + std::to_string(r.drafter)
                                                + ": non-finite loss or gradient at step "
                                                + std::to_string(s.step + 1));
          return;
        }
        s.busy.erase(r.drafter);
        s.idle.push_back(r.drafter);
        retire(self, r.batch_id, r.step);
        s.step = r.step;
        if (!s.have_first_loss) {
          s.summary.first_loss = r.loss;
          s.have_first_loss = true;
        }
        s.summary.last_loss = r.loss;
        self->send(s.peers.metrics, r);
        after_step(self);
      },
      [self](drafter_down_atom, int32_t d, const std::string& why) {
        auto& s = self->state;
        if (!s.running || d < 0 || static_cast<size_t>(d) >= s.down.size())
          return;
        // Between group steps the survivors hold the ledger's state.
        on_drafter_failure(self, d, "drafter " + std::to_string(d) + " died at step "
                                      + std::to_string(s.step + 1) + ": " + why,
                           group_at_rest(self));
      },
      [self](drafter_up_atom, int32_t d, drafter_actor& fresh) {
        on_drafter_up(self, d, std::move(fresh));
      },
      [self](escalate_atom, const std::string& why) {
        // Stop as for a signal (the steps in progress finish: their features
        // stay valid until released), write a checkpoint, then answer the
        // run request with the error: nothing trained is lost.
        auto& s = self->state;
        if (!s.running)
          return;
        event(self, {{"event", "escalated"}, {"reason", why}, {"step", s.step}});
        if (s.stopping)
          return;  // already ending (a signal, the last epoch): it ends as it would
        s.escalated = why;
        finish(self, "escalated");
      },
      [self](tick_atom) {
        auto& s = self->state;
        if (!s.running)
          return;
        const auto now = self->clock().now();
        // A survivor of a broken group is inside a collective that cannot
        // complete: it comes back after group_timeout_s, not a hang.
        const double limit = grouped(self) && (!s.group.formed || !s.group.failed.empty())
                               ? std::max(s.opts.step_timeout_s, s.opts.group_timeout_s + 10)
                               : s.opts.step_timeout_s;
        for (auto d : std::vector<int32_t>(s.busy.begin(), s.busy.end())) {
          const double t = std::chrono::duration<double>(now - s.dispatched[static_cast<size_t>(d)]).count();
          if (t > limit)
            on_drafter_failure(self, d, "drafter " + std::to_string(d) + " hung: step "
                                          + std::to_string(s.step + 1) + " still running after "
                                          + std::to_string(static_cast<int64_t>(t)) + " s (step_timeout_s "
                                          + std::to_string(s.opts.step_timeout_s) + ")");
        }
        if (s.opts.heartbeat_s > 0 && !s.group.forming)  // joining blocks the drafters' threads
          for (auto d : std::vector<int32_t>(s.idle.begin(), s.idle.end()))
            ask_heartbeat(self, d, now);
        self->delayed_send(self, std::chrono::milliseconds(250), tick_atom::value);
      },
      [self](shutdown_atom) { self->quit(); },  // the supervisor shuts the drafters down
    };
  };
  return sys.spawn(behavior, std::move(opts));
}

} // namespace tandem
