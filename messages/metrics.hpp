#pragma once
/// Metrics protocol.  Cooperative (cheap handlers): JSON lines, terminal
/// progress.
///
///   anyone               metrics
///     | -- step_report --> |  a line per logged report, progress every `every_s`
///     | -- run_event ----> |  a line {"event": <kind>, <its fields>, "time_s"}
///     | -- (event, json) > |  free-form: any JSON object as a line (text that
///     |                    |  is not JSON becomes {"event":"text","text":…})
///     | -- (shutdown) ---> |  flushes and quits
///
/// None of them is answered; all may arrive at any time (mid-step too).
///
/// The run's events are typed: `run_event` is one of the structs below, and
/// metrics.jsonl spells each as the line shown (actors/metrics.cpp writes
/// it; tools/bench/pipeline.py and tests/integration/*.sh read these names,
/// so a field is never renamed, only added).  "time_s" (seconds since the
/// metrics actor started) is added to every line.
///
///   kind                  line fields (besides "event" and "time_s")
///   epoch                 epoch, samples, already_committed
///   checkpoint            step, dir, committed_now, committed
///   checkpoint_discarded  step, dir
///   group_formed          generation, world, root, step
///   group_step_abandoned  drafter
///   drafter_failed        drafter, reason, restore_step, steps_lost, restore_from,
///                         samples_reissued, checkpoint, restart, budget, backoff_s
///   budget_exhausted      drafter, report
///   drafter_restarted     drafter, step, from
///   escalated             reason, step
///   end                   reason, steps, checkpoint, durable_step, [error]
///   checkpoint_skipped    step, writing
///   restore_point         tier ("host"), step, dir, [error]
///   eval                  step, tau, tau_prompt_mean, prompts, cycles, new_tokens,
///                         tokens_per_s, seconds, device, histogram, [error]
///
/// Sent by `tandem run` itself (the worker, at its start), not by the
/// coordinator:
///   worker_restarted      exit ("signal 6", "status 75"), restart, budget,
///                         unix_s (wall clock of the worker's death)
///   resumed               step, from (folder), tier ("host", "disk"),
///                         durable_step, unix_s (wall clock at the start)
///
/// event_atom with a JSON string is a free-form line for tools and tests:
/// written to metrics.jsonl, not forwarded to the control endpoint (which
/// takes typed events only).
///
/// Room for more: a new kind is a new struct APPENDED to `run_event`'s
/// alternatives (the alternative's index is on the wire: never reorder) and
/// a row here and in actors/metrics.cpp.  Kinds foreseen: actor state
/// changes, node joins and losses, restore tiers, control-endpoint actions.

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>
#include <caf/variant.hpp>

#include "messages/atoms.hpp"
#include "messages/descriptors.hpp"
#include "messages/vitals.hpp"

