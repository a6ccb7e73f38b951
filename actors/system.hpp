#pragma once
/// One run's actor system, spawned from its launch plan (launch/plan.hpp):
/// checkpointers, supervisor, coordinator, the control endpoint ([control]),
/// metrics, then one prefetch and one target actor per placement target and
/// one drafter per placement drafter (DESIGN.md §3).  `tandem run` calls spawn_system, start_run, and, when
/// the run has ended, shutdown_system; it keeps only the arguments and the
/// signal loop.

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <map>
#include <memory>
#include <string>

#include "actors/control_http.hpp"
#include "actors/spawn.hpp"
#include "launch/plan.hpp"
#include "messages/coordinator.hpp"
#include "messages/node.hpp"
#include "messages/supervisor.hpp"

namespace tandem {

/// The handles of a spawned run.
struct running_system {
  coordinator_actor coordinator;
  supervisor_actor supervisor;
  coordinator_peers peers;  ///< the first incarnations of the workers
  /// The control endpoint ([control]; none when control.listen is ""): its
  /// actor, its HTTP server (bound, serving) and the token it wants.
  control_actor control;
  std::shared_ptr<control_server> control_http;
  std::string control_token;
};

/// The injected faults of `plan` (actors/spawn.hpp), those an earlier
/// worker process fired (plan.faults_fired_file) marked fired.
std::shared_ptr<fault_plan> make_fault_plan(const launch_plan& plan);

/// The members of a cluster run by name (messages/node.hpp): their agents
/// spawn what the plan places on them (empty: one process).
struct cluster_members {
  std::map<std::string, node_actor> agents;
  /// The leader's door (actors/cluster.hpp): restarts on a member go through
  /// it, so they wait for a lost node to join again, up to rejoin_timeout_s.
  caf::actor door;
  double rejoin_timeout_s = 300;
  /// How long a spawn request to a member may take.
  double spawn_timeout_s = 120;
};

/// Spawns every actor `plan` names, wired to each other; nothing runs until
/// start_run.  The supervisor respawns drafter i from plan.drafters[i].
/// Actors placed on a member are spawned by its agent (`members`); each
/// member with drafters gets its own checkpointers, which a router on this
/// process feeds (snapshots never leave their node).  Throws
/// std::runtime_error when a member does not spawn what it is asked.
running_system spawn_system(caf::actor_system& sys, const launch_plan& plan, const cluster_members& members = {});

/// Asks the coordinator to run.  `reply_to` receives one message when the
/// run ends: its run_summary, or a caf::error (the run failed, or the
/// coordinator or the supervisor ended without an answer).
void start_run(caf::actor_system& sys, const running_system& run, caf::actor reply_to);

/// Asks the coordinator to stop (as a signal does): it finishes the step,
/// writes a checkpoint unless checkpoint.on_signal is false, and answers.
void request_stop(const running_system& run);

/// Shuts every actor down, in order: the supervisor first (no restarts or
/// escalations from here on; it shuts the drafters' current incarnations
/// down), producers, then consumers, then bookkeeping.
void shutdown_system(const running_system& run);

} // namespace tandem
