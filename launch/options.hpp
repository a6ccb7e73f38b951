#pragma once
/// The settings of the bookkeeping actors (coordinator, supervisor, metrics,
/// checkpointer) as plain data: what launch_plan (launch/plan.hpp) fills from
/// a run config.  No CAF, no LibTorch: the actor handles and callbacks that
/// wire a running system together are added by actors/spawn.hpp, whose
/// option structs extend these.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace tandem {

/// The coordinator's settings (messages/coordinator.hpp; config [runtime],
/// [checkpoint], [data], [train]).
struct coordinator_settings {
  int64_t num_samples = 0;           ///< in the dataset
  /// What a checkpoint records of the data so a resume can check it: the
  /// data set's manifest content_hash ("" = none) and the learning-rate
  /// schedule's length in steps.
  std::string data_hash;
  int64_t schedule_steps = 0;
  int32_t credits = 4;               ///< batches in flight per prefetch
  int64_t max_steps = 0;             ///< 0: run `epochs`
  int64_t epochs = 1;
  /// train.log_every: the metrics actor's steps between step lines.  The
  /// control endpoint's log_every action changes it (the coordinator tells
  /// the metrics actor and keeps the value here, for its status).
  int64_t log_every = 10;
  int64_t checkpoint_every = 100;    ///< steps; 0 = only at epoch ends and the end
  /// Steps between restore points in shared memory (checkpoint.host_every;
  /// 0 = none): snapshots written by the host checkpointer into a folder
  /// that outlives the worker process, never committing the ledger (only a
  /// durable checkpoint does); a new worker resumes from the newest.
  int64_t host_every = 0;
  /// A stop request (SIGINT/SIGTERM, checkpoint.on_signal) finishes the step
  /// and writes a checkpoint first; false: it finishes the step and ends
  /// without one (the ledger commits only what an earlier checkpoint holds).
  bool checkpoint_on_stop = true;
  std::string resume_ledger;         ///< a saved ledger (resume), or ""
  int64_t resume_step = 0;           ///< the drafters' step when resuming
  std::string resume_checkpoint;     ///< the checkpoint resumed from ("" = fresh)
  /// It is on disk (false: a restore point in shared memory: its step is not
  /// durable until a checkpoint on disk holds it, which the run's end writes).
  bool resume_on_disk = true;
  /// The learning-rate multiplier's changes (from step, scale) the resumed
  /// checkpoint holds (set through the control endpoint).
  std::vector<std::pair<int64_t, double>> resume_lr_scale;
  /// Drafter j's cluster member ("" = the leader's process): where its
  /// checkpoints are written (the checkpoint event names it).
  std::vector<std::string> drafter_nodes;
  // Failure detection (config [runtime]); restarts are the supervisor's.
  double step_timeout_s = 120;       ///< a step longer than this is a hang
  double heartbeat_s = 0;            ///< an idle drafter is asked this often and must answer
                                     ///< within it (runtime.heartbeat_s); 0 = not asked
  /// Data-parallel drafters (more than one): the deadline of forming their
  /// NCCL group and of every collective in a step (runtime.group_timeout_s).
  double group_timeout_s = 30;
  /// Real τ ([eval], with an eval actor): every `eval_every` steps (0: not
  /// during training) and, with `eval_at_end`, once more at the end of a run
  /// that finished its steps or epochs, unless the last evaluation holds its
  /// final step.  An evaluation gets `eval_timeout_s` to answer.
  int64_t eval_every = 0;
  bool eval_at_end = true;
  double eval_timeout_s = 3600;
};

/// The supervisor's restart policy (config [supervision]).
struct supervisor_settings {
  int64_t restart_budget = 3;              ///< restarts per drafter within window_s
  std::vector<double> backoff_s{1, 2, 4};  ///< before the n-th restart (the last repeats)
  double window_s = 600;
};

/// The metrics actor (config [metrics], train.log_every, run.name).
struct metrics_options {
  std::string run_name;         ///< written into every JSON line ("run") and the progress line
  std::filesystem::path jsonl;  ///< "" = no file
  std::filesystem::path tensorboard;  ///< event files' folder ("" = none; actors/tensorboard/)
  /// Where the learning-rate multiplier's schedule is kept after each change
  /// through the control endpoint ("" = not kept; run_config::lr_schedule_file).
  std::filesystem::path lr_schedule;
  bool progress = true;         ///< a progress line on stderr
  double every_s = 1.0;
  int64_t total_steps = 0;      ///< for the ETA (0 = unknown)
  int64_t log_every = 10;       ///< JSON line every N steps
};

/// The control endpoint (config [control]; actors/control.cpp and
/// actors/control_http.hpp).
struct control_options {
  std::string host = "127.0.0.1";  ///< control.listen's host (loopback)
  uint16_t port = 0;               ///< 0: any free port (control.json says which)
  std::string tls_cert, tls_key;   ///< PEM files (both set: HTTPS)
  std::string run_name;
  std::string config_toml;         ///< the effective config, for GET /v1/config
  /// Every actor of the run, for GET /v1/tree ("cpu" or "cuda:N").
  struct actor_entry {
    std::string role;
    int32_t index = 0;
    std::string device;
    std::string node;  ///< the cluster member holding it ("" = not a cluster run)
  };
  std::vector<actor_entry> actors;
  size_t steps_kept = 1000;        ///< the last step reports kept (GET /v1/steps)
  size_t events_kept = 2000;       ///< the last events kept (GET /v1/events)
  int64_t answer_timeout_ms = 5000;  ///< a request not answered by then: 503
};

/// The checkpointer (config [checkpoint]).
struct checkpointer_options {
  std::filesystem::path dir;  ///< snapshots go to dir/step-<k>/
  int keep = 3;               ///< newest kept
};

/// One rule in one place: a data-parallel group step takes one batch per
/// drafter, so the prefetch actors' credits together must cover the
/// drafters.  True when `credits` per prefetch actor over `prefetch` actors
/// feed `drafters` drafters.
inline bool credits_cover_drafters(int64_t credits, int64_t prefetch, int64_t drafters) {
  return drafters <= 1 || credits * prefetch >= drafters;
}

} // namespace tandem
