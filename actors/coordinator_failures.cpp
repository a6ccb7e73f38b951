// The coordinator's drafter failures: detection (the supervisor's down
// message, a non-finite loss, the step watchdog, missed heartbeats), the
// ledger's rollback, the restart request and the new incarnation
// (actors/coordinator_state.hpp).  The restarts themselves are the
// supervisor's (actors/supervisor.cpp).
#include <algorithm>

#include <spdlog/spdlog.h>

#include "actors/coordinator_state.hpp"
#include "messages/errors.hpp"
#include "messages/node.hpp"

namespace tandem::coord {

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
void on_drafter_failure(self_ptr self, int32_t d, const std::string& reason, bool peers_hold_state) {
  auto& s = self->state;
  auto& slot = s.slot(d);
  if (slot.down || !s.running())
    return;
  slot.down = true;
  // Forget the failed incarnation: its late messages no longer match (the
  // supervisor kills it if it is still alive).
  slot.addr = caf::actor_addr{};
  if (s.checkpoint == checkpoint_phase::snapshot && s.checkpoint_src == d) {
    // Its snapshot will not come (a drafter lost with its node is never
    // answered for): the checkpoint is given up now, so the next one, an
    // end's included, need not wait for that request's deadline.
    s.checkpoint = checkpoint_phase::none;
    ++s.checkpoint_seq;
  }
  if (slot.snapshot_pending) {
    // Its snapshot will not be answered by this incarnation: a checkpoint
    // waiting for it (checkpoint_after_host) is taken after the next step
    // instead, or by an epoch's end once the drafter is back (on_drafter_up).
    if (std::exchange(s.checkpoint_after_host, false))
      s.checkpoint_due = true;
    if (slot.snapshot_beside_work) {
      // It was a restore point in shared memory (a step sent beside its
      // copy failed, or the drafter hung): given up, as a checkpoint is
      // above, so the next one need not wait for the request's deadline
      // (snapshot_timeout, 10 minutes).
      s.host_busy = false;
      ++s.host_seq;
    }
    slot.snapshot_pending = false;
    slot.snapshot_beside_work = false;
  }
  // An evaluation waiting for its snapshot (eval_src) is given up too,
  // rather than at the request's deadline: the evaluations after it, and a
  // run's end waiting for its final one, go on now.  That may answer the
  // run (its final evaluation; the final checkpoint is written before it).
  give_up_eval(self, d, reason);
  if (!s.running())
    return;
  s.busy.erase(d);
  s.idle.erase(std::remove(s.idle.begin(), s.idle.end(), d), s.idle.end());
  if (s.grouped() && !peers_hold_state && s.group->in_step()) {
    // Inside a group step: abort the group so the survivors stop waiting
    // for this rank, and let their reports say where their states are (the
    // step before, their guarded update skipped, or this one, the
    // collective complete) before deciding what to roll back.
    abort_group(self, reason);
    if (s.group->rank_failed(d, reason))
      resolve_group_failure(self);
    return;
  }
  roll_back_and_restart(self, d, reason, peers_hold_state);
}

/// The failure's consequences once the drafter is marked down: the group
/// (if any) broken, the ledger rolled back to the restore point, what was
/// lost re-issued, the supervisor asked for a restart.
void roll_back_and_restart(self_ptr self, int32_t d, const std::string& reason, bool peers_hold_state) {
  auto& s = self->state;
  const auto di = static_cast<size_t>(d);
  if (!s.running())
    return;
  bool keep_state = false;
  if (s.grouped()) {
    // A healthy peer must remain to take the state from.
    if (peers_hold_state)
      for (size_t j = 0; j < s.drafters.size(); ++j)
        keep_state |= j != di && !s.drafters[j].down && s.drafters[j].clean;
    // Survivors blocked in the group's collective (or init) with the failed
    // rank would wait for group_timeout_s: abort it for them now.
    abort_group(self, reason);
    s.group->dissolve();
    if (keep_state)
      s.drafters[di].clean = false;  // restarted from an older checkpoint
    else
      for (auto& x : s.drafters)
        x.clean = false;  // all roll back below
  }
  // A single drafter's restore point in device memory, when it is newer
  // than the newest checkpoint (DESIGN.md §3, restore tiers): an exception,
  // a NaN or a hang in this live process loses at most the step since it.
  // If it is gone (the new incarnation cannot restore it), that failure
  // comes back here with memory_step −1 and the checkpoint is used.
  const int64_t memory = s.grouped() ? -1 : s.drafters[di].memory_step;
  const bool from_memory = !keep_state && memory >= 0 && memory >= s.durable_step && memory <= s.step;
  s.drafters[di].memory_step = -1;  // known again from the new incarnation's first report
  // Roll back: everything after the restore point goes back to pending —
  // the newest checkpoint (or the memory restore point), or (survivors
  // holding the state) the current step, which returns only the batches in
  // flight.  Only a rollback past the current step makes a snapshot still
  // being written stale.
  const int64_t restore_step = keep_state    ? s.step
                               : from_memory ? memory
                                             : std::max<int64_t>(s.durable_step, 0);
  if (!keep_state && restore_step < s.step)
    ++s.lineage;
  auto back = s.ledger->rollback(keep_state || from_memory ? restore_step : s.durable_step);
  const int64_t lost_steps = s.step - restore_step;
  if (lost_steps > 0)
    s.discarded_to = std::max(s.discarded_to, s.step);
  s.step = restore_step;
  rewind_prefetches(self, back);
  // The supervisor counts the failure against the restart budget and
  // restarts the drafter from the restore point after its backoff (the new
  // incarnation arrives as drafter_up), or refuses: then the run fails.
  drafter_failed_event ev;
  ev.drafter = d;
  ev.reason = reason;
  ev.restore_step = s.step;
  ev.steps_lost = lost_steps;
  ev.restore_from = keep_state ? "peers" : from_memory ? "memory" : "checkpoint";
  ev.samples_reissued = static_cast<int64_t>(back.size());
  ev.checkpoint = s.summary.checkpoint;
  // The checkpoint named here is what the new incarnation holds, even if a
  // newer one is written before it comes up.
  // (with peers holding the state, the new incarnation itself still comes
  // from the checkpoint: the next group's broadcast brings it up to date)
  s.drafters[di].restore_point = from_memory ? restore_step : std::max<int64_t>(s.durable_step, 0);
  const auto from = from_memory ? std::string(memory_restore_prefix) + std::to_string(restore_step)
                                : s.summary.checkpoint;
  s.drafters[di].restored_from = from_memory ? "memory (step " + std::to_string(restore_step) + ")"
                                             : s.summary.checkpoint.empty() ? "fresh weights"
                                                                            : s.summary.checkpoint;
  self->request(s.opts.supervisor, std::chrono::minutes(1), restart_atom::value, d, reason, from)
    .then(
      [self, ev](const restart_plan& plan) mutable {
        ev.restart = plan.restart;
        ev.budget = plan.budget;
        ev.backoff_s = plan.backoff_s;
        event(self, std::move(ev));
      },
      [self, d](const caf::error& err) {
        event(self, budget_exhausted_event{d, self->system().render(err)});
        fail(self, err);
      });
}

/// Asks idle drafter `d` for a heartbeat when heartbeat_s has passed since
/// the last; no answer within heartbeat_s is a failure of that incarnation.
/// (A busy drafter's thread is inside its step: step_timeout_s covers it.)
void ask_heartbeat(self_ptr self, int32_t d, caf::actor_clock::time_point now) {
  auto& s = self->state;
  const auto di = static_cast<size_t>(d);
  auto& slot = s.drafters[di];
  if (slot.down || slot.heartbeat_pending || slot.snapshot_pending || !s.peers.drafters[di]
      || std::chrono::duration<double>(now - slot.last_heartbeat).count() < s.opts.heartbeat_s)
    return;
  slot.heartbeat_pending = true;
  slot.last_heartbeat = now;
  const auto addr = slot.addr;
  self->request(s.peers.drafters[di], seconds_to(s.opts.heartbeat_s), heartbeat_atom::value)
    .then(
      [self, d](int64_t) {
        auto& slot = self->state.slot(d);
        slot.heartbeat_pending = false;
        slot.last_heartbeat = self->clock().now();
      },
      [self, d, addr](caf::error& e) {
        auto& s = self->state;
        auto& slot = s.slot(d);
        slot.heartbeat_pending = false;
        if (slot.addr != addr || slot.down)
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
  if (d < 0 || static_cast<size_t>(d) >= s.drafters.size())
    return;
  const auto di = static_cast<size_t>(d);
  auto& slot = s.drafters[di];
  if (!s.running() || !slot.down)
    return;  // the run ended meanwhile: the supervisor shuts it down with the rest
  s.peers.drafters[di] = fresh;
  slot.addr = fresh.address();
  slot.down = false;
  slot.heartbeat_pending = false;
  slot.snapshot_pending = false;
  slot.snapshot_beside_work = false;
  slot.last_heartbeat = self->clock().now();
  s.idle.push_back(d);
  if (s.grouped())  // restored from the checkpoint its restart named: the ledger's state only if nothing came after it
    slot.clean = slot.restore_point == s.step;
  event(self, drafter_restarted_event{d, s.step, slot.restored_from});
  if (!slot.node.empty() && s.opts.cluster_door) {
    // A member's drafter may have come up on a spare: where it runs now
    // (its checkpoints are written there, and the checkpoint event says so).
    self->request(s.opts.cluster_door, std::chrono::seconds(30), drafter_node_atom::value, d)
      .then([self, di, addr = slot.addr](const std::string& node) {
              auto& s = self->state;
              if (di < s.drafters.size() && s.drafters[di].addr == addr)
                s.drafters[di].node = node;
            },
            [](const caf::error&) {});  // the door is gone: the run is ending
  }
  maybe_form_group(self);
  dispatch(self);
  try_complete(self);
  maybe_end_epoch(self);  // an epoch's end that waited for it (its checkpoint failed or was put off)
}

/// The watchdog (every 250 ms): a step running past its limit is a hung
/// drafter; idle drafters are asked for heartbeats.
void on_tick(self_ptr self) {
  auto& s = self->state;
  if (!s.running())
    return;
  const auto now = self->clock().now();
  // A survivor of a broken group is inside a collective that cannot
  // complete: it comes back after group_timeout_s, not a hang.
  const auto gp = s.grouped() ? s.group->current() : group_step::phase::ready;
  const bool group_broken = gp == group_step::phase::none || gp == group_step::phase::forming
                            || gp == group_step::phase::failing;
  const double limit = group_broken ? std::max(s.opts.step_timeout_s, s.opts.group_timeout_s + 10)
                                    : s.opts.step_timeout_s;
  for (auto d : std::vector<int32_t>(s.busy.begin(), s.busy.end())) {
    const double t = std::chrono::duration<double>(now - s.slot(d).dispatched).count();
    if (t > limit)
      on_drafter_failure(self, d, "drafter " + std::to_string(d) + " hung: step "
                                    + std::to_string(s.step + 1) + " still running after "
                                    + std::to_string(static_cast<int64_t>(t)) + " s (step_timeout_s "
                                    + std::to_string(s.opts.step_timeout_s) + ")");
  }
  const bool forming = s.grouped() && gp == group_step::phase::forming;
  if (s.opts.heartbeat_s > 0 && !forming)  // joining blocks the drafters' threads
    for (auto d : std::vector<int32_t>(s.idle.begin(), s.idle.end()))
      ask_heartbeat(self, d, now);
  self->delayed_send(self, std::chrono::milliseconds(250), tick_atom::value);
}

} // namespace tandem::coord
