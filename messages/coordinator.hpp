#pragma once
/// Coordinator protocol.  Cooperative (cheap handlers, no device work): the
/// global step, the epoch, the sample ledger, credits and routing.
///
///   launcher      coordinator         prefetch[i]   target[i]   drafter[j]   checkpointer
///     | -- run --> |                      |             |            |             |
///     |            | -- epoch, credit --> |             |            |             |
///     |            | <------ batch_desc - |             |            |             |
///     |            | -- batch_desc -------------------> |            |             |
///     |            | <------------------------ work_item |            |             |
///     |            | -- work_item --------------------------------> |             |
///     |            | <------------------------------------ step_report             |
///     |            | -- release --------> |  release -> |            |             |
///     |            | -- credit 1 -------> |             |            |             |
///     |            |  every N steps, at epoch ends and at the end:   |             |
///     |            | -- snapshot -----------------------------------> |             |
///     |            | <---------------------------------- snapshot_desc             |
///     |            | -- snapshot_desc, ledger json ----------------------------->  |
///     |            | <------------------------------------------------ dir written |
///     | <- summary |  (after max_steps / the last epoch / a stop)
///
/// run_atom:    the launcher's request, carrying the peers it spawned;
///              answered with a run_summary when the run ends (or an error
///              naming what failed).  A stop that arrives before it makes
///              it answer at once (stop_reason "signal").
/// stop_atom:   SIGINT/SIGTERM: stop issuing work and granting credit, let
///              the drafters finish their steps (and restarts in progress
///              come up), write a checkpoint if anything is new, answer the
///              run request.
/// status_atom: a JSON text of the ledger, step and queues (shell, tests).
/// tick_atom:   the coordinator's own timer, first after 1 s, then every
///              250 ms: the step watchdog and the heartbeats
///              (messages/drafter.hpp, "Liveness").
/// Events (checkpoints, epochs, failures, restarts, evaluations, the end) go
/// to the metrics actor as typed run_events (messages/metrics.hpp).
///
/// Evaluations ([eval], peers.eval): every eval_every steps the drafter is
/// snapshotted (before a checkpoint of the same step, which then follows at
/// that step) and the snapshot sent to the eval actor (messages/eval.hpp);
/// its answer is the "eval" event and the summary's τ.  A run that finishes
/// its steps or epochs is answered after one more evaluation of its final
/// weights (eval_at_end), unless the last one holds them.
///
/// Supervision (with the supervisor, messages/supervisor.hpp): a drafter
/// that dies (exception, CUDA error; the supervisor's drafter_down), reports
/// a non-finite loss, overruns step_timeout_s or misses a heartbeat is
/// marked down and its incarnation forgotten; training rolls back to the
/// restore point — training after it goes back to pending in the ledger and
/// its samples are re-issued (the batches in flight are released and their
/// credit returned); targets keep running — and the supervisor is asked to
/// restart it from the newest checkpoint; its new incarnation arrives as
/// drafter_up.  The restore point is the newest checkpoint, or with
/// data-parallel drafters the survivors' state when they hold the ledger's
/// step (a failure between group steps, a step every rank skipped, or one
/// whose survivors report the step before or after it:
/// messages/drafter.hpp).  A checkpoint written from a snapshot taken
/// before a rollback to an older checkpoint is discarded (neither restore
/// point nor commit).  When the supervisor refuses (the restart budget is
/// spent) the run request is answered with that error.
///
/// A target or prefetch that dies (exception, CUDA error, its node lost) is
/// stateless: the supervisor's worker_down marks it down — no work is
/// dispatched meanwhile, batches of its source are held, releases for it
/// wait — and the coordinator asks the supervisor to restart it (the same
/// budget and window as a drafter's); its new incarnation arrives as
/// worker_up.  Once none is down and no drafter is mid-step, the batches in
/// flight are re-issued by rewinding every prefetch to the ledger's step
/// (as a rollback does, without rolling back any training): the steps that
/// follow are the batches an uninterrupted run trains.  A bad input (the
/// target's weights do not load) is not retried.
///
/// When the supervisor escalates the death of a worker it does not restart
/// (a checkpointer or the metrics actor, a bad input, a target past its
/// budget), the run stops as for a signal — steps in progress finish, a
/// checkpoint is written — and then the run request is answered with an
/// error naming the worker and the checkpoint.
/// The other messages come from the actors named above, asynchronously,
/// and may arrive at any time; a report from a replaced incarnation is
/// ignored.

#include <cstdint>
#include <string>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "messages/atoms.hpp"
#include "messages/checkpointer.hpp"
#include "messages/descriptors.hpp"
#include "messages/drafter.hpp"
#include "messages/eval.hpp"
#include "messages/metrics.hpp"
#include "messages/prefetch.hpp"
#include "messages/target.hpp"
#include "messages/vitals.hpp"

