// The coordinator's routing: batches prefetch -> target -> drafter against
// credits, the sample ledger's accounting of steps, checkpoints, epochs and
// the run's end (actors/coordinator_state.hpp).
#include <algorithm>
#include <utility>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/coordinator_state.hpp"
#include "gpu/transport/transport.hpp"
#include "messages/errors.hpp"

namespace tandem::coord {

void event(self_ptr self, run_event e) {
  self->send(self->state.peers.metrics, std::move(e));
}

void release(self_ptr self, int32_t source, uint64_t batch_handle, uint64_t features_handle) {
  auto& s = self->state;
  const auto i = static_cast<size_t>(source);
  // One being replaced gets them once its new incarnation is up.
  if (batch_handle) {
    if (s.prefetch_down[i])
      s.held_batches[i].push_back(batch_handle);
    else
      self->send(s.peers.prefetch[i], release_atom::value, batch_handle);
  }
  if (features_handle) {
    if (s.target_down[i])
      s.held_features[i].push_back(features_handle);
    else
      self->send(s.peers.targets[i], release_atom::value, features_handle);
  }
}

std::vector<int32_t> drop_in_flight(self_ptr self) {
  auto& s = self->state;
  std::vector<int32_t> per_source(s.peers.prefetch.size(), 0);
  for (auto& [id, f] : s.in_flight) {
    const auto i = static_cast<size_t>(f.source);
    ++per_source[i];
    if (f.features_handle)
      release(self, f.source, f.batch_handle, f.features_handle);
    else if (f.target_incarnation != s.target_incarnation[i] || s.target_down[i])
      release(self, f.source, f.batch_handle, 0);  // held, or at a target that died: never comes back
    else
      s.abandoned.emplace(id, f);  // still at its target: released when it comes back
  }
  s.in_flight.clear();
  s.queue.clear();
  return per_source;
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

namespace {

/// Whether `step` is one of every `n` (n = 0: none is).
bool on_every(int64_t n, int64_t step) {
  return n > 0 && step % n == 0;
}

/// Whether drafter `d`, its snapshot pending, may train the next step
/// meanwhile: the snapshot is a restore point for the shared-memory tier
/// (snapshot_beside_work), and no other snapshot is wanted at the step
/// that work ends at — an evaluation, a checkpoint, the next restore point
/// or the last step are each taken at their very step, which a step
/// completing while the drafter is still copying would put off.
bool work_beside_snapshot(const coordinator_state& s, int32_t d) {
  if (!s.drafters[static_cast<size_t>(d)].snapshot_beside_work)
    return false;
  const auto next = s.step + 1;
  return !s.checkpoint_after_host && !s.eval_due && !s.checkpoint_due && !s.host_due
         && !on_every(s.opts.eval_every, next) && !on_every(s.opts.checkpoint_every, next)
         && !on_every(s.opts.host_every, next) && !(s.opts.max_steps > 0 && next >= s.opts.max_steps);
}

} // namespace

void dispatch(self_ptr self) {
  auto& s = self->state;
  if (s.holding())
    return;  // the features wait in the queue (within the credits) until resumed
             // (paused), or until a lost target or prefetch is replaced
  if (s.grouped()) {
    dispatch_group(self);
    return;
  }
  while (!s.stopping() && !s.idle.empty() && !s.queue.empty()) {
    auto d = s.idle.front();
    if (s.slot(d).snapshot_pending && !work_beside_snapshot(s, d))
      break;  // it is copying a snapshot this work must not pass; dispatched once it answers
    s.idle.pop_front();
    s.busy.insert(d);
    s.slot(d).dispatched = self->clock().now();
    s.queue.front().lr_scale = s.lr_scale_at(s.step + 1);
    self->send(s.peers.drafters[static_cast<size_t>(d)], std::move(s.queue.front()));
    s.queue.pop_front();
  }
}

/// Answers the run request with `err` (once); the end event says which
/// step the newest durable checkpoint holds.
void fail(self_ptr self, const caf::error& err) {
  auto& s = self->state;
  if (s.running()) {
    s.phase = s.stopping() ? run_phase::stopped : run_phase::answered;
    event(self, end_event{"error", s.step, s.summary.checkpoint, s.durable_step, self->system().render(err)});
    s.promise.deliver(err);
  }
}

void drop_snapshot(self_ptr self, const snapshot_desc& snap) {
  auto& s = self->state;
  const auto d = static_cast<size_t>(snap.drafter);
  if (d < s.drafters.size() && s.drafters[d].node.empty())
    gpu::transport::release(snap.handle);
}

namespace {

std::string ledger_json(self_ptr self) {
  auto& s = self->state;
  // The checkpoint holds the weights after s.step (the drafter is idle when
  // a checkpoint is asked for), so its ledger commits what they include.
  nlohmann::json j{{"ledger", nlohmann::json::parse(s.ledger->save(s.step))}, {"step", s.step}, {"epoch", s.epoch}};
  // What a resume checks the data and the schedule against (tandem run).
  j["data"] = {{"content_hash", s.opts.data_hash}, {"schedule_steps", s.opts.schedule_steps}};
  // The learning-rate multiplier's schedule travels with the weights: a
  // resume trains the same steps with the same scale (bit-identical).
  if (!s.lr_changes.empty()) {
    j["lr_scale"] = nlohmann::json::array();
    for (const auto& [from, scale] : s.lr_changes)
      j["lr_scale"].push_back({from, scale});
  }
  return j.dump();
}

/// The checkpoint of `snap` is written in `dir`: it becomes the restore
/// point and commits what it holds, unless a rollback made it stale.
void on_checkpoint_written(self_ptr self, const snapshot_desc& snap, int64_t lineage,
                           const std::string& dir) {
  auto& s = self->state;
  s.checkpoint = checkpoint_phase::none;
  if (s.lineage != lineage) {
    // A drafter failed after this snapshot and the run rolled back past it:
    // these weights are not the ones training continues from, so they must
    // not become the restore point nor commit samples.  The continuations
    // wait for the next checkpoint; look again whether one is due now.
    spdlog::warn("checkpoint {} (step {}) predates a drafter failure: not used", dir, snap.step);
    event(self, checkpoint_discarded_event{snap.step, dir});
    try_complete(self);
    maybe_end_epoch(self);
    return;
  }
  const auto committed = s.ledger->durable(snap.step);
  s.durable_step = snap.step;
  s.durable_on_disk = true;
  s.discarded_to = 0;  // this checkpoint holds the state training continues from
  s.summary.checkpoint = dir;
  const auto src = static_cast<size_t>(snap.drafter);
  event(self, checkpoint_event{snap.step, dir, committed, s.ledger->state_counts().committed,
                               src < s.drafters.size() ? s.drafters[src].node : std::string()});
  auto todo = std::move(s.after_checkpoint);
  s.after_checkpoint.clear();
  for (auto& f : todo)
    f();
  // A checkpoint that came due meanwhile is taken after the next step
  // (after_step: the drafters are idle then, so the snapshot holds exactly
  // the ledger's step).
  // A stop that came while this checkpoint was written waited for it (an
  // epoch end's continuation does not look again).
  try_complete(self);
}

} // namespace

/// Which drafter to snapshot: drafter 0, or with data-parallel drafters the
/// first that is up and holds the ledger's state (drafter 0 may be down
/// for a restart after a step its survivors completed).
int32_t snapshot_source(self_ptr self) {
  auto& s = self->state;
  if (s.grouped())
    for (size_t d = 0; d < s.drafters.size(); ++d)
      if (!s.drafters[d].down && s.drafters[d].clean)
        return static_cast<int32_t>(d);
  return 0;  // a single drafter (or none fit: the request fails and the continuations wait)
}

/// Drafter `src`'s snapshot request is answered (or failed): incarnation
/// `addr` is no longer busy copying, and its answer counts as a heartbeat.
/// A checkpoint asked for while it copied a restore point for the shared
/// memory tier is taken now, while it is still at this step (only such a
/// copy defers one: checkpoint()); then work is dispatched again.
void snapshot_answered(self_ptr self, int32_t src, const caf::actor_addr& addr) {
  auto& s = self->state;
  auto& slot = s.slot(src);
  if (slot.addr != addr) {
    // A replaced incarnation's late answer: the live one may be mid-step,
    // where no checkpoint may begin (on_drafter_failure turned a checkpoint
    // waiting for this answer into checkpoint_due).
    dispatch(self);
    return;
  }
  slot.snapshot_pending = false;
  slot.snapshot_beside_work = false;
  slot.last_heartbeat = self->clock().now();  // it answered: alive now
  if (std::exchange(s.checkpoint_after_host, false) && !s.checkpointing())
    checkpoint(self, nullptr);
  dispatch(self);
}


/// Snapshot a drafter holding the ledger's state, write it, mark the ledger
/// durable; then run the continuations queued meanwhile.
void checkpoint(self_ptr self, std::function<void()> then) {
  auto& s = self->state;
  if (then)
    s.after_checkpoint.push_back(std::move(then));
  if (s.checkpointing()) {
    // Writes slower than checkpoint.every_steps coalesce: this one is
    // skipped, and the newest state is snapshotted once the write ends.
    if (s.step > s.checkpoint_step) {
      s.checkpoint_due = true;
      spdlog::info("checkpoint at step {} skipped: the write of step {} is still in progress; the step after "
                   "it ends is checkpointed instead",
                   s.step, s.checkpoint_step);
      event(self, checkpoint_skipped_event{s.step, s.checkpoint_step});
    }
    return;
  }
  const auto src = snapshot_source(self);
  if (s.slot(src).snapshot_pending) {
    // Its thread is copying a restore point for the shared-memory tier
    // (the drafter takes one snapshot at a time): this one follows the
    // moment that copy is answered, at the same step (no work is sent
    // meanwhile).
    s.checkpoint_after_host = true;
    return;
  }
  s.checkpoint = checkpoint_phase::snapshot;
  s.checkpoint_step = s.step;
  s.checkpoint_src = src;
  const auto seq = ++s.checkpoint_seq;
  s.checkpoint_due = false;
  const auto extra = ledger_json(self);
  const auto lineage = s.lineage;
  s.slot(src).snapshot_pending = true;
  const auto addr = s.slot(src).addr;
  // The drafter is busy while it copies (not asked for heartbeats); this
  // deadline is what watches it then.
  auto answered = [self, src, addr] { snapshot_answered(self, src, addr); };
  self->request(s.peers.drafters[static_cast<size_t>(src)], snapshot_timeout, snapshot_atom::value)
    .then(
      [self, extra, lineage, answered, seq](const snapshot_desc& snap) {
        answered();
        if (self->state.checkpoint_seq != seq) {
          // Given up when its drafter failed (abandon_checkpoint): another
          // checkpoint may be in progress now.  (A drafter that failed while
          // copying does not answer; this is a late answer of one that did.)
          spdlog::warn("checkpoint: a snapshot of step {} came after its drafter failed: not written", snap.step);
          drop_snapshot(self, snap);
          return;
        }
        self->state.checkpoint = checkpoint_phase::writing;
        self->request(self->state.peers.checkpointer, std::chrono::minutes(30), snap, extra)
          .then([self, snap, lineage](const std::string& dir) { on_checkpoint_written(self, snap, lineage, dir); },
                [self, snap](const caf::error& err) {
                  const auto why = self->system().render(err);
                  if (why.find(node_lost_prefix) == std::string::npos) {
                    fail(self, err);
                    return;
                  }
                  // Its node was lost mid-write (with the drafter: its
                  // failure rolls back): nothing became durable; the
                  // continuations wait for the next checkpoint.
                  auto& s = self->state;
                  s.checkpoint = checkpoint_phase::none;
                  spdlog::warn("checkpoint of step {} not written: {}", snap.step, why);
                  event(self, checkpoint_discarded_event{snap.step, ""});
                  try_complete(self);
                  maybe_end_epoch(self);
                });
      },
      [self, answered, seq](const caf::error& err) {
        // The drafter died before answering (supervision restarts it) or
        // overran the deadline (heartbeats judge it from here on); the
        // continuations wait for the next checkpoint, which an end in
        // progress asks for again.
        answered();
        if (self->state.checkpoint_seq == seq)
          self->state.checkpoint = checkpoint_phase::none;
        spdlog::warn("checkpoint: snapshot failed: {}", self->system().render(err));
      });
}

/// A restore point in shared memory (coordinator_settings::host_every):
/// the drafter's state at this step, snapshotted as a checkpoint is and
/// written by the host checkpointer into a folder that outlives the worker
/// process.  It commits nothing in the ledger (its own saved ledger counts
/// the steps it holds, for the worker that resumes from it).  One at a
/// time; one due while a snapshot or write is in progress is taken after
/// the next step.  A failed write turns the tier off for this process.
void host_restore_point(self_ptr self) {
  auto& s = self->state;
  if (!s.peers.host_checkpointer || s.host_off || s.stopping())
    return;
  const auto src = snapshot_source(self);
  auto& slot = s.slot(src);
  if (s.host_busy || slot.snapshot_pending || slot.down || (s.checkpointing() && s.checkpoint_step == s.step)) {
    // Busy, or a checkpoint of this very step is being taken (it holds
    // more than this would).
    s.host_due = s.host_busy || slot.snapshot_pending || slot.down;
    return;
  }
  s.host_busy = true;
  s.host_due = false;
  const auto seq = ++s.host_seq;
  const auto extra = ledger_json(self);
  slot.snapshot_pending = true;
  slot.snapshot_beside_work = true;
  const auto addr = slot.addr;
  auto answered = [self, src, addr] { snapshot_answered(self, src, addr); };
  self->request(s.peers.drafters[static_cast<size_t>(src)], snapshot_timeout, snapshot_atom::value)
    .then(
      [self, extra, answered, seq](const snapshot_desc& snap) {
        if (self->state.host_seq != seq) {
          // Given up when its drafter failed (on_drafter_failure): another
          // restore point may be in progress now.
          spdlog::warn("restore point in shared memory: a snapshot of step {} came after its drafter failed: "
                       "not written",
                       snap.step);
          drop_snapshot(self, snap);
          answered();
          return;
        }
        answered();
        self->request(self->state.peers.host_checkpointer, std::chrono::minutes(30), snap, extra)
          .then(
            [self, step = snap.step](const std::string& dir) {
              self->state.host_busy = false;
              event(self, restore_point_event{"host", step, dir, ""});
            },
            [self, step = snap.step](const caf::error& err) {
              auto& s = self->state;
              s.host_busy = false;
              const auto why = self->system().render(err);
              if (why.find(node_lost_prefix) != std::string::npos) {
                // Lost with its node (a new one comes with the node): not the tier's fault.
                event(self, restore_point_event{"host", step, "", why});
                return;
              }
              s.host_off = true;
              spdlog::warn("restore point in shared memory at step {} failed: {} (the tier is off for the rest "
                           "of this process; checkpoints go on)",
                           step, why);
              event(self, restore_point_event{"host", step, "", why});
            });
      },
      [self, answered, seq](const caf::error& err) {
        if (self->state.host_seq == seq)  // else given up already (its drafter failed)
          self->state.host_busy = false;
        answered();
        spdlog::warn("restore point in shared memory: snapshot failed: {}", self->system().render(err));
      });
}

/// Answers the run request with the summary (or the escalation's error).
void deliver(self_ptr self) {
  auto& s = self->state;
  if (!s.running())
    return;
  s.phase = s.stopping() ? run_phase::stopped : run_phase::answered;
  s.summary.steps = s.step;
  s.summary.samples_committed = s.ledger->state_counts().committed;
  // Trained weights that no durable checkpoint holds were lost (a drafter
  // failed while the final checkpoint was taken, and no survivor held its
  // state): never report success for them.  A stop with checkpoint.on_signal
  // = false keeps nothing new by request.
  const bool wanted = s.summary.stop_reason != "signal" || s.opts.checkpoint_on_stop;
  if (wanted && s.discarded_to > 0) {
    const auto held = s.durable_step < 0 ? std::string("no checkpoint holds any step")
                                         : "the newest durable checkpoint, " + s.summary.checkpoint
                                             + ", holds step " + std::to_string(s.durable_step);
    const auto why = "the run trained " + std::to_string(s.discarded_to) + " steps but " + held
                     + ": a drafter failed after its last step and before the final checkpoint was written, "
                       "so steps "
                     + std::to_string(std::max<int64_t>(s.durable_step, 0) + 1) + ".."
                     + std::to_string(s.discarded_to) + " are lost (tandem run --resume trains them again)";
    event(self, end_event{s.summary.stop_reason, s.step, s.summary.checkpoint, s.durable_step, why});
    s.promise.deliver(make_error(errc::device_failure, why));
    return;
  }
  event(self, end_event{s.summary.stop_reason, s.step, s.summary.checkpoint, s.durable_step,
                        s.escalated.empty() ? std::string() : s.escalated});
  if (!s.escalated.empty()) {
    // The run stopped for a worker it cannot replace; its training is safe.
    s.promise.deliver(make_error(
      s.escalated_code,
      s.escalated + "; the run stopped after step " + std::to_string(s.step)
        + (s.summary.checkpoint.empty() ? std::string(" with no checkpoint")
                                        : ", checkpoint " + s.summary.checkpoint
                                            + " holds it (tandem run --resume continues from it once the "
                                              "cause above is dealt with)")));
    return;
  }
  s.promise.deliver(s.summary);
}

/// When stopping: once no drafter is mid-step, write the last checkpoint
/// (if there is anything new) and answer the run request.
void try_complete(self_ptr self) {
  auto& s = self->state;
  if (!s.stopping() || !s.busy.empty() || s.checkpointing() || s.final_eval
      || (s.group && s.group->current() == group_step::phase::forming))
    return;
  for (const auto& d : s.drafters)
    if (d.down && !d.given_up) {
      // Its restart calls back here; a stop does not wait out its backoff
      // (the supervisor gets the restart request first: one sender, in order).
      if (s.opts.supervisor)
        self->send(s.opts.supervisor, hurry_atom::value);
      return;
    }
  // Everything not trained is abandoned: its samples stay uncommitted and
  // a resumed run issues them again.
  drop_in_flight(self);
  // A stop request (a signal) writes one last checkpoint unless
  // checkpoint.on_signal is false; then the ledger commits only what the
  // newest durable checkpoint holds, and a resumed run repeats the rest.
  // None without a drafter to take it from (its restart given up).
  const bool wanted = s.summary.stop_reason != "signal" || s.opts.checkpoint_on_stop;
  if (wanted && (s.step > s.durable_step || !s.durable_on_disk) && !s.slot(snapshot_source(self)).down)
    checkpoint(self, [self] { deliver_after_eval(self); });
  else
    deliver_after_eval(self);
}

void finish(self_ptr self, const std::string& reason) {
  auto& s = self->state;
  if (s.stopping())
    return;
  // From running; a run already answered with an error stops as before
  // (what is in flight drains) but answers nothing again.
  s.phase = s.running() ? run_phase::stopping : run_phase::stopped;
  s.summary.stop_reason = reason;
  try_complete(self);
}

void start_epoch(self_ptr self, const std::vector<int64_t>& done) {
  auto& s = self->state;
  s.exhausted.assign(s.peers.prefetch.size(), false);
  ++s.data_generation;
  event(self, epoch_event{s.epoch, s.ledger->num_samples(), static_cast<int64_t>(done.size())});
  for (auto& p : s.peers.prefetch)
    self->send(p, epoch_atom::value, s.epoch, s.data_generation, done);
}

namespace {

/// Every prefetch is exhausted and nothing of the epoch is left anywhere.
bool epoch_drained(self_ptr self) {
  auto& s = self->state;
  if (s.workers_down() || s.rewind_due)
    return false;  // what was in flight is issued again first
  for (bool e : s.exhausted)
    if (!e)
      return false;
  return s.in_flight.empty() && s.queue.empty() && s.busy.empty();
}

} // namespace

void maybe_end_epoch(self_ptr self) {
  auto& s = self->state;
  if (s.stopping() || s.checkpointing() || !epoch_drained(self))
    return;
  auto end_epoch = [self, e = s.epoch] {
    auto& s = self->state;
    if (s.epoch != e || s.stopping() || !epoch_drained(self))
      return;  // already handled (a continuation can run late after a failure)
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
  };
  // The epoch's last step may be in a checkpoint on disk already
  // (checkpoint.every_steps divides it): that one committed the whole epoch;
  // no second write of it.  (A restore point in shared memory a worker
  // resumed from is not on disk: written then.)
  if (s.step == s.durable_step && s.durable_on_disk)
    end_epoch();
  else
    checkpoint(self, end_epoch);
}

/// After a step's accounting: the run's end, a checkpoint, the next work.
void after_step(self_ptr self) {
  auto& s = self->state;
  if (s.opts.max_steps > 0 && s.step >= s.opts.max_steps) {
    finish(self, "max_steps");
    return;
  }
  if (s.stopping()) {
    try_complete(self);
    return;
  }
  maybe_rewind(self);  // a lost target or prefetch is back: now that no drafter is mid-step
  // An evaluation first: a checkpoint of the same step then follows the
  // moment its snapshot is answered (checkpoint_after_host), at this step.
  if (on_every(s.opts.eval_every, s.step) || s.eval_due)
    evaluate(self);
  if (on_every(s.opts.checkpoint_every, s.step) || (s.checkpoint_due && !s.checkpointing()))
    checkpoint(self, [self] { maybe_end_epoch(self); });
  if (on_every(s.opts.host_every, s.step) || s.host_due)
    host_restore_point(self);
  dispatch(self);
  maybe_end_epoch(self);
}

/// The batch is trained into the weights of step `step`: retire it.
void retire(self_ptr self, int64_t batch_id, int64_t step) {
  auto& s = self->state;
  auto it = s.in_flight.find(batch_id);
  if (it != s.in_flight.end()) {
    release(self, it->second.source, it->second.batch_handle, it->second.features_handle);
    if (!s.stopping())
      grant_credit(self, static_cast<size_t>(it->second.source), 1);
    s.in_flight.erase(it);
  }
  s.ledger->trained(batch_id, step);
}

/// A prefetch's batch: issue its samples in the ledger, send it to its target.
void on_batch(self_ptr self, batch_desc& batch) {
  auto& s = self->state;
  if (s.stopping()) {
    release(self, batch.source, batch.handle, 0);
    return;
  }
  if (batch.generation != s.data_generation) {
    // Packed before its prefetch saw a rollback: the rewound packer packs
    // these samples again, in the uninterrupted run's batches.
    release(self, batch.source, batch.handle, 0);
    grant_credit(self, static_cast<size_t>(batch.source), 1);
    return;
  }
  batch.batch_id = s.ledger->issue(batch.sample_ids);
  for (auto id : batch.sample_ids)
    s.sample_source[id] = batch.source;
  const auto i = static_cast<size_t>(batch.source);
  if (s.target_down[i]) {
    // Its target is being replaced: held, and issued again by the rewind
    // that follows (its credit comes back then).
    s.in_flight[batch.batch_id] = flight{batch.source, batch.handle, 0, batch.real_tokens, -1};
    return;
  }
  s.in_flight[batch.batch_id] = flight{batch.source, batch.handle, 0, batch.real_tokens, s.target_incarnation[i]};
  self->send(s.peers.targets[i], std::move(batch));
}

/// A target's features: queue the work for a drafter.
void on_work_item(self_ptr self, work_item& w) {
  auto& s = self->state;
  if (s.abandoned.erase(w.batch.batch_id) > 0) {
    release(self, w.batch.source, w.batch.handle, w.features.handle);
    return;
  }
  auto it = s.in_flight.find(w.batch.batch_id);
  if (it == s.in_flight.end() || s.stopping()) {
    release(self, w.batch.source, w.batch.handle, w.features.handle);
    if (it != s.in_flight.end())
      s.in_flight.erase(it);
    try_complete(self);
    return;
  }
  it->second.features_handle = w.features.handle;
  s.queue.push_back(std::move(w));
  dispatch(self);
}

/// A drafter's report (a single drafter; data-parallel ones: on_group_report).
void on_step_report(self_ptr self, const step_report& r) {
  auto& s = self->state;
  if (r.drafter < 0 || static_cast<size_t>(r.drafter) >= s.drafters.size()
      || self->current_sender() != s.slot(r.drafter).addr)
    return;  // a replaced incarnation's late report
  if (s.grouped()) {
    on_group_report(self, r);
    return;
  }
  if (r.lost_input) {
    // Its payloads never arrived over its link (the target died, or the
    // link failed): nothing was trained.  The batches in flight go out
    // again, as when a target is replaced: at once, or once every lost
    // target or prefetch is back (actors/coordinator_workers.cpp).
    spdlog::warn("drafter {}: the payloads of batch {} never arrived; the batches in flight are issued again",
                 r.drafter, r.batch_id);
    s.busy.erase(r.drafter);
    s.idle.push_back(r.drafter);
    s.rewind_due = true;
    maybe_rewind(self);
    try_complete(self);  // a run ending meanwhile waited for this drafter
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
  s.slot(r.drafter).memory_step = r.restore_point;
  if (r.scored_tokens > 0) {  // a step that scored nothing has no loss to report
    if (!s.have_first_loss) {
      s.summary.first_loss = r.loss;
      s.have_first_loss = true;
    }
    s.summary.last_loss = r.loss;
  }
  self->send(s.peers.metrics, r);
  after_step(self);
}

} // namespace tandem::coord
