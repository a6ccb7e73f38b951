// The coordinator's data-parallel drafters (more than one): forming their
// NCCL group through messages, dispatching lockstep group steps and
// accounting their reports.  actors/group_step.hpp holds the state machine
// and decides; this file does the messaging (actors/coordinator_state.hpp).
#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>

#include "actors/coordinator_state.hpp"
#include "messages/errors.hpp"

namespace tandem::coord {

namespace {

rank_report rank_of(const step_report& r) {
  return rank_report{r.drafter, r.step, r.finite, std::isfinite(r.loss), r.contributed, r.group_failed};
}

/// The full reports behind `ranks` (kept in the drafters' slots), in order.
std::vector<step_report> full_reports(self_ptr self, const std::vector<rank_report>& ranks) {
  std::vector<step_report> out;
  for (const auto& r : ranks)
    out.push_back(self->state.slot(r.drafter).report);
  return out;
}

} // namespace

/// Lockstep dispatch of one group step: all ranks idle, the group ready, N
/// queued batches (or fewer at the end of an epoch: the other ranks get a
/// copy with contribute = false, messages/drafter.hpp).
void dispatch_group(self_ptr self) {
  auto& s = self->state;
  const auto world = s.peers.drafters.size();
  if (s.stopping() || s.group->current() != group_step::phase::ready || s.idle.size() != world
      || s.queue.empty() || s.snapshot_pending())
    return;
  if (s.queue.size() < world && !epoch_tail(self))
    return;
  const auto now = self->clock().now();
  const work_item first = s.queue.front();
  std::vector<work_item> items;
  std::vector<int64_t> batches;
  for (size_t d = 0; d < world; ++d) {
    work_item w;
    if (!s.queue.empty()) {
      w = std::move(s.queue.front());
      s.queue.pop_front();
      batches.push_back(w.batch.batch_id);
    } else {
      w = first;
      w.contribute = false;
    }
    items.push_back(std::move(w));
  }
  s.group->dispatch(std::move(batches));
  s.idle.clear();
  for (auto& w : items)  // every replica alike
    w.lr_scale = s.lr_scale_at(s.step + 1);
  for (size_t d = 0; d < world; ++d) {
    s.busy.insert(static_cast<int32_t>(d));
    s.drafters[d].dispatched = now;
    self->send(s.peers.drafters[d], std::move(items[d]));
  }
}

/// Data-parallel drafters between group steps: every live replica holds the
/// weights of the ledger's step (nothing half-applied).
bool group_at_rest(self_ptr self) {
  auto& s = self->state;
  return s.grouped() && s.group->current() == group_step::phase::ready && s.busy.empty();
}

void abort_group(self_ptr self, const std::string& why) {
  auto& s = self->state;
  auto id = s.group->take_id();
  if (!id.empty() && s.opts.abort_group)
    s.opts.abort_group(id, why);
}

namespace {

/// Only the first failure of a generation is a drafter's fault.
void join_failed(self_ptr self, int64_t gen, int32_t d, const caf::actor_addr& addr,
                 const std::string& what) {
  auto& s = self->state;
  if (!s.group->join_failed(gen))
    return;
  if (s.slot(d).addr == addr && !s.slot(d).down)
    on_drafter_failure(self, d, what);
}

/// Drafter `d` of group `gen` joined as rank `rank`: the last join makes
/// the group ready.
void on_joined(self_ptr self, int64_t gen, int32_t root, int64_t step) {
  auto& s = self->state;
  if (!s.group->member_joined(gen))
    return;
  for (auto& slot : s.drafters)
    slot.clean = true;
  if (step != s.step)
    spdlog::warn("data-parallel group {}: rank 0 (drafter {}) is at step {}, the ledger at {}", gen,
                 root, step, s.step);
  event(self, group_formed_event{gen, s.group->world(), root, step});
  dispatch(self);
  try_complete(self);
  maybe_end_epoch(self);
}

/// The second half of forming group `gen`: rank 0 makes the NCCL id, every
/// drafter joins with it.
void join_group(self_ptr self, int64_t gen, int32_t root) {
  auto& s = self->state;
  const auto timeout = seconds_to(s.opts.group_timeout_s + 30);
  const auto root_addr = s.slot(root).addr;
  self->request(s.peers.drafters[static_cast<size_t>(root)], timeout, group_id_atom::value)
    .then(
      [self, gen, root, timeout](const std::vector<uint8_t>& id) {
        auto& s = self->state;
        if (!s.group->set_id(gen, id))
          return;
        const auto world = s.group->world();
        std::vector<int32_t> order{root};
        for (int32_t d = 0; d < world; ++d)
          if (d != root)
            order.push_back(d);
        for (int32_t rank = 0; rank < world; ++rank) {
          const auto d = order[static_cast<size_t>(rank)];
          const auto addr = s.slot(d).addr;
          group_spec g{id, rank, world, gen, s.opts.group_timeout_s};
          self->request(s.peers.drafters[static_cast<size_t>(d)], timeout, std::move(g))
            .then([self, gen, root](int64_t step) { on_joined(self, gen, root, step); },
                  [self, d, addr, gen](caf::error& e) {
                    join_failed(self, gen, d, addr,
                                "drafter " + std::to_string(d) + " could not join data-parallel group "
                                  + std::to_string(gen) + ": " + self->system().render(e));
                  });
        }
      },
      [self, root, root_addr, gen](caf::error& e) {
        join_failed(self, gen, root, root_addr,
                    "drafter " + std::to_string(root) + " could not create data-parallel group "
                      + std::to_string(gen) + ": " + self->system().render(e));
      });
}

} // namespace

/// Data-parallel drafters: forms a new NCCL group once every drafter is up
/// and idle.  Rank 0 is a clean drafter (one holding the restore point's
/// state: at the start every drafter, after a failure the restarted one,
/// restored from the newest checkpoint, or a survivor that holds the
/// ledger's step); joining broadcasts its weights, moments and step to the
/// others.  A rank that cannot join is a failed drafter; the others' joins
/// then time out and are not counted against them.
void maybe_form_group(self_ptr self) {
  auto& s = self->state;
  const auto world = s.peers.drafters.size();
  if (!s.grouped() || !s.running() || s.group->current() != group_step::phase::none)
    return;
  for (const auto& d : s.drafters)
    if (d.down)
      return;
  if (!s.busy.empty() || s.idle.size() != world)
    return;
  int32_t root = -1;
  for (size_t d = 0; d < world && root < 0; ++d)
    if (s.drafters[d].clean)
      root = static_cast<int32_t>(d);
  if (root < 0) {
    fail(self, make_error(errc::device_failure,
                          "data-parallel drafters: none holds the restore point's state"));
    return;
  }
  const auto gen = s.group->begin_forming();
  // First every drafter must be up: a restarted one answers only once it
  // has built its engine and restored its checkpoint (seconds at 8B), and
  // its peers' NCCL init must not start its deadline before that.
  for (size_t d = 0; d < world; ++d) {
    const auto addr = s.drafters[d].addr;
    self->request(s.peers.drafters[d], seconds_to(s.opts.step_timeout_s), heartbeat_atom::value)
      .then(
        [self, gen, root](int64_t) {
          if (self->state.group->member_up(gen))
            join_group(self, gen, root);
        },
        [self, gen, d, addr](caf::error& e) {
          join_failed(self, gen, static_cast<int32_t>(d), addr,
                      "drafter " + std::to_string(d) + " did not come up for data-parallel group "
                        + std::to_string(gen) + " within runtime.step_timeout_s: "
                        + self->system().render(e));
        });
  }
}

/// The group step's batches are trained into the weights of `step`: retire
/// them, count the step, and keep its loss (the mean over the contributing
/// ones of `reports`).
void count_group_step(self_ptr self, int64_t step, const std::vector<step_report>& reports) {
  auto& s = self->state;
  for (auto id : s.group->take_batches())
    retire(self, id, step);
  s.step = step;
  double loss = 0;
  int contributing = 0;
  for (const auto& x : reports)
    if (x.contributed && x.scored_tokens > 0) {  // a rank that scored nothing has no loss
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
/// reported (group_step::resolve says where their states are).  With all of
/// them at the step before or the step itself, training continues from a
/// survivor, losing no step; a state anywhere else sends everyone back to
/// the newest checkpoint.
void resolve_group_failure(self_ptr self) {
  auto& s = self->state;
  const auto res = s.group->resolve(s.step);
  if (res.step_trained) {
    // A survivor applied the whole step: its batches are in that state.
    std::vector<step_report> completed;
    for (auto d : res.completed) {
      const auto& r = s.slot(d).report;
      if (r.contributed)
        self->send(s.peers.metrics, r);
      completed.push_back(r);
    }
    count_group_step(self, res.step, completed);
  }
  if (res.known)  // the survivors at the step training continues from can lead the next group
    for (const auto& r : res.reports)
      s.slot(r.drafter).clean = res.holds_state(r);
  for (const auto& [d, why] : res.failed)
    roll_back_and_restart(self, d, why, res.known);
  if (res.step_trained)
    after_step(self);  // the step counts: max_steps, a checkpoint due, the epoch's end
}

/// A data-parallel drafter's report.  The group step is accounted when all
/// N are in: every real batch retired at the common step, or — a rank with
/// a non-finite loss, or a collective that failed — a drafter failure.
void on_group_report(self_ptr self, const step_report& r) {
  auto& s = self->state;
  s.busy.erase(r.drafter);
  if (std::find(s.idle.begin(), s.idle.end(), r.drafter) == s.idle.end())
    s.idle.push_back(r.drafter);
  const bool failing = s.group->current() == group_step::phase::failing;
  if (s.group->in_step())
    s.slot(r.drafter).report = r;
  switch (s.group->report(rank_of(r))) {
    case group_step::report_kind::stale:
      // A step cut short by a failure already handled: nothing to account.
      if (r.group_failed)
        event(self, group_step_abandoned_event{r.drafter});
      maybe_form_group(self);
      try_complete(self);
      return;
    case group_step::report_kind::resolve:
      resolve_group_failure(self);
      return;
    case group_step::report_kind::wait:
      // More reports due (a survivor of a failed rank: the other survivors').
      if (!failing && s.group->collective_failed()
          && s.busy.size() == static_cast<size_t>(s.group->reports_due())) {
        // Every rank still busy kept its peers' collective from completing.
        for (auto d : std::vector<int32_t>(s.busy.begin(), s.busy.end()))
          on_drafter_failure(self, d, "drafter " + std::to_string(d) + " did not complete group step "
                                        + std::to_string(s.step + 1) + ": its peers' collective timed out");
      }
      return;
    case group_step::report_kind::complete:
      break;
  }
  const auto v = s.group->finish_step(s.step);
  const auto reports = full_reports(self, v.reports);
  using kind = group_step::verdict::kind;
  if (v.what == kind::collective_failed) {
    on_drafter_failure(self, v.drafter, "drafter " + std::to_string(v.drafter) + ": the collective of group step "
                                          + std::to_string(s.step + 1) + " failed");
    return;
  }
  for (const auto& x : reports)
    if (x.contributed)
      self->send(s.peers.metrics, x);
  if (v.what == kind::not_finite) {
    on_drafter_failure(self, v.drafter, "drafter " + std::to_string(v.drafter)
                                          + ": non-finite loss or gradient at step "
                                          + std::to_string(s.step + 1),
                       /*peers_hold_state=*/v.all_skipped);
    return;
  }
  if (v.what == kind::disagree) {
    fail(self, make_error(errc::device_failure,
                          "data-parallel drafters disagree on the step after a group step: drafter "
                            + std::to_string(v.first_drafter) + " at " + std::to_string(v.step)
                            + ", drafter " + std::to_string(v.drafter) + " at " + std::to_string(v.other_step)));
    return;
  }
  count_group_step(self, v.step, reports);
  after_step(self);
}

} // namespace tandem::coord
