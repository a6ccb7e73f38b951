#pragma once
/// The coordinator's state and the functions of its behaviour (private to
/// actors/coordinator*.cpp; peers see only messages/coordinator.hpp).
///
///   coordinator.cpp           the behaviour (one handler a message) and spawn
///   coordinator_routing.cpp   batches prefetch → target → drafter, steps,
///                             checkpoints, epochs, the run's end
///   coordinator_group.cpp     data-parallel drafters: forming the group, the
///                             group step's reports (actors/group_step.hpp decides)
///   coordinator_failures.cpp  drafter failures: rollback, restarts, the
///                             watchdog and heartbeats, new incarnations
///   coordinator_eval.cpp      real τ ([eval]): snapshots to the eval actor,
///                             the run's last evaluation before its answer
///   coordinator_workers.cpp   a target or prefetch lost and restarted: held
///                             batches and releases, the rewind that re-issues
///
/// The run's phase (run_phase):
///
///   before_run ── stop ──▶ stop_before_run ── run ──▶ answered ("signal", at once)
///       │ run
///       ▼
///    running ── finish ──▶ stopping ── deliver, fail ──▶ stopped
///       │ fail
///       ▼
///    answered
///
/// `answered`: the run request got its answer (an error) while running; the
/// coordinator still routes what arrives, as it always did, but answers
/// nothing again.  Once `stopping` (and `stopped`), no work is dispatched
/// and no credit granted.
///
/// One actor owns all of it (the coordinator, cooperative: handlers only move
/// descriptors and counters); continuations capture `self` and values, and
/// compare a lineage or generation counter before they act.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/group_step.hpp"
#include "actors/ledger.hpp"
#include "actors/spawn.hpp"
#include "actors/time.hpp"
#include "messages/errors.hpp"

namespace tandem::coord {

/// A batch in flight, from its prefetch until its drafter trained it.
struct flight {
  int32_t source = 0;         ///< prefetch (and target) index
  uint64_t batch_handle = 0;
  uint64_t features_handle = 0;
  int64_t real_tokens = 0;
  /// The incarnation of its target it was sent to (coordinator_state::
  /// target_incarnation); −1: held, never sent (its target was down).  A
  /// batch sent to an incarnation that died never comes back.
  int64_t target_incarnation = 0;
};

/// What the coordinator knows of drafter j (peers.drafters[j] is its handle).
/// Times are the actor clock's (self->clock().now()), the clock that also
/// fires the watchdog tick and the heartbeats: steady_clock in production,
/// the deterministic clock in protocol tests.
struct drafter_slot {
  caf::actor_addr addr;                       ///< the live incarnation (none while down)
  bool down = false;                          ///< failed, waiting for its restart
  bool given_up = false;                      ///< its restart was given up (the supervisor escalated it)
  caf::actor_clock::time_point dispatched{};  ///< when its step started
  int64_t restore_point = 0;                  ///< the step its next incarnation is restored to
                                              ///< (the checkpoint named in its restart)
  /// The step its restore point in device memory holds (its last report's
  /// restore_point; −1: none, or not yet known for a new incarnation).  A
  /// single drafter that fails is restored from it when it is newer than
  /// the newest checkpoint.
  int64_t memory_step = -1;
  std::string restored_from;                  ///< what its restart restores ("memory (step k)", a checkpoint)
  /// The cluster member it runs on now ("" = the leader's process): the
  /// plan's node, or the spare its restart moved it to (asked of the
  /// cluster's door when it comes up again).  Its checkpoints are there.
  std::string node;
  caf::actor_clock::time_point last_heartbeat{};  ///< last asked (idle drafters)
  bool heartbeat_pending = false;             ///< asked, no answer yet
  /// Asked for a snapshot, no answer yet: its thread is copying its state,
  /// busy and not dead.  No heartbeat is asked of it and no work sent to it
  /// meanwhile (snapshot_beside_work excepted); the snapshot request's own
  /// deadline (snapshot_timeout) watches it instead (messages/drafter.hpp,
  /// "Liveness").
  bool snapshot_pending = false;
  /// The snapshot pending is a restore point for the shared-memory tier:
  /// its copy runs beside training (the drafter copies it from the restore
  /// point in device memory when that holds the step, else its next step
  /// waits for the copy on the device), so work may be sent meanwhile
  /// (dispatch: work_beside_snapshot).
  bool snapshot_beside_work = false;
  /// Holds the state the ledger's step says (restored to it or never
  /// diverged): it may lead the next data-parallel group, or be snapshotted.
  bool clean = true;
  step_report report;                         ///< its report of the group step in flight
};

enum class run_phase : uint8_t {
  before_run,       ///< no run request yet
  stop_before_run,  ///< a stop came first: the run request is answered at once
  running,
  stopping,         ///< finishing the steps in flight, then a last checkpoint
  answered,         ///< the run request is answered (not stopping: an error, or a stop before the run)
  stopped,          ///< the run request is answered after stopping
};

/// The checkpoint in progress (one at a time).
enum class checkpoint_phase : uint8_t {
  none,
  snapshot,  ///< a drafter is copying its state off the device
  writing,   ///< the checkpointer is writing it
};

struct coordinator_state {
  static inline const char* name = "tandem.coordinator";
  coordinator_options opts;
  coordinator_peers peers;
  std::optional<sample_ledger> ledger;
  caf::typed_response_promise<run_summary> promise;
  run_phase phase = run_phase::before_run;
  run_summary summary;
  std::string escalated;                ///< a worker that is not restarted ended: why ("" = none)
  errc escalated_code = errc::device_failure;  ///< what the run ends as then (bad_input: its input)
  bool have_first_loss = false;