namespace tandem {

using event_atom = caf::atom_constant<caf::atom("event")>;

/// "epoch": epoch `epoch` starts over `samples`, `already_committed` of
/// them committed by the run resumed from.
struct epoch_event {
  int64_t epoch = 0;
  int64_t samples = 0;
  int64_t already_committed = 0;
};

/// "checkpoint": the snapshot of the weights after `step` is in `dir`; it
/// committed `committed_now` samples, `committed` in the epoch so far.
struct checkpoint_event {
  int64_t step = 0;
  std::string dir;
  int64_t committed_now = 0;
  int64_t committed = 0;
  std::string node;  ///< the cluster member whose file system holds `dir` ("" = the leader's)
};

/// "checkpoint_discarded": written, but a drafter failure rolled training
/// back past it: neither a restore point nor a commit.
struct checkpoint_discarded_event {
  int64_t step = 0;
  std::string dir;
};

/// "group_formed": data-parallel group `generation` of `world` ranks is up;
/// drafter `root` (rank 0) broadcast its state of `step`.
struct group_formed_event {
  int64_t generation = 0;
  int32_t world = 0;
  int32_t root = 0;
  int64_t step = 0;
};

/// "group_step_abandoned": drafter `drafter` reported a step whose
/// collective failed after the failure was already handled.
struct group_step_abandoned_event {
  int32_t drafter = 0;
};

/// "drafter_failed": drafter `drafter` failed (`reason`); training went
/// back to `restore_step` (`steps_lost` steps), restored from "peers" or
/// "checkpoint" (`restore_from`), `samples_reissued` samples re-issued;
/// `checkpoint` is what its next incarnation loads.  The supervisor's plan:
/// the `restart`-th restart of `budget`, after `backoff_s`.
struct drafter_failed_event {
  int32_t drafter = 0;
  std::string reason;
  int64_t restore_step = 0;
  int64_t steps_lost = 0;
  std::string restore_from;
  int64_t samples_reissued = 0;
  std::string checkpoint;
  int64_t restart = 0;
  int64_t budget = 0;
  double backoff_s = 0;
};

/// "budget_exhausted": the supervisor refused to restart `drafter`
/// (`report`, its error); the run fails.
struct budget_exhausted_event {
  int32_t drafter = 0;
  std::string report;
};

/// "drafter_restarted": drafter `drafter`'s new incarnation is up at the
/// run's `step`, restored `from` a checkpoint folder (or "fresh weights").
struct drafter_restarted_event {
  int32_t drafter = 0;
  int64_t step = 0;
  std::string from;
};

/// "actor_failed": target or prefetch `index` (`role`) died (`reason`) at
/// `step`; the supervisor's plan: the `restart`-th restart of `budget`,
/// after `backoff_s` (its batches are re-issued once it is back).
struct actor_failed_event {
  std::string role;
  int32_t index = 0;
  std::string reason;
  int64_t step = 0;
  int64_t restart = 0;
  int64_t budget = 0;
  double backoff_s = 0;
};

/// "actor_restarted": the new incarnation of target or prefetch `index` is
/// up at `step`.
struct actor_restarted_event {
  std::string role;
  int32_t index = 0;
  int64_t step = 0;
};

/// "reissued": the batches in flight when a target or prefetch failed were
/// dropped and every prefetch rewound to `step` (nothing trained is rolled
/// back): `samples` samples go out again, in the batches an uninterrupted
/// run packs.
struct reissued_event {
  int64_t step = 0;
  int64_t samples = 0;
};

/// "escalated": a worker that is not restarted ended (`reason`) at `step`;
/// the run stops as for a signal.
struct escalated_event {
  std::string reason;
  int64_t step = 0;
};

/// "end": the run ended (`reason`: max_steps, epochs, signal, escalated,
/// error) after `steps` steps; `checkpoint` is the newest ("" if none) and
/// `durable_step` the step it holds (−1: none).  `error` is empty only when
/// the run kept everything it trained: a run that ends with an error, or
/// whose newest durable checkpoint holds fewer steps than it trained (a
/// drafter failed during the final checkpoint), says so here and exits
/// non-zero.
struct end_event {
  std::string reason;
  int64_t steps = 0;
  std::string checkpoint;
  int64_t durable_step = -1;
  std::string error;
};

/// "resumed": this worker resumed at `step` from the checkpoint or restore
/// point `from` (`tier` "disk" or "host"); `durable_step` is the newest
/// checkpoint on disk then (−1: none); `unix_s` the wall clock at the start.
struct resumed_event {
  int64_t step = 0;
  std::string from;
  std::string tier;
  int64_t durable_step = -1;
  double unix_s = 0;
};

/// "worker_restarted": `tandem run` started this worker process after the
/// last one ended (`exit`: "signal 6", "status 75"); restart `restart` of
/// `budget` (supervision.worker_restarts); `unix_s`: the wall clock of the death.
struct worker_restarted_event {
  std::string exit;
  int64_t restart = 0;
  int64_t budget = 0;
  double unix_s = 0;
};

/// "checkpoint_skipped": a checkpoint due at `step` was not taken because
/// the write of step `writing` was still in progress (writes slower than
/// checkpoint.every_steps): checkpoints coalesce, and the state after the
/// first step that ends after that write is snapshotted next.
struct checkpoint_skipped_event {
  int64_t step = 0;
  int64_t writing = 0;
};

/// "restore_point": a restore point in shared memory (`tier` "host",
/// checkpoint.host_every) holding `step` is written in `dir`; it commits
/// nothing (only checkpoints on disk do) and is what a new worker process
/// resumes from when it is newer than the newest checkpoint.  `error`: the
/// write failed (the tier is off for the rest of the process).
struct restore_point_event {
  std::string tier;
  int64_t step = 0;
  std::string dir;
  std::string error;
};

/// "eval": real τ of the drafter's weights after `step` ([eval]; the eval
/// actor, messages/eval.hpp): speculative decoding of `prompts` held-out
/// prompts with the dflash package's definitions — `tau` the mean of the
/// tokens each cycle produced, `tau_prompt_mean` the mean over prompts of
/// their own means, `histogram[k]` the cycles that produced k — at
/// `tokens_per_s` (decoding after each prompt's first token) on `device`,
/// `seconds` in all.  `error`: the evaluation failed (training goes on).
struct eval_event {
  int64_t step = 0;
  double tau = 0;
  double tau_prompt_mean = 0;
  int64_t prompts = 0;
  int64_t cycles = 0;
  int64_t new_tokens = 0;
  double tokens_per_s = 0;
  double seconds = 0;
  std::string device;
  std::vector<int64_t> histogram;
  std::string error;
};

/// "control": an action taken through the control endpoint
/// (messages/control.hpp): `action` pause, resume, stop or checkpoint at
/// `step`, asked by `source` (the client's address and what it said it
/// is, e.g. "127.0.0.1:51234 tandem-shell"); `result` what came of it.
/// After an lr_scale action, `lr_from`/`lr_scale` are the whole schedule of
/// the learning-rate multiplier (from step, multiplier), which the metrics
/// actor also keeps in metrics_options::lr_schedule for a resumed worker.
struct control_event {
  std::string action;
  std::string source;
  int64_t step = 0;
  std::string result;
  std::vector<int64_t> lr_from;
  std::vector<double> lr_scale;
};

/// One of the run's events.  Append only (see above).
using run_event = caf::variant<epoch_event, checkpoint_event, checkpoint_discarded_event,
                               group_formed_event, group_step_abandoned_event,
                               drafter_failed_event, budget_exhausted_event,
                               drafter_restarted_event, escalated_event, end_event,
                               checkpoint_skipped_event, restore_point_event, eval_event,
                               control_event, resumed_event, worker_restarted_event,
                               actor_failed_event, actor_restarted_event, reissued_event>;

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, epoch_event& x) {
  return f(caf::meta::type_name("tandem.epoch_event"), x.epoch, x.samples, x.already_committed);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, checkpoint_event& x) {
  return f(caf::meta::type_name("tandem.checkpoint_event"), x.step, x.dir, x.committed_now,
           x.committed, x.node);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, checkpoint_discarded_event& x) {
  return f(caf::meta::type_name("tandem.checkpoint_discarded_event"), x.step, x.dir);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, group_formed_event& x) {
  return f(caf::meta::type_name("tandem.group_formed_event"), x.generation, x.world, x.root, x.step);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, group_step_abandoned_event& x) {
  return f(caf::meta::type_name("tandem.group_step_abandoned_event"), x.drafter);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, drafter_failed_event& x) {
  return f(caf::meta::type_name("tandem.drafter_failed_event"), x.drafter, x.reason, x.restore_step,
           x.steps_lost, x.restore_from, x.samples_reissued, x.checkpoint, x.restart, x.budget,
           x.backoff_s);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, budget_exhausted_event& x) {
  return f(caf::meta::type_name("tandem.budget_exhausted_event"), x.drafter, x.report);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, drafter_restarted_event& x) {
  return f(caf::meta::type_name("tandem.drafter_restarted_event"), x.drafter, x.step, x.from);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, actor_failed_event& x) {
  return f(caf::meta::type_name("tandem.actor_failed_event"), x.role, x.index, x.reason, x.step, x.restart,
           x.budget, x.backoff_s);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, actor_restarted_event& x) {
  return f(caf::meta::type_name("tandem.actor_restarted_event"), x.role, x.index, x.step);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, reissued_event& x) {
  return f(caf::meta::type_name("tandem.reissued_event"), x.step, x.samples);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, escalated_event& x) {
  return f(caf::meta::type_name("tandem.escalated_event"), x.reason, x.step);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, checkpoint_skipped_event& x) {
  return f(caf::meta::type_name("tandem.checkpoint_skipped_event"), x.step, x.writing);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, restore_point_event& x) {
  return f(caf::meta::type_name("tandem.restore_point_event"), x.tier, x.step, x.dir, x.error);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, control_event& x) {
  return f(caf::meta::type_name("tandem.control_event"), x.action, x.source, x.step, x.result, x.lr_from,
           x.lr_scale);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, eval_event& x) {
  return f(caf::meta::type_name("tandem.eval_event"), x.step, x.tau, x.tau_prompt_mean, x.prompts, x.cycles,
           x.new_tokens, x.tokens_per_s, x.seconds, x.device, x.histogram, x.error);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, resumed_event& x) {
  return f(caf::meta::type_name("tandem.resumed_event"), x.step, x.from, x.tier, x.durable_step, x.unix_s);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_restarted_event& x) {
  return f(caf::meta::type_name("tandem.worker_restarted_event"), x.exit, x.restart, x.budget, x.unix_s);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, end_event& x) {
  return f(caf::meta::type_name("tandem.end_event"), x.reason, x.steps, x.checkpoint, x.durable_step,
           x.error);
}

/// The coordinator (a control action): a JSON line every N steps from now on.
using log_every_atom = caf::atom_constant<caf::atom("logevery")>;

using metrics_actor = caf::typed_actor<
  caf::reacts_to<step_report>,
  caf::reacts_to<run_event>,
  caf::reacts_to<event_atom, std::string>,
  caf::reacts_to<log_every_atom, int64_t>,
  caf::reacts_to<shutdown_atom>,
  vitals_protocol>;

} // namespace tandem
