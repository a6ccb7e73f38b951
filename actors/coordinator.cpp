// The coordinator: routes batches prefetch -> target -> drafter against
// credits, keeps the sample ledger, decides checkpoints, ends epochs and the
// run.  Cooperative: its handlers only move descriptors and counters.
#include <algorithm>
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
  bool have_first_loss = false;
  // Supervision.
  std::map<int64_t, int32_t> sample_source;      ///< issued, not yet committed: which prefetch
  std::set<int64_t> abandoned;                   ///< rolled back while at a target
  std::vector<caf::actor_addr> drafter_addr;     ///< the live incarnation of each drafter
  // Times are the actor clock's (self->clock().now()), the clock that also fires the
  // watchdog tick and the restart backoff: steady_clock in production, the
  // deterministic clock in protocol tests.
  std::vector<caf::actor_clock::time_point> dispatched;  ///< when its step started
  std::vector<std::vector<std::pair<caf::actor_clock::time_point, std::string>>> failures;
  std::vector<bool> down;                        ///< waiting for its restart
  std::vector<caf::actor_clock::time_point> last_heartbeat;  ///< last asked (idle drafters)
  std::vector<bool> heartbeat_pending;           ///< asked, no answer yet
  int64_t lineage = 0;                           ///< rollbacks so far (a snapshot older than one is stale)
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

void dispatch(self_ptr self) {
  auto& s = self->state;
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

/// Snapshot drafter 0, write it, mark the ledger durable; then run the
/// continuations queued meanwhile.
void checkpoint(self_ptr self, std::function<void()> then) {
  auto& s = self->state;
  if (then)
    s.after_checkpoint.push_back(std::move(then));
  if (s.checkpointing)
    return;
  s.checkpointing = true;
  const auto extra = ledger_json(self);
  const auto lineage = s.lineage;
  self->request(s.peers.drafters.front(), std::chrono::minutes(10), snapshot_atom::value)
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
  s.promise.deliver(s.summary);
}

/// When stopping: once no drafter is mid-step, write the last checkpoint
/// (if there is anything new) and answer the run request.
void try_complete(self_ptr self) {
  auto& s = self->state;
  if (!s.stopping || !s.busy.empty() || s.checkpointing)
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

/// A drafter failed: roll back to the newest checkpoint, re-issue what was
/// lost, and restart it after its backoff — or end the run past the budget.
void on_drafter_failure(self_ptr self, int32_t d, const std::string& reason) {
  auto& s = self->state;
  const auto di = static_cast<size_t>(d);
  if (s.down[di] || !s.running)
    return;
  s.down[di] = true;
  const auto now = self->clock().now();
  auto& f = s.failures[di];
  f.emplace_back(now, reason);
  while (!f.empty() && std::chrono::duration<double>(now - f.front().first).count() > s.opts.window_s)
    f.erase(f.begin());
  // Forget the failed incarnation: its late messages and its down message
  // no longer match, and it is killed (a hung one dies when it unblocks).
  if (s.peers.drafters[di])
    self->send_exit(s.peers.drafters[di], caf::exit_reason::kill);
  s.drafter_addr[di] = caf::actor_addr{};
  s.busy.erase(d);
  s.idle.erase(std::remove(s.idle.begin(), s.idle.end(), d), s.idle.end());
  const auto restarts = static_cast<int64_t>(f.size());
  if (restarts > s.opts.restart_budget) {
    std::string report = "drafter " + std::to_string(d) + " failed " + std::to_string(restarts)
                         + " times within " + std::to_string(static_cast<int64_t>(s.opts.window_s))
                         + " s (restart budget " + std::to_string(s.opts.restart_budget) + "):";
    for (auto& [t, why] : f)
      report += "\n  - " + why;
    event(self, {{"event", "budget_exhausted"}, {"drafter", d}, {"failures", restarts}});
    fail(self, make_error(errc::device_failure, report));
    return;
  }
  // Roll back: everything after the newest checkpoint goes back to pending.
  ++s.lineage;
  auto back = s.ledger->rollback(s.durable_step);
  const int64_t lost_steps = s.step - std::max<int64_t>(s.durable_step, 0);
  s.step = std::max<int64_t>(s.durable_step, 0);
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
  const auto& b = s.opts.backoff_s;
  const double wait = b.empty() ? 0.0 : b[std::min(b.size(), static_cast<size_t>(restarts)) - 1];
  event(self, {{"event", "drafter_failed"}, {"drafter", d}, {"reason", reason},
               {"restart", restarts}, {"budget", s.opts.restart_budget},
               {"restore_step", s.step}, {"steps_lost", lost_steps},
               {"samples_reissued", static_cast<int64_t>(back.size())},
               {"checkpoint", s.summary.checkpoint}, {"backoff_s", wait}});
  self->delayed_send(self, std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::duration<double>(wait)),
                     respawn_atom::value, d);
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
                                      + self->system().render(e));
      });
}