  // Routing.
  std::map<int64_t, flight> in_flight;  ///< by batch id
  std::deque<work_item> queue;          ///< features ready, waiting for a drafter
  std::deque<int32_t> idle;             ///< drafters without work
  std::set<int32_t> busy;
  std::vector<bool> exhausted;          ///< per prefetch, this epoch
  int64_t epoch = 0;
  int64_t data_generation = 0;          ///< epoch starts and rollbacks so far (prefetch.hpp): older batches are stale
  int64_t step = 0;
  bool paused = false;                  ///< control endpoint: no work is dispatched (on_control)
  /// The learning-rate multiplier from each step on (control endpoint;
  /// saved with every checkpoint's ledger, restored on resume); 1 before the
  /// first entry.
  std::map<int64_t, double> lr_changes;
  double lr_scale_at(int64_t step) const {
    auto it = lr_changes.upper_bound(step);
    return it == lr_changes.begin() ? 1.0 : std::prev(it)->second;
  }
  /// The first step not yet sent to a drafter (a step in progress is step + 1).
  int64_t next_undispatched_step() const { return step + 1 + (busy.empty() ? 0 : 1); }

  // Checkpoints.
  int64_t durable_step = -1;
  /// durable_step is held by a checkpoint on disk (false after resuming
  /// from a restore point in shared memory, until the first checkpoint):
  /// the run's end and an epoch's end write one unless it is.
  bool durable_on_disk = true;
  int64_t discarded_to = 0;             ///< > 0: a rollback discarded trained steps up to this one
                                        ///< and no checkpoint has been written since
  checkpoint_phase checkpoint = checkpoint_phase::none;
  int64_t checkpoint_step = -1;         ///< the step of the checkpoint in progress
  int32_t checkpoint_src = -1;          ///< the drafter its snapshot was asked of
  int64_t checkpoint_seq = 0;           ///< checkpoints begun (or given up) so far: a late answer compares
  bool checkpoint_due = false;          ///< one came due meanwhile: taken after the next step
  std::vector<std::function<void()>> after_checkpoint;
  /// A checkpoint asked for while its drafter was copying a restore point
  /// in shared memory: taken as soon as that copy is answered.
  bool checkpoint_after_host = false;

  // Restore points in shared memory (opts.host_every; host_restore_point).
  bool host_busy = false;               ///< one is being copied or written
  int64_t host_seq = 0;                 ///< restore points begun (or given up) so far: a late answer compares
  bool host_due = false;                ///< one came due meanwhile: taken after the next step
  bool host_off = false;                ///< a write failed: the tier is off for this process

