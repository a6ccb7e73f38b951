// The coordinator's evaluations ([eval]): a snapshot of the drafter's
// weights goes to the eval actor (messages/eval.hpp), which measures real τ
// off the training thread; its answer is the "eval" event of metrics.jsonl
// and the run summary's τ.  One at a time: one due while another runs is
// skipped (its successor measures newer weights anyway).
#include <utility>

#include <spdlog/spdlog.h>

#include "actors/coordinator_state.hpp"
#include "actors/time.hpp"

namespace tandem::coord {

namespace {

/// The evaluation in progress is answered (or failed): the event, the
/// summary, then what waited for it.
void eval_answered(self_ptr self, eval_event e) {
  auto& s = self->state;
  s.eval_busy = false;
  s.eval_step = e.step;  // tried: the end does not try the same weights again
  if (e.error.empty()) {
    s.summary.eval_step = e.step;
    s.summary.eval_tau = e.tau;
    spdlog::info("eval: step {}: tau {:.3f} over {} prompts ({} cycles, {:.0f} tokens/s, {:.1f} s)", e.step, e.tau,
                 e.prompts, e.cycles, e.tokens_per_s, e.seconds);
  } else {
    spdlog::warn("eval: step {}: {} (training goes on)", e.step, e.error);
  }
  event(self, std::move(e));
  auto todo = std::exchange(s.after_eval, {});
  for (auto& f : todo)
    f();
}

} // namespace

void evaluate(self_ptr self) {
  auto& s = self->state;
  if (!s.peers.eval || s.eval_off)
    return;
  if (s.eval_busy) {
    s.eval_due = false;
    spdlog::info("eval at step {} skipped: the evaluation of an earlier step is still running", s.step);
    return;
  }
  const auto src = snapshot_source(self);
  auto& slot = s.slot(src);
  if (slot.snapshot_pending || slot.down) {
    s.eval_due = true;  // taken after the next step
    return;
  }
  s.eval_due = false;
  s.eval_busy = true;
  s.eval_src = src;
  const auto seq = ++s.eval_seq;
  slot.snapshot_pending = true;
  const auto addr = slot.addr;
  const auto step = s.step;
  auto answered = [self, src, addr] { snapshot_answered(self, src, addr); };
  self->request(s.peers.drafters[static_cast<size_t>(src)], snapshot_timeout, snapshot_atom::value)
    .then(
      [self, answered, seq](const snapshot_desc& snap) {
        if (self->state.eval_seq != seq) {  // given up when its drafter failed (give_up_eval)
          drop_snapshot(self, snap);
          answered();
          return;
        }
        self->state.eval_src = -1;
        answered();
        const auto timeout = seconds_to(self->state.opts.eval_timeout_s);
        self->request(self->state.peers.eval, timeout, snap)
          .then([self](eval_event& e) { eval_answered(self, std::move(e)); },
                [self, step = snap.step](const caf::error& err) {
                  // The eval actor is gone or overran its deadline: no more
                  // evaluations in this run (its handle is not waited for).
                  self->state.eval_off = true;
                  eval_event e;
                  e.step = step;
                  e.error = "the eval actor did not answer: " + self->system().render(err)
                            + " (no more evaluations in this run)";
                  eval_answered(self, std::move(e));
                });
      },
      [self, answered, step, seq](const caf::error& err) {
        answered();
        if (self->state.eval_seq != seq)
          return;  // given up already (give_up_eval)
        self->state.eval_src = -1;
        eval_event e;
        e.step = step;
        e.error = "snapshot failed: " + self->system().render(err);
        eval_answered(self, std::move(e));
      });
}

void give_up_eval(self_ptr self, int32_t d, const std::string& reason) {
  auto& s = self->state;
  if (!s.eval_busy || s.eval_src != d)
    return;
  ++s.eval_seq;  // its snapshot, should it come after all, is dropped
  s.eval_src = -1;
  eval_event e;
  e.step = s.step;
  e.error = "drafter " + std::to_string(d) + " failed before its snapshot for the evaluation came: " + reason;
  eval_answered(self, std::move(e));
}

void deliver_after_eval(self_ptr self) {
  auto& s = self->state;
  const bool finished = s.summary.stop_reason == "max_steps" || s.summary.stop_reason == "epochs";
  if (!s.peers.eval || s.eval_off || !s.opts.eval_at_end || !finished || !s.escalated.empty()) {
    deliver(self);
    return;
  }
  s.final_eval = true;  // try_complete waits: nothing else may answer meanwhile
  if (s.eval_busy) {
    s.after_eval.push_back([self] { deliver_after_eval(self); });
    return;
  }
  if (s.eval_step >= s.step) {
    deliver(self);
    return;
  }
  s.after_eval.push_back([self] { deliver(self); });
  evaluate(self);
  if (!s.eval_busy) {  // it could not start (a drafter is down or copying): end without it
    auto todo = std::exchange(s.after_eval, {});
    for (auto& f : todo)
      f();
  }
}

} // namespace tandem::coord
