// The coordinator's targets and prefetches lost and restarted: while one is
// down nothing is dispatched, batches for its source are held and releases
// for it wait; once every lost one is back and no drafter is mid-step, the
// batches in flight are re-issued by rewinding every prefetch to the
// ledger's step (nothing trained is rolled back), so the steps that follow
// are the batches an uninterrupted run trains (actors/coordinator_state.hpp).
#include <spdlog/spdlog.h>

#include "actors/coordinator_state.hpp"
#include "messages/errors.hpp"

namespace tandem::coord {

namespace {

bool valid(const std::vector<bool>& v, int32_t i) {
  return i >= 0 && static_cast<size_t>(i) < v.size();
}

/// The batches in flight are dropped and every prefetch rewound to the
/// ledger's step (no training rolled back); the samples issued and not
/// trained go out again.
void rewind(self_ptr self) {
  auto& s = self->state;
  auto back = s.ledger->rollback(s.step);
  rewind_prefetches(self, back);
  spdlog::info("re-issuing {} samples from step {} (a target or prefetch was replaced)", back.size(), s.step);
  event(self, reissued_event{s.step, static_cast<int64_t>(back.size())});
}

/// Worker `index` of `role` is up again: once none is down, the rewind.
void worker_back(self_ptr self, const std::string& role, int32_t index) {
  auto& s = self->state;
  event(self, actor_restarted_event{role, index, s.step});
  if (!s.workers_down())
    s.rewind_due = true;
  maybe_rewind(self);
  try_complete(self);
}

} // namespace

void rewind_prefetches(self_ptr self, const std::vector<int64_t>& back) {
  auto& s = self->state;
  auto credit = drop_in_flight(self);
  for (auto id : back)
    s.sample_source.erase(id);
  (void)s.ledger->take_reissue(back.size());  // the prefetches pack them again
  // Every prefetch starts the epoch again, minus the samples the weights
  // hold, as a new data generation.  Its packer then makes the batches an
  // uninterrupted run makes after that step, so the steps trained again are
  // the same steps (re-packing only the lost samples would batch them
  // differently, and the weights would differ).  Batches packed before a
  // prefetch sees this are dropped on arrival (on_batch).
  ++s.data_generation;
  const auto done = s.ledger->consumed();
  s.exhausted.assign(s.peers.prefetch.size(), false);
  for (size_t p = 0; p < s.peers.prefetch.size(); ++p) {
    self->send(s.peers.prefetch[p], epoch_atom::value, s.epoch, s.data_generation, done);
    if (const auto c = credit_after_drop(self, p, credit[p]); c > 0 && !s.stopping())
      self->send(s.peers.prefetch[p], credit_atom::value, c);
  }
  // A target or prefetch replaced and back: this re-issued its batches too
  // (one still down is rewound when it is back).
  if (!s.workers_down())
    s.rewind_due = false;
}

void grant_credit(self_ptr self, size_t p, int32_t n) {
  auto& s = self->state;
  if (s.prefetch_down[p] || s.fresh_prefetch[p])
    return;  // its batches were dropped with it: the rewind grants the whole window
  self->send(s.peers.prefetch[p], credit_atom::value, n);
}

int32_t credit_after_drop(self_ptr self, size_t p, int32_t dropped) {
  auto& s = self->state;
  if (p < s.fresh_prefetch.size() && s.fresh_prefetch[p]) {
    s.fresh_prefetch[p] = false;
    return static_cast<int32_t>(s.opts.credits);
  }
  return dropped;
}

void maybe_rewind(self_ptr self) {
  auto& s = self->state;
  if (!s.rewind_due || !s.busy.empty() || s.workers_down() || !s.running())
    return;
  if (s.stopping()) {
    s.rewind_due = false;  // nothing more is issued: the end drops what is in flight
    return;
  }
  rewind(self);
  dispatch(self);
  maybe_end_epoch(self);
}

void on_worker_down(self_ptr self, const std::string& role, int32_t index, const std::string& why) {
  auto& s = self->state;
  const bool target = role == target_role;
  auto& down = target ? s.target_down : s.prefetch_down;
  if (!s.running() || !valid(down, index) || down[static_cast<size_t>(index)])
    return;
  down[static_cast<size_t>(index)] = true;
  s.rewind_due = false;  // the rewind waits for this one too
  spdlog::warn("{} {} lost at step {}: {}", role, index, s.step, why);
  if (s.stopping()) {
    // Ending anyway: what is in flight is dropped, nothing is restarted.
    try_complete(self);
    return;
  }
  actor_failed_event ev{role, index, why, s.step, 0, 0, 0};
  self->request(s.opts.supervisor, std::chrono::minutes(1), restart_atom::value, role, index, why)
    .then(
      [self, ev](const restart_plan& plan) mutable {
        ev.restart = plan.restart;
        ev.budget = plan.budget;
        ev.backoff_s = plan.backoff_s;
        event(self, std::move(ev));
      },
      [self, ev](const caf::error& err) mutable {
        // Past its budget: the run stops as for a signal (the drafters are
        // healthy: their steps finish and a checkpoint keeps them), then
        // answers with the error.
        ev.restart = -1;
        event(self, std::move(ev));
        on_escalate(self, self->system().render(err), errc::device_failure);
      });
}

void on_target_up(self_ptr self, int32_t index, target_actor fresh) {
  auto& s = self->state;
  if (!s.running() || !valid(s.target_down, index) || !s.target_down[static_cast<size_t>(index)])
    return;  // the run ended meanwhile: the supervisor shuts it down with the rest
  const auto i = static_cast<size_t>(index);
  s.peers.targets[i] = std::move(fresh);
  s.target_down[i] = false;
  ++s.target_incarnation[i];
  // Releases of features its last incarnation published: a no-op in
  // another process (they went with it), the memory freed in this one.
  for (auto h : std::exchange(s.held_features[i], {}))
    self->send(s.peers.targets[i], release_atom::value, h);
  // Batches abandoned at the incarnation that died never come back: their
  // batch handles are released here.
  for (auto it = s.abandoned.begin(); it != s.abandoned.end();) {
    if (it->second.source == index && it->second.target_incarnation < s.target_incarnation[i]) {
      release(self, index, it->second.batch_handle, 0);
      it = s.abandoned.erase(it);
    } else {
      ++it;
    }
  }
  worker_back(self, target_role, index);
}

void on_prefetch_up(self_ptr self, int32_t index, prefetch_actor fresh) {
  auto& s = self->state;
  if (!s.running() || !valid(s.prefetch_down, index) || !s.prefetch_down[static_cast<size_t>(index)])
    return;
  const auto i = static_cast<size_t>(index);
  s.peers.prefetch[i] = std::move(fresh);
  s.prefetch_down[i] = false;
  s.fresh_prefetch[i] = true;  // its epoch and its credits come with the rewind
  for (auto h : std::exchange(s.held_batches[i], {}))
    self->send(s.peers.prefetch[i], release_atom::value, h);
  worker_back(self, prefetch_role, index);
}

} // namespace tandem::coord
