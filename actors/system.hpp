#pragma once
/// One run's actor system, spawned from its launch plan (launch/plan.hpp):
/// checkpointers, supervisor, coordinator, the control endpoint ([control]),
/// metrics, then one prefetch and one target actor per placement target and
/// one drafter per placement drafter (DESIGN.md §3).  `tandem run` calls spawn_system, start_run, and, when
/// the run has ended, shutdown_system; it keeps only the arguments and the
/// signal loop.

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <memory>
#include <string>

#include "actors/control_http.hpp"
#include "actors/spawn.hpp"
#include "launch/plan.hpp"
#include "messages/coordinator.hpp"
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

/// Spawns every actor `plan` names, wired to each other; nothing runs until
/// start_run.  The supervisor respawns drafter i from plan.drafters[i].
running_system spawn_system(caf::actor_system& sys, const launch_plan& plan);

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
