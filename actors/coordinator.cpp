// The coordinator: routes batches prefetch -> target -> drafter against
// credits, keeps the sample ledger, decides checkpoints, ends epochs and the
// run; detects drafter failures and rolls the ledger back for them (their
// restarts are the supervisor's, actors/supervisor.cpp).  Cooperative: its
// handlers only move descriptors and counters.
//
// This file: the behaviour, one short handler a message of
// messages/coordinator.hpp, and spawn.  The state and the map of the other
// files are in actors/coordinator_state.hpp.
#include <algorithm>
#include <cmath>
#include <memory>
#include <cstdio>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/coordinator_state.hpp"
#include "actors/vitals.hpp"
#include "actors/default_handler.hpp"
#include "messages/errors.hpp"
#include "messages/supervisor.hpp"

namespace tandem {

namespace coord {

/// Stop as for a signal (the steps in progress finish: their features stay
/// valid until released), write a checkpoint, then answer the run request
/// with the error: nothing trained is lost.
void on_escalate(self_ptr self, const std::string& why, errc code) {
  auto& s = self->state;
  if (!s.running())
    return;
  event(self, escalated_event{why, s.step});
  if (s.stopping())
    return;  // already ending (a signal, the last epoch): it ends as it would
  s.escalated = why;
  s.escalated_code = code;
  finish(self, "escalated");
}

/// Drafter `d`'s restart is given up (its node did not join again, or
/// refused it as bad input): escalated as `code`, and the run's end stops
/// waiting for it (try_complete).
void on_drafter_given_up(self_ptr self, int32_t d, const std::string& why, errc code) {
  if (d >= 0 && static_cast<size_t>(d) < self->state.drafters.size())
    self->state.drafters[static_cast<size_t>(d)].given_up = true;
  on_escalate(self, why, code);
  try_complete(self);
}

namespace {

/// Checks the run request; the error to answer it with, or none.
caf::error check_run(coordinator_state& s, const coordinator_peers& peers) {
  if (s.running())
    return make_error(errc::bad_input, "coordinator: a run is already in progress");
  if (peers.drafters.empty())
    return make_error(errc::bad_input, "coordinator: no drafter");
  if (peers.prefetch.size() != peers.targets.size() || peers.prefetch.empty())
    return make_error(errc::bad_input, "coordinator: one prefetch per target is required");
  if (!credits_cover_drafters(s.opts.credits, static_cast<int64_t>(peers.prefetch.size()),
                              static_cast<int64_t>(peers.drafters.size())))
    return make_error(errc::bad_input,
                      "coordinator: runtime.credits (" + std::to_string(s.opts.credits) + ") x "
                        + std::to_string(peers.prefetch.size()) + " target(s) is less than the "
                        + std::to_string(peers.drafters.size())
                        + " data-parallel drafters: each group step needs one batch per drafter");
  if (!s.opts.supervisor)
    return make_error(errc::bad_input, "coordinator: no supervisor to restart drafters");
  return {};
}

/// The ledger to start from: a fresh one, or the resumed checkpoint's.
caf::expected<sample_ledger> make_ledger(const coordinator_options& opts) {
  if (opts.resume_ledger.empty())
    return sample_ledger(opts.num_samples);
  std::optional<sample_ledger> ledger;
  try {
    ledger.emplace(sample_ledger::restore(opts.resume_ledger));
  } catch (const std::exception& e) {
    return make_error(errc::bad_input, std::string("resume: the checkpoint's ledger: ") + e.what());
  }
  if (ledger->num_samples() != opts.num_samples)
    return make_error(errc::bad_input, "resume: the checkpoint's ledger covers "
                                         + std::to_string(ledger->num_samples())
                                         + " samples, the dataset has "
                                         + std::to_string(opts.num_samples));
  return std::move(*ledger);
}

/// The run request: check it, take the peers, start the first epoch.
caf::result<run_summary> on_run(self_ptr self, coordinator_peers& peers) {
  auto& s = self->state;
  // Everything that can fail is checked before the response promise exists:
  // once it does, CAF 0.17 drops an error returned here (the request counts
  // as answered) and the requester would wait forever.
  if (auto err = check_run(s, peers))
    return err;
  auto ledger = make_ledger(s.opts);
  if (!ledger)
    return ledger.error();
  s.peers = std::move(peers);
  s.ledger.emplace(std::move(*ledger));
  std::vector<int64_t> done;
  if (!s.opts.resume_ledger.empty()) {
    s.epoch = s.ledger->epoch();
    for (int64_t i = 0; i < s.ledger->num_samples(); ++i)
      if (s.ledger->is_committed(i))
        done.push_back(i);
    s.step = s.opts.resume_step;
    s.durable_step = s.opts.resume_step;
    s.durable_on_disk = s.opts.resume_on_disk;
  }
  // The multiplier's schedule of a resumed run (also of a worker restarted
  // before any checkpoint: tandem run, read_lr_schedule).
  for (const auto& [from, scale] : s.opts.resume_lr_scale)
    s.lr_changes[from] = scale;
  const bool stop_first = s.phase == run_phase::stop_before_run;
  s.phase = run_phase::running;
  s.promise = self->make_response_promise<run_summary>();
  s.summary.checkpoint = s.opts.resume_checkpoint;
  if (stop_first) {  // a stop came before this request: nothing to train
    s.summary.stop_reason = "signal";
    deliver(self);
    return s.promise;
  }
  const auto n = s.peers.drafters.size();
  const auto now = self->clock().now();
  s.drafters.assign(n, drafter_slot{});
  for (size_t d = 0; d < n; ++d) {
    s.drafters[d].addr = s.peers.drafters[d].address();
    s.drafters[d].last_heartbeat = now;
    if (d < s.opts.drafter_nodes.size())
      s.drafters[d].node = s.opts.drafter_nodes[d];
    s.idle.push_back(static_cast<int32_t>(d));  // all start from the same restore point (clean)
  }
  s.group.emplace(static_cast<int32_t>(n));
  const auto sources = s.peers.prefetch.size();
  s.target_down.assign(sources, false);
  s.prefetch_down.assign(sources, false);
  s.target_incarnation.assign(sources, 0);
  s.fresh_prefetch.assign(sources, false);
  s.held_features.assign(sources, {});
  s.held_batches.assign(sources, {});
  // The supervisor watches every worker from here on (first message from
  // this actor to it: every restart request comes after).
  self->send(s.opts.supervisor, supervise_atom::value, caf::actor_cast<coordinator_actor>(self), s.peers);
  self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
  maybe_form_group(self);
  start_epoch(self, done);
  if (s.opts.max_steps > 0 && s.step >= s.opts.max_steps) {
    // Resumed at or past max_steps: nothing to train (and no checkpoint to
    // write: the one resumed from holds this step).
    finish(self, "max_steps");
    return s.promise;
  }
  for (auto& p : s.peers.prefetch)
    self->send(p, credit_atom::value, s.opts.credits);
  return s.promise;
}

void on_stop(self_ptr self) {
  auto& s = self->state;
  if (!s.running()) {
    // Before the run request (a signal can beat the launcher's request), the
    // run ends as soon as it is asked for; after the run there is nothing to
    // stop.
    if (!s.ledger)
      s.phase = run_phase::stop_before_run;
    return;
  }
  finish(self, "signal");
}

std::string status_json(coordinator_state& s) {
  nlohmann::json j{{"running", s.running()}, {"stopping", s.stopping()}, {"paused", s.paused}, {"epoch", s.epoch},
                   {"step", s.step},         {"in_flight", s.in_flight.size()},
                   {"queued", s.queue.size()}, {"busy", s.busy.size()}};
  if (s.ledger) {
    auto c = s.ledger->state_counts();
    j["ledger"] = {{"pending", c.pending}, {"issued", c.issued}, {"trained", c.trained},
                   {"committed", c.committed}};
  }
  j["durable_step"] = s.durable_step;
  j["checkpoint"] = s.summary.checkpoint;
  j["lr_scale"] = s.lr_scale_at(s.step + 1);
  j["lr_changes"] = nlohmann::json::array();
  for (const auto& [from, scale] : s.lr_changes)
    j["lr_changes"].push_back({{"from_step", from}, {"scale", scale}});
  j["log_every"] = s.opts.log_every;
  j["credits"] = s.opts.credits;
  // Targets and prefetches being replaced (their index), and whether the
  // batches in flight then still wait to be issued again.
  auto down = [](const std::vector<bool>& v) {
    auto a = nlohmann::json::array();
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i])
        a.push_back(i);
    return a;
  };
  j["targets_down"] = down(s.target_down);
  j["prefetch_down"] = down(s.prefetch_down);
  j["reissue_due"] = s.rewind_due;
  // Per drafter: what the coordinator knows of it (the control endpoint's tree).
  auto drafters = nlohmann::json::array();
  for (size_t d = 0; d < s.drafters.size(); ++d) {
    const auto& slot = s.drafters[d];
    const auto i = static_cast<int32_t>(d);
    const char* state = slot.down                   ? "restarting"
                        : slot.snapshot_pending     ? "snapshotting"
                        : s.busy.count(i) != 0      ? "stepping"
                                                    : "idle";
    drafters.push_back({{"index", i}, {"state", state}, {"memory_step", slot.memory_step}, {"node", slot.node}});
  }
  j["drafters"] = std::move(drafters);
  return j.dump();
}

/// A control action for a step past the run's last (train.max_steps) would
/// never take effect: refused, naming the last.  (A run bounded by its
/// epochs knows its length only as an estimate: no bound there.)
std::optional<caf::error> past_the_last(const coordinator_state& s, int64_t at_step) {
  if (s.opts.max_steps <= 0 || at_step <= s.opts.max_steps)
    return std::nullopt;
  return make_error(errc::bad_input, "step " + std::to_string(at_step) + " is past the run's last step ("
                                       + std::to_string(s.opts.max_steps) + ", train.max_steps): it never comes");
}

/// An action through the control endpoint; each one that acts is a
/// control event naming its source.
caf::result<std::string> on_control(self_ptr self, const control_command& c) {
  auto& s = self->state;
  if (!s.running() || s.stopping())
    return make_error(errc::bad_input, "the run is " + std::string(s.stopping() ? "stopping" : "not running")
                                         + ": '" + c.action + "' is not possible now");
  std::string result;
  const auto step = std::to_string(s.step);
  if (c.action == "pause") {
    if (s.paused)
      return "already paused at step " + step;
    s.paused = true;
    result = "paused at step " + step
             + (s.busy.empty() ? "" : " (" + std::to_string(s.busy.size()) + " step(s) in progress finish)");
  } else if (c.action == "resume") {
    if (!s.paused)
      return "not paused (step " + step + ")";
    s.paused = false;
    result = "resumed at step " + step;
  } else if (c.action == "stop") {
    result = "stopping after step " + step + ": the steps in progress finish, then a checkpoint";
  } else if (c.action == "checkpoint") {
    if (s.step == s.durable_step)
      return "step " + step + " is already in checkpoint " + s.summary.checkpoint;
    if (s.busy.empty() && !s.checkpointing() && (!s.grouped() || group_at_rest(self))) {
      checkpoint(self, nullptr);
      result = "writing a checkpoint of step " + step;
    } else {
      s.checkpoint_due = true;
      result = "a checkpoint follows the step in progress (now at step " + step + ")";
    }
  } else if (c.action == "fault") {
    if (c.drafter < 0 || static_cast<size_t>(c.drafter) >= s.drafters.size())
      return make_error(errc::bad_input, "no drafter " + std::to_string(c.drafter) + " (the run has "
                                           + std::to_string(s.drafters.size()) + ")");
    if (s.slot(c.drafter).down)
      return make_error(errc::bad_input, "drafter " + std::to_string(c.drafter) + " is restarting: try again");
    if (c.at_step > 0 && c.at_step <= s.step)
      return make_error(errc::bad_input, "step " + std::to_string(c.at_step) + " is done (the run is at step "
                                           + std::to_string(s.step) + ")");
    if (auto past = past_the_last(s, c.at_step))
      return std::move(*past);
    self->send(s.peers.drafters[static_cast<size_t>(c.drafter)], fault_atom::value, c.kind, c.at_step);
    result = "fault '" + c.kind + "' armed on drafter " + std::to_string(c.drafter)
             + (c.at_step > 0 ? " for step " + std::to_string(c.at_step) : " for its next step");
  } else if (c.action == "lr_scale") {
    if (!(c.value > 0) || !std::isfinite(c.value))
      return make_error(errc::bad_input, "the learning-rate multiplier must be a positive number");
    const auto first = s.next_undispatched_step();
    const auto from = c.at_step > 0 ? c.at_step : first;
    if (from < first)
      return make_error(errc::bad_input, "step " + std::to_string(from) + " is done or under way: the first step "
                                           "still to be sent is " + std::to_string(first));
    if (auto past = past_the_last(s, from))
      return std::move(*past);
    // A change replaces the later ones: the schedule is what was asked last.
    s.lr_changes.erase(s.lr_changes.lower_bound(from), s.lr_changes.end());
    s.lr_changes[from] = c.value;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", c.value);
    result = std::string("learning-rate multiplier ") + buf + " from step " + std::to_string(from);
  } else if (c.action == "log_every") {
    if (c.value < 1 || c.value != std::floor(c.value) || c.value > 1e9)
      return make_error(errc::bad_input, "log_every must be a positive integer");
    s.opts.log_every = static_cast<int64_t>(c.value);
    self->send(s.peers.metrics, log_every_atom::value, s.opts.log_every);
    result = "a metrics line every " + std::to_string(static_cast<int64_t>(c.value)) + " steps";
  } else {
    return make_error(errc::bad_input, "unknown action '" + c.action
                                         + "' (pause, resume, stop, checkpoint, fault, lr_scale, log_every)");
  }
  control_event e{c.action, c.source, s.step, result, {}, {}};
  if (c.action == "lr_scale")  // the whole schedule, kept beside metrics.jsonl for a resumed worker
    for (const auto& [from, scale] : s.lr_changes) {
      e.lr_from.push_back(from);
      e.lr_scale.push_back(scale);
    }
  event(self, std::move(e));
  if (c.action == "stop")
    finish(self, "stopped");
  else if (c.action == "resume")
    dispatch(self);
  return result;
}

void on_exhausted(self_ptr self, int32_t source, int64_t epoch, int64_t generation) {
  auto& s = self->state;
  if (epoch == s.epoch && generation == s.data_generation && source >= 0 && static_cast<size_t>(source) < s.exhausted.size())
    s.exhausted[static_cast<size_t>(source)] = true;
  maybe_end_epoch(self);
}

void on_drafter_down(self_ptr self, int32_t d, const std::string& why) {
  auto& s = self->state;
  if (!s.running() || d < 0 || static_cast<size_t>(d) >= s.drafters.size())
    return;
  // Lost with its cluster node: its restore point in device memory went
  // with the process; the newest checkpoint (or a live peer) is what is left.
  if (why.rfind(node_lost_prefix, 0) == 0)
    s.drafters[static_cast<size_t>(d)].memory_step = -1;
  // Between group steps the survivors hold the ledger's state.
  on_drafter_failure(self, d, "drafter " + std::to_string(d) + " died at step " + std::to_string(s.step + 1)
                                + ": " + why,
                     group_at_rest(self));
}

/// A device's context is lost (messages/coordinator.hpp): fail now, saying
/// which step the newest durable checkpoint holds; nothing more can be
/// saved from this process.
void on_device_lost(self_ptr self, const std::string& why) {
  auto& s = self->state;
  if (!s.running())
    return;
  spdlog::error("device context lost at step {}: {}", s.step, why);
  fail(self, make_error(errc::device_lost, why));
}

/// Asks every peer for its vitals (messages/vitals.hpp), as urgent
/// messages, and answers with
/// the coordinator's own, then theirs in a fixed order (prefetch, targets,
/// drafters, checkpointers, metrics, eval, supervisor); a peer that does not
/// answer within answer_ms is listed unanswered.
caf::result<std::vector<actor_vitals>> on_vitals_all(self_ptr self, const std::shared_ptr<vitals_meter>& meter,
                                                     int64_t answer_ms) {
  auto& s = self->state;
  struct gather {
    caf::typed_response_promise<std::vector<actor_vitals>> rp;
    std::vector<actor_vitals> out;
    size_t pending = 0;
  };
  auto g = std::make_shared<gather>();
  g->rp = self->make_response_promise<std::vector<actor_vitals>>();
  g->out.push_back(meter->report(self->id()));
  auto ask = [&](const auto& handle, const char* role, int32_t index) {
    if (!handle)
      return;
    const auto slot = g->out.size();
    actor_vitals missing;
    missing.role = role;
    missing.index = index;
    missing.actor_id = handle->id();
    g->out.push_back(std::move(missing));
    ++g->pending;
    auto settle = [g] {
      if (--g->pending == 0)
        g->rp.deliver(std::move(g->out));
    };
    // Urgent: ahead of the work queued in its mailbox (a drafter may hold
    // `credits` work items), so it answers after the message in hand.
    self->template request<caf::message_priority::high>(handle, std::chrono::milliseconds(answer_ms),
                                                        vitals_atom::value)
      .then(
        [g, slot, settle](actor_vitals& v) {
          // Named by its place among the peers (two checkpointers share a role).
          v.role = std::move(g->out[slot].role);
          v.index = g->out[slot].index;
          g->out[slot] = std::move(v);
          settle();
        },
            [g, slot, settle](const caf::error& err) {
              g->out[slot].down = err == caf::sec::request_receiver_down;
              settle();
            });
  };
  const auto& p = s.peers;
  for (size_t i = 0; i < p.prefetch.size(); ++i)
    ask(p.prefetch[i], "prefetch", static_cast<int32_t>(i));
  for (size_t i = 0; i < p.targets.size(); ++i)
    ask(p.targets[i], "target", static_cast<int32_t>(i));
  for (size_t i = 0; i < p.drafters.size(); ++i)
    ask(p.drafters[i], "drafter", static_cast<int32_t>(i));
  ask(p.checkpointer, "checkpointer", 0);
  ask(p.host_checkpointer, "checkpointer", 1);
  ask(p.metrics, "metrics", 0);
  ask(p.eval, "eval", 0);
  ask(s.opts.supervisor, "supervisor", 0);
  if (g->pending == 0)
    g->rp.deliver(std::move(g->out));
  return g->rp;
}

} // namespace

