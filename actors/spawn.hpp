#pragma once
/// Spawning the training actors (DESIGN.md §3).  GPU-owning actors are
/// spawned detached (one private thread each; all their device work on it)
/// and build their engines inside the behaviour, never in a constructor.
/// Protocols: messages/{prefetch,target,drafter,checkpointer,metrics,coordinator,
/// supervisor}.hpp.
///
/// The spawn functions of the detached actors take their spawn options as a
/// template argument: `caf::detached` (the default) in production, and
/// `caf::no_spawn_options` under CAF's deterministic test scheduler, which
/// does not drive detached actors (tests/protocol/).  Each actor's file
/// (actors/prefetch.cpp, target.cpp, drafter.cpp, checkpointer.cpp)
/// instantiates both.

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/spawn_options.hpp>

#include "gpu/engine/drafter_engine.hpp"
#include "gpu/engine/prefetch_engine.hpp"
#include "gpu/engine/target_engine.hpp"
#include "messages/checkpointer.hpp"
#include "messages/coordinator.hpp"
#include "messages/drafter.hpp"
#include "messages/metrics.hpp"
#include "messages/prefetch.hpp"
#include "messages/supervisor.hpp"
#include "messages/target.hpp"

namespace tandem {

template <caf::spawn_options Os = caf::detached>
prefetch_actor spawn_prefetch(caf::actor_system& sys, int32_t index,
                              gpu::prefetch_engine_options opts, coordinator_actor coordinator);

template <caf::spawn_options Os = caf::detached>
target_actor spawn_target(caf::actor_system& sys, int32_t index, gpu::target_engine_options opts,
                          coordinator_actor coordinator);

/// Injected faults (config `[[faults.inject]]`, `--fault`): each fires once
/// per run, whichever incarnation of its drafter reaches its step first.
/// Test and demonstration machinery, shared by the drafter's incarnations.
struct fault_plan {
  struct entry {
    int32_t drafter = 0;
    std::string kind;       ///< "throw", "nan", "hang"
    int64_t at_step = 0;    ///< fires when the drafter is about to take this step
    std::atomic<bool> fired{false};
  };
  std::vector<std::unique_ptr<entry>> entries;
  double hang_s = 0;        ///< how long "hang" blocks (beyond the step timeout)
};

/// `restore_from`: a checkpoint folder to load before the first step ("" = fresh).
template <caf::spawn_options Os = caf::detached>
drafter_actor spawn_drafter(caf::actor_system& sys, int32_t index, gpu::drafter_engine_options opts,
                            std::string restore_from, coordinator_actor coordinator,
                            std::shared_ptr<fault_plan> faults = nullptr);

/// Writes snapshots under `dir` (step-<k>/), keeping the newest `keep`.
template <caf::spawn_options Os = caf::detached>
checkpointer_actor spawn_checkpointer(caf::actor_system& sys, std::filesystem::path dir, int keep);

struct metrics_options {
  std::filesystem::path jsonl;  ///< "" = no file
  bool progress = true;         ///< a progress line on stderr
  double every_s = 1.0;
  int64_t total_steps = 0;      ///< for the ETA (0 = unknown)
  int64_t log_every = 10;       ///< JSON line every N steps
};
metrics_actor spawn_metrics(caf::actor_system& sys, metrics_options opts);

struct coordinator_options {
  int64_t num_samples = 0;           ///< in the dataset
  int32_t credits = 4;               ///< batches in flight per prefetch
  int64_t max_steps = 0;             ///< 0: run `epochs`
  int64_t epochs = 1;
  int64_t checkpoint_every = 100;    ///< steps; 0 = only at epoch ends and the end
  std::string resume_ledger;         ///< a saved ledger (resume), or ""
  int64_t resume_step = 0;           ///< the drafters' step when resuming
  std::string resume_checkpoint;     ///< the checkpoint resumed from ("" = fresh)
  // Failure detection (config [runtime]); restarts are the supervisor's.
  double step_timeout_s = 120;       ///< a step longer than this is a hang
  double heartbeat_s = 0;            ///< an idle drafter is asked this often and must answer
                                     ///< within it (runtime.heartbeat_s); 0 = not asked
  /// Data-parallel drafters (more than one): the deadline of forming their
  /// NCCL group and of every collective in a step (runtime.group_timeout_s).
  double group_timeout_s = 30;
  /// Aborts the communicators of a broken data-parallel group (its NCCL
  /// unique id) that live in this process, so that survivors blocked in its
  /// init or collective stop at once instead of after group_timeout_s
  /// (DESIGN.md §3).  tandem run sets gpu::nccl::abort_group; unset, the
  /// survivors wait for their deadline.
  std::function<void(const std::vector<uint8_t>& group_id, const std::string& why)> abort_group;
  supervisor_actor supervisor;       ///< restarts failed drafters (spawn_supervisor)
};

struct supervisor_options {
  // Config [supervision].
  int64_t restart_budget = 3;        ///< restarts per drafter within window_s
  std::vector<double> backoff_s{1, 2, 4};  ///< before the n-th restart (the last repeats)
  double window_s = 600;
  /// Spawns drafter `index` restored from `checkpoint` ("" = fresh weights).
  std::function<drafter_actor(int32_t index, const std::string& checkpoint)> respawn_drafter;
};

/// Spawns the supervisor (messages/supervisor.hpp); it learns what to watch
/// from the coordinator's supervise message when the run starts.
supervisor_actor spawn_supervisor(caf::actor_system& sys, supervisor_options opts);

/// Spawns the coordinator.  It learns its peers from the run request
/// (messages/coordinator.hpp), since they need its handle to be spawned.
coordinator_actor spawn_coordinator(caf::actor_system& sys, coordinator_options opts);

} // namespace tandem