void respawn(self_ptr self, int32_t d) {
  auto& s = self->state;
  const auto di = static_cast<size_t>(d);
  if (!s.running || !s.down[di])
    return;
  auto fresh = s.opts.respawn_drafter(d, s.summary.checkpoint);
  self->monitor(fresh);
  s.peers.drafters[di] = fresh;
  s.drafter_addr[di] = fresh.address();
  s.down[di] = false;
  s.heartbeat_pending[di] = false;
  s.last_heartbeat[di] = self->clock().now();
  s.idle.push_back(d);
  event(self, {{"event", "drafter_restarted"}, {"drafter", d}, {"step", s.step},
               {"from", s.summary.checkpoint.empty() ? "fresh weights" : s.summary.checkpoint}});
  dispatch(self);
  try_complete(self);
}

int32_t drafter_index(self_ptr self, const caf::actor_addr& a) {
  auto& s = self->state;
  for (size_t i = 0; i < s.drafter_addr.size(); ++i)
    if (s.drafter_addr[i] && s.drafter_addr[i] == a)
      return static_cast<int32_t>(i);
  return -1;
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
        if (peers.drafters.size() != 1)
          return make_error(errc::bad_input,
                            "coordinator: " + std::to_string(peers.drafters.size())
                              + " drafters; data-parallel drafters need the NCCL all-reduce of the "
                                "GPU engine (not yet built): use one drafter");
        if (peers.prefetch.size() != peers.targets.size() || peers.prefetch.empty())
          return make_error(errc::bad_input, "coordinator: one prefetch per target is required");
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
        s.failures.resize(n);
        s.down.assign(n, false);
        for (size_t d = 0; d < n; ++d) {
          s.idle.push_back(static_cast<int32_t>(d));
          s.drafter_addr[d] = s.peers.drafters[d].address();
          self->monitor(s.peers.drafters[d]);
        }
        self->set_down_handler([self](caf::down_msg& m) {
          auto d = drafter_index(self, m.source);
          if (d >= 0)
            on_drafter_failure(self, d, "drafter " + std::to_string(d) + " died at step "
                                          + std::to_string(self->state.step + 1) + ": "
                                          + self->system().render(m.reason));
        });
        self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
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
        if (!r.finite) {
          self->send(s.peers.metrics, r);
          on_drafter_failure(self, r.drafter, "drafter " + std::to_string(r.drafter)
                                                + ": non-finite loss or gradient at step "
                                                + std::to_string(s.step + 1));
          return;
        }
        s.busy.erase(r.drafter);
        s.idle.push_back(r.drafter);
        auto it = s.in_flight.find(r.batch_id);
        if (it != s.in_flight.end()) {
          release(self, it->second.source, it->second.batch_handle, it->second.features_handle);
          if (!s.stopping)
            self->send(s.peers.prefetch[static_cast<size_t>(it->second.source)], credit_atom::value,
                       int32_t{1});
          s.in_flight.erase(it);
        }
        s.ledger->trained(r.batch_id, r.step);
        s.step = r.step;
        if (!s.have_first_loss) {
          s.summary.first_loss = r.loss;
          s.have_first_loss = true;
        }
        s.summary.last_loss = r.loss;
        self->send(s.peers.metrics, r);
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
      },
      [self](respawn_atom, int32_t d) { respawn(self, d); },
      [self](tick_atom) {
        auto& s = self->state;
        if (!s.running)
          return;
        const auto now = self->clock().now();
        for (auto d : std::vector<int32_t>(s.busy.begin(), s.busy.end())) {
          const double t = std::chrono::duration<double>(now - s.dispatched[static_cast<size_t>(d)]).count();
          if (t > s.opts.step_timeout_s)
            on_drafter_failure(self, d, "drafter " + std::to_string(d) + " hung: step "
                                          + std::to_string(s.step + 1) + " still running after "
                                          + std::to_string(static_cast<int64_t>(t)) + " s (step_timeout_s "
                                          + std::to_string(s.opts.step_timeout_s) + ")");
        }
        if (s.opts.heartbeat_s > 0)
          for (auto d : std::vector<int32_t>(s.idle.begin(), s.idle.end()))
            ask_heartbeat(self, d, now);
        self->delayed_send(self, std::chrono::milliseconds(250), tick_atom::value);
      },
      [self](shutdown_atom) {
        // The drafters' current incarnations are known only here.
        for (auto& d : self->state.peers.drafters)
          if (d)
            self->send(d, shutdown_atom::value);
        self->quit();
      },
    };
  };
  return sys.spawn(behavior, std::move(opts));
}

} // namespace tandem