coordinator_actor::behavior_type coordinator_behavior(self_ptr self, coordinator_options opts) {
  self->state.opts = std::move(opts);
  install_default_handler(self, coordinator_state::name);
  auto meter = std::make_shared<vitals_meter>(self->system(), "coordinator", 0, false);
  meter->figures = [self] {
    const auto& s = self->state;
    return std::vector<vitals_figure>{{"step", static_cast<double>(s.step)},
                                      {"epoch", static_cast<double>(s.epoch)},
                                      {"in_flight", static_cast<double>(s.in_flight.size())},
                                      {"queued", static_cast<double>(s.queue.size())}};
  };
  return counted(meter, coordinator_actor::behavior_type{
    vitals_handler(self, meter),
    [self, meter](vitals_all_atom, int64_t answer_ms) {
      return on_vitals_all(self, meter, std::clamp<int64_t>(answer_ms, 1, 60000));
    },
    [self](run_atom, coordinator_peers& peers) { return on_run(self, peers); },
    [self](stop_atom) { on_stop(self); },
    [self](status_atom) { return status_json(self->state); },
    [self](const control_command& c) { return on_control(self, c); },
    [self](batch_desc& batch) { on_batch(self, batch); },
    [self](exhausted_atom, int32_t source, int64_t epoch, int64_t generation) {
      on_exhausted(self, source, epoch, generation);
    },
    [self](work_item& w) { on_work_item(self, w); },
    [self](const step_report& r) { on_step_report(self, r); },
    [self](drafter_down_atom, int32_t d, const std::string& why) { on_drafter_down(self, d, why); },
    [self](drafter_up_atom, int32_t d, drafter_actor& fresh) { on_drafter_up(self, d, std::move(fresh)); },
    [self](escalate_atom, const std::string& why) { on_escalate(self, why, errc::device_failure); },
    [self](escalate_atom, bad_input_atom, const std::string& why) { on_escalate(self, why, errc::bad_input); },
    [self](escalate_atom, int32_t d, const std::string& why) {
      on_drafter_given_up(self, d, why, errc::device_failure);
    },
    [self](escalate_atom, bad_input_atom, int32_t d, const std::string& why) {
      on_drafter_given_up(self, d, why, errc::bad_input);
    },
    [self](worker_down_atom, const std::string& role, int32_t i, const std::string& why) {
      on_worker_down(self, role, i, why);
    },
    [self](worker_up_atom, int32_t i, target_actor& fresh) { on_target_up(self, i, std::move(fresh)); },
    [self](worker_up_atom, int32_t i, prefetch_actor& fresh) { on_prefetch_up(self, i, std::move(fresh)); },
    [self](tick_atom) { on_tick(self); },
    [self](device_lost_atom, const std::string& why) { on_device_lost(self, why); },
    [self](shutdown_atom) { self->quit(); },  // the supervisor shuts the drafters down
  });
}

} // namespace coord

coordinator_actor spawn_coordinator(caf::actor_system& sys, coordinator_options opts) {
  return sys.spawn(coord::coordinator_behavior, std::move(opts));
}

} // namespace tandem