  // Real τ ([eval]; actors/coordinator_eval.cpp).
  bool eval_busy = false;               ///< a snapshot is being evaluated
  int32_t eval_src = -1;                ///< the drafter whose snapshot the evaluation awaits (−1: none)
  int64_t eval_seq = 0;                 ///< evaluations begun (or given up) so far: a late answer compares
  bool eval_due = false;                ///< one came due while the drafter was busy: after the next step
  bool eval_off = false;                ///< the eval actor is gone: no more evaluations
  bool final_eval = false;              ///< the run's last evaluation is running; then the answer
  int64_t eval_step = -1;               ///< the step of the last evaluation answered (or failed)
  std::vector<std::function<void()>> after_eval;  ///< run once the evaluation in progress is answered

  // Failures.
  std::vector<drafter_slot> drafters;            ///< by drafter index
  std::map<int64_t, int32_t> sample_source;      ///< issued, not yet committed: which prefetch
  std::map<int64_t, flight> abandoned;           ///< rolled back while at a target: released when it
                                                 ///< comes back, or when that target's new incarnation is up
  int64_t lineage = 0;                           ///< rollbacks to a checkpoint so far (a snapshot older than one is stale)

  // Targets and prefetches lost and restarted (coordinator_workers.cpp), by index.
  std::vector<bool> target_down, prefetch_down;
  std::vector<int64_t> target_incarnation;       ///< new incarnations of target i so far
  std::vector<bool> fresh_prefetch;              ///< a new incarnation: no epoch nor credit yet
  std::vector<std::vector<uint64_t>> held_features, held_batches;  ///< releases waiting for i's new incarnation
  /// Every lost one is back: the batches in flight are re-issued once no
  /// drafter is mid-step (rewind); nothing is dispatched until then.
  bool rewind_due = false;

  /// Data-parallel drafters (more than one): one NCCL group, lockstep steps.
  std::optional<group_step> group;