namespace tandem {

using run_atom = caf::atom_constant<caf::atom("run")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using status_atom = caf::atom_constant<caf::atom("status")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using drafter_down_atom = caf::atom_constant<caf::atom("down")>;
using drafter_up_atom = caf::atom_constant<caf::atom("up")>;
using escalate_atom = caf::atom_constant<caf::atom("escalate")>;
/// Tags an escalation whose cause is the input (weights, data) rather than
/// a device: the run ends as tandem.bad_input (tandem run exits 1, a
/// failure while running).
using bad_input_atom = caf::atom_constant<caf::atom("badinput")>;
using device_lost_atom = caf::atom_constant<caf::atom("devlost")>;
using worker_down_atom = caf::atom_constant<caf::atom("wdown")>;
using worker_up_atom = caf::atom_constant<caf::atom("wup")>;

/// The stateless workers the supervisor restarts besides drafters
/// (worker_down, restart, worker_up): "target" or "prefetch".
inline constexpr const char* target_role = "target";
inline constexpr const char* prefetch_role = "prefetch";

/// How a run ended.
struct run_summary {
  int64_t steps = 0;             ///< optimizer steps taken in total
  int64_t epochs_completed = 0;
  int64_t samples_committed = 0; ///< in the current epoch
  double last_loss = 0;
  double first_loss = 0;         ///< loss of this process's first step
  std::string stop_reason;       ///< "max_steps", "epochs", "signal"
  std::string checkpoint;        ///< the newest checkpoint written ("" if none)
  int64_t eval_step = -1;        ///< [eval]: the step of the last real τ measured (−1: none)
  double eval_tau = 0;           ///< its τ
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, run_summary& x) {
  return f(caf::meta::type_name("tandem.run_summary"), x.steps, x.epochs_completed,
           x.samples_committed, x.last_loss, x.first_loss, x.stop_reason, x.checkpoint, x.eval_step,
           x.eval_tau);
}

/// The actors a coordinator drives: prefetch[i] feeds targets[i].
struct coordinator_peers {
  std::vector<prefetch_actor> prefetch;
  std::vector<target_actor> targets;
  std::vector<drafter_actor> drafters;
  checkpointer_actor checkpointer;
  metrics_actor metrics;
  /// Writes the restore points in shared memory (coordinator_settings::
  /// host_every); none: the tier is off.
  checkpointer_actor host_checkpointer;
  /// Measures real τ of snapshots ([eval]; messages/eval.hpp); none: off.
  eval_actor eval;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, coordinator_peers& x) {
  return f(caf::meta::type_name("tandem.coordinator_peers"), x.prefetch, x.targets, x.drafters,
           x.checkpointer, x.metrics, x.host_checkpointer, x.eval);
}

/// An action through the control endpoint (messages/control.hpp):
/// `action` "pause" (no more work to the drafters; the steps in progress
/// end, heartbeats go on), "resume", "stop" (as a signal: finish the step,
/// checkpoint, end), "checkpoint" (at once when no step is in progress,
/// else after the next one), "fault" (arm fault `kind` on drafter `drafter`
/// for `at_step`, 0: its next step), "lr_scale" (the learning-rate
/// multiplier `value` from step `at_step` on, 0: the first step not yet sent
/// to a drafter; kept in checkpoints) or "log_every" (a metrics line every
/// `value` steps).  `source`: who asked, for the control event.
struct control_command {
  std::string action;
  std::string source;
  int32_t drafter = -1;
  std::string kind;
  int64_t at_step = 0;
  double value = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, control_command& x) {
  return f(caf::meta::type_name("tandem.control_command"), x.action, x.source, x.drafter, x.kind, x.at_step,
           x.value);
}

using coordinator_actor = caf::typed_actor<
  caf::replies_to<run_atom, coordinator_peers>::with<run_summary>,
  caf::reacts_to<stop_atom>,
  caf::replies_to<status_atom>::with<std::string>,
  /// the control actor: an action; the answer says what happened (or an
  /// error: not running, unknown action).
  caf::replies_to<control_command>::with<std::string>,
  caf::reacts_to<batch_desc>,
  caf::reacts_to<exhausted_atom, int32_t, int64_t, int64_t>,  ///< prefetch index, epoch, generation
  caf::reacts_to<work_item>,
  caf::reacts_to<step_report>,
  caf::reacts_to<tick_atom>,
  caf::reacts_to<drafter_down_atom, int32_t, std::string>,  ///< supervisor: drafter j died (why)
  caf::reacts_to<drafter_up_atom, int32_t, drafter_actor>,  ///< supervisor: j's new incarnation
  caf::reacts_to<escalate_atom, std::string>,               ///< supervisor: a worker it does not
                                                            ///< restart ended (why)
  /// supervisor: a target or prefetch whose input cannot load (its weights,
  /// a shard) ended: not restarted, the run ends as bad input (why)
  caf::reacts_to<escalate_atom, bad_input_atom, std::string>,
  /// supervisor: drafter j cannot be restarted (its node did not join
  /// again): escalated, and the run's end does not wait for it (j, why)
  caf::reacts_to<escalate_atom, int32_t, std::string>,
  /// supervisor: the same, its node having refused it for bad input (its
  /// checkpoint there does not load): the run ends as bad input (j, why)
  caf::reacts_to<escalate_atom, bad_input_atom, int32_t, std::string>,
  /// supervisor: target or prefetch `index` died (role, index, why)
  caf::reacts_to<worker_down_atom, std::string, int32_t, std::string>,
  caf::reacts_to<worker_up_atom, int32_t, target_actor>,    ///< supervisor: target i's new incarnation
  caf::reacts_to<worker_up_atom, int32_t, prefetch_actor>,  ///< supervisor: prefetch i's new incarnation
  caf::reacts_to<shutdown_atom>,
  /// supervisor: a worker ended with errc::device_lost (why): its device's
  /// context is poisoned, so nothing on it (a restart, a last snapshot) can
  /// run in this process.  The run fails at once with device_lost; `tandem
  /// run`'s worker process exits 75 and its parent starts a new one from
  /// the newest restore point that outlived this process.
  caf::reacts_to<device_lost_atom, std::string>,
  vitals_protocol,
  /// the control actor: the vitals of every actor of the run, its own first
  /// (messages/vitals.hpp), waiting at most the given milliseconds for each.
  caf::replies_to<vitals_all_atom, int64_t>::with<std::vector<actor_vitals>>>;

} // namespace tandem
