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

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/spawn_options.hpp>

#include "gpu/decode/eval.hpp"
#include "gpu/engine/drafter_engine.hpp"
#include "gpu/engine/prefetch_engine.hpp"
#include "gpu/engine/target_engine.hpp"
#include "launch/options.hpp"
#include "messages/checkpointer.hpp"
#include "messages/control.hpp"
#include "messages/coordinator.hpp"
#include "messages/drafter.hpp"
#include "messages/eval.hpp"
#include "messages/metrics.hpp"
#include "messages/prefetch.hpp"
#include "messages/supervisor.hpp"
#include "messages/target.hpp"

namespace tandem {

struct fault_plan;

/// `faults`: those naming this prefetch or target (role and index) fire on
/// their at_step-th batch (fault_plan::take).
template <caf::spawn_options Os = caf::detached>
prefetch_actor spawn_prefetch(caf::actor_system& sys, int32_t index,
                              gpu::prefetch_engine_options opts, coordinator_actor coordinator,
                              std::shared_ptr<fault_plan> faults = nullptr);

template <caf::spawn_options Os = caf::detached>
target_actor spawn_target(caf::actor_system& sys, int32_t index, gpu::target_engine_options opts,
                          coordinator_actor coordinator, std::shared_ptr<fault_plan> faults = nullptr);

/// Injected faults (config `[[faults.inject]]`, `--fault`): each fires once
/// per run, whichever incarnation of its drafter reaches its step first —
/// and, with `fired_file`, whichever worker process of one `tandem run`
/// does (a fault that killed the worker does not fire again in the next).
/// Test and demonstration machinery, shared by the drafter's incarnations.
struct fault_plan {
  struct entry {
    std::string role = "drafter";  ///< "drafter", "target" or "prefetch"
    int32_t drafter = 0;           ///< the index within its role
    std::string kind;       ///< launch/run_config.hpp, fault_spec
    int64_t at_step = 0;    ///< fires when the drafter is about to take this step
    std::atomic<bool> fired{false};
  };
  std::vector<std::unique_ptr<entry>> entries;
  double hang_s = 0;        ///< how long "hang" blocks (beyond the step timeout)
  double slow_snapshot_s = 0;  ///< how long "slow_snapshot" keeps the snapshot copying
  /// "" or a file of the faults fired by earlier worker processes of this
  /// `tandem run` (one "drafter,kind,at_step" line each): those are marked
  /// fired at spawn_system, and record_fired appends (and fsyncs) before a
  /// fault acts, so one that kills the process is on record.
  std::string fired_file;
  void record_fired(const entry& e) const;
  /// The kind of the fault due for target or prefetch `index` (`role`) at
  /// its `count`-th batch, marked fired and recorded; "" when none.
  std::string take(const std::string& role, int32_t index, int64_t count);
  /// Fires it in the calling actor: "throw" throws, "abort" aborts the process.
  static void fire(const std::string& role, int32_t index, const std::string& kind);
};

/// `restore_from`: a checkpoint folder to load before the first step ("" = fresh).
template <caf::spawn_options Os = caf::detached>
drafter_actor spawn_drafter(caf::actor_system& sys, int32_t index, gpu::drafter_engine_options opts,
                            std::string restore_from, coordinator_actor coordinator,
                            std::shared_ptr<fault_plan> faults = nullptr);

/// Writes snapshots under `dir` (step-<k>/), keeping the newest `keep`
/// and `pinned` (a restore point a resumed run may still roll back to).
/// `durable` false: without fsync (restore points in shared memory, which
/// outlive the worker process, not the machine: gpu::write_checkpoint).
template <caf::spawn_options Os = caf::detached>
checkpointer_actor spawn_checkpointer(caf::actor_system& sys, std::filesystem::path dir, int keep,
                                      std::filesystem::path pinned = {}, bool durable = true);

/// Measures real τ of the snapshots it is sent (messages/eval.hpp) with
/// its own copy of the target on opts.device.
template <caf::spawn_options Os = caf::detached>
eval_actor spawn_eval(caf::actor_system& sys, gpu::eval_engine_options opts);

/// metrics_options: launch/options.hpp (plain data, filled by the launch plan).
/// `feed`: the control actor, sent every step report and event too (none: no endpoint).
metrics_actor spawn_metrics(caf::actor_system& sys, metrics_options opts, control_actor feed = {});

/// The control endpoint's actor (messages/control.hpp); its HTTP server is
/// actors/control_http.hpp.
control_actor spawn_control(caf::actor_system& sys, control_options opts, coordinator_actor coordinator);

/// The coordinator's settings (launch/options.hpp) and the wiring of a
/// running system.
struct coordinator_options : coordinator_settings {
  /// Aborts the communicators of a broken data-parallel group (its NCCL
  /// unique id) that live in this process, so that survivors blocked in its
  /// init or collective stop at once instead of after group_timeout_s
  /// (DESIGN.md §3).  tandem run sets gpu::nccl::abort_group; unset, the
  /// survivors wait for their deadline.
  std::function<void(const std::vector<uint8_t>& group_id, const std::string& why)> abort_group;
  supervisor_actor supervisor;       ///< restarts failed drafters (spawn_supervisor)
  /// A cluster run's door (actors/cluster.hpp; none: no members): asked
  /// where a member's drafter runs after a restart (a spare may hold it).
  caf::actor cluster_door;
};

/// The supervisor's policy (launch/options.hpp) and how it respawns.
struct supervisor_options : supervisor_settings {
  /// Spawns drafter `index` restored from `checkpoint` ("" = fresh weights)
  /// in this process.
  std::function<drafter_actor(int32_t index, const std::string& checkpoint)> respawn_drafter;
  /// A cluster run: drafter i's node ("" = this process; none: all here).
  /// A drafter on a member is respawned by asking the cluster's door
  /// (actors/cluster.hpp), which waits up to `rejoin_timeout_s` for a lost
  /// node to join again; the supervisor does not block meanwhile.
  std::vector<std::string> drafter_nodes;
  /// Spawns target or prefetch `index` again in this process (stateless:
  /// the same options as the first).
  std::function<target_actor(int32_t index)> respawn_target;
  std::function<prefetch_actor(int32_t index)> respawn_prefetch;
  /// Target i's node and prefetch i's (the same member: "" = this process).
  std::vector<std::string> target_nodes;
  caf::actor cluster_door;
  double rejoin_timeout_s = 300;
};

/// Spawns the supervisor (messages/supervisor.hpp); it learns what to watch
/// from the coordinator's supervise message when the run starts.
supervisor_actor spawn_supervisor(caf::actor_system& sys, supervisor_options opts);

/// Spawns the coordinator.  It learns its peers from the run request
/// (messages/coordinator.hpp), since they need its handle to be spawned.
coordinator_actor spawn_coordinator(caf::actor_system& sys, coordinator_options opts);

} // namespace tandem