  bool running() const { return phase == run_phase::running || phase == run_phase::stopping; }
  bool stopping() const { return phase == run_phase::stopping || phase == run_phase::stopped; }
  bool checkpointing() const { return checkpoint != checkpoint_phase::none; }
  bool grouped() const { return peers.drafters.size() > 1; }
  bool workers_down() const {
    for (bool d : target_down)
      if (d)
        return true;
    for (bool d : prefetch_down)
      if (d)
        return true;
    return false;
  }
  /// No work goes to drafters: paused, or a target or prefetch being replaced.
  bool holding() const { return paused || rewind_due || workers_down(); }
  drafter_slot& slot(int32_t d) { return drafters[static_cast<size_t>(d)]; }
  bool snapshot_pending() const {
    for (const auto& d : drafters)
      if (d.snapshot_pending)
        return true;
    return false;
  }
};

using self_ptr = coordinator_actor::stateful_pointer<coordinator_state>;

/// The deadline of a snapshot request: a drafter copying its state is busy,
/// not asked for heartbeats, and judged by this (a 12.6 GB snapshot at 8B
/// takes ~15 s on an H200 host; far slower disks or hosts stay well inside).
inline constexpr auto snapshot_timeout = std::chrono::minutes(10);

/// The behaviour (coordinator.cpp).
coordinator_actor::behavior_type coordinator_behavior(self_ptr self, coordinator_options opts);

// -- coordinator_routing.cpp ---------------------------------------------------
void event(self_ptr self, run_event e);
void release(self_ptr self, int32_t source, uint64_t batch_handle, uint64_t features_handle);
/// Drops every batch in flight and the queue (a rollback or the run's end):
/// handles whose features are back are released, the rest when they come
/// back.  The number dropped per prefetch (the credits they held).
std::vector<int32_t> drop_in_flight(self_ptr self);
bool epoch_tail(self_ptr self);
void dispatch(self_ptr self);
void fail(self_ptr self, const caf::error& err);
void checkpoint(self_ptr self, std::function<void()> then);
void host_restore_point(self_ptr self);
void deliver(self_ptr self);
void try_complete(self_ptr self);
void finish(self_ptr self, const std::string& reason);
void start_epoch(self_ptr self, const std::vector<int64_t>& done);
void maybe_end_epoch(self_ptr self);
void retire(self_ptr self, int64_t batch_id, int64_t step);
void after_step(self_ptr self);
void on_step_report(self_ptr self, const step_report& r);
void on_work_item(self_ptr self, work_item& w);
void on_batch(self_ptr self, batch_desc& batch);

/// Which drafter to snapshot: one holding the ledger's state.
int32_t snapshot_source(self_ptr self);
/// Drafter `src` (incarnation `addr`) answered a snapshot request: it is
/// free again; a checkpoint deferred behind the copy is taken; dispatch.
void snapshot_answered(self_ptr self, int32_t src, const caf::actor_addr& addr);
/// A snapshot answered too late to be used (its drafter failed meanwhile):
/// whoever receives a snapshot owns it, so its page-locked host buffers are
/// released here, when its drafter ran in this process (a member's handle
/// names that process's registry: left to it).
void drop_snapshot(self_ptr self, const snapshot_desc& snap);

// -- coordinator_eval.cpp ------------------------------------------------------
/// Sends a snapshot of the drafter's weights at this step to the eval actor
/// (none, or one already running: nothing; the drafter busy copying: after
/// the next step).  Its answer is the "eval" event and the summary's τ.
void evaluate(self_ptr self);
/// The run's end: its last evaluation when [eval] at_end asks for one and
/// the last evaluated step is older (an evaluation in progress is waited
/// for first), then deliver().
void deliver_after_eval(self_ptr self);
/// The evaluation awaiting drafter `d`'s snapshot is given up (`d` failed:
/// its snapshot will never come): its event carries `reason`, and what
/// waited for it runs (which may answer the run, its final evaluation).
void give_up_eval(self_ptr self, int32_t d, const std::string& reason);

// -- coordinator_group.cpp -----------------------------------------------------
void dispatch_group(self_ptr self);
bool group_at_rest(self_ptr self);
void maybe_form_group(self_ptr self);
void abort_group(self_ptr self, const std::string& why);
void on_group_report(self_ptr self, const step_report& r);
void resolve_group_failure(self_ptr self);
void count_group_step(self_ptr self, int64_t step, const std::vector<step_report>& reports);

// -- coordinator.cpp -----------------------------------------------------------
/// A worker that is not restarted ended (`why`): stop as for a signal (the
/// steps in progress finish, a checkpoint is written), then answer the run
/// request with the error, as `code` (device_failure, or bad_input when
/// the worker's input cannot load).
void on_escalate(self_ptr self, const std::string& why, errc code);
/// Drafter `d`'s restart is given up: on_escalate, and the end stops waiting for it.
void on_drafter_given_up(self_ptr self, int32_t d, const std::string& why, errc code);

// -- coordinator_workers.cpp ---------------------------------------------------
/// Target or prefetch `index` (`role`) died: held until its new incarnation
/// is up; the supervisor is asked to restart it.
void on_worker_down(self_ptr self, const std::string& role, int32_t index, const std::string& why);
void on_target_up(self_ptr self, int32_t index, target_actor fresh);
void on_prefetch_up(self_ptr self, int32_t index, prefetch_actor fresh);
/// Re-issues what was in flight when a worker was lost, once every lost one
/// is back and no drafter is mid-step (a no-op otherwise).
void maybe_rewind(self_ptr self);
/// After the ledger's rollback returned `back` to pending: drops every batch
/// in flight and rewinds every prefetch to what the ledger holds, as a new
/// data generation (a drafter's rollback, or a replaced target or prefetch).
void rewind_prefetches(self_ptr self, const std::vector<int64_t>& back);
/// Grants prefetch `p` `n` more credits, unless it is down or a new
/// incarnation (its whole window comes with the rewind).
void grant_credit(self_ptr self, size_t p, int32_t n);
/// The credit to grant prefetch `p` after a drop of `dropped` of its batches:
/// those, or a whole window for a new incarnation (which had none).
int32_t credit_after_drop(self_ptr self, size_t p, int32_t dropped);

// -- coordinator_failures.cpp --------------------------------------------------
void on_drafter_failure(self_ptr self, int32_t d, const std::string& reason,
                        bool peers_hold_state = false);
void roll_back_and_restart(self_ptr self, int32_t d, const std::string& reason, bool peers_hold_state);
void ask_heartbeat(self_ptr self, int32_t d, caf::actor_clock::time_point now);
void on_drafter_up(self_ptr self, int32_t d, drafter_actor fresh);
void on_tick(self_ptr self);

} // namespace tandem::coord
