#pragma once
/// Supervisor protocol (DESIGN.md §3).  The supervisor owns the drafters'
/// incarnations and their restart budgets: it monitors every worker,
/// restarts a failed drafter on its device from the restore point the
/// coordinator names, and escalates what it does not restart.  Cooperative
/// (cheap handlers: spawning a drafter only starts its thread).
///
///   coordinator                          supervisor                    workers
///     | -- supervise(coordinator, peers) --> |  monitors every one  --> |
///     |  a drafter died:                     |                          |
///     | <------------- drafter_down(j, why) -|                          |
///     |  a failure (death, non-finite loss, hang, missed heartbeat),    |
///     |  after the coordinator's rollback:   |                          |
///     | -- restart(j, why, from) ----------> |  kills j's incarnation   |
///     | <------ restart_plan (n, backoff_s)  |  (if alive)              |
///     |         or an error: budget spent    |                          |
///     |                     after backoff_s: |  spawns j from `from` -> |
///     | <------------- drafter_up(j, handle) |                          |
///     |  a target or prefetch died:          |                          |
///     | <---- worker_down(role, i, why) ---- |                          |
///     | -- restart(role, i, why) ----------> |                          |
///     | <------ restart_plan                 |  after backoff_s:        |
///     | <------ worker_up(i, handle) ------- |  spawns it again  -----> |
///     |  a checkpointer or metrics actor ended, a bad input:            |
///     | <-------------------- escalate(why) -|                          |
///
/// supervise_atom: once, from the coordinator when its run starts (so every
///   later restart request comes after it: one sender, in order).
/// restart_atom:   drafter j failed (`why`); restart it restored from
///   checkpoint `from` ("" = fresh weights; "memory:<k>" = its restore point
///   in device memory, which must hold update k: if it does not, the new
///   incarnation fails at once and the coordinator falls back to the
///   checkpoint).  A drafter whose last incarnation ended with
///   errc::bad_input (bad data, a truncated target file: the same on every
///   try) is refused at once with bad_input and its reason, not counted
///   against the budget: the run stops.  The answer counts the failure
///   in j's window (supervision.window_s): the restart's number, the budget
///   and the backoff before the new incarnation; past the budget, an error
///   (errc::device_failure) naming j and every failure in the window, and no
///   restart.  A death the supervisor reported is restarted only when the
///   coordinator asks, so every failure is counted once.
/// restart_atom (role, i, why): target or prefetch i (role "target" or
///   "prefetch") died; restart it.  Counted in its own window like a
///   drafter's, with the same budget and backoff; past the budget an error.
///   Stateless, so the new incarnation is the first one again: on this
///   process's device, or on its cluster member (asked through the door,
///   which waits for a lost node to join again).
/// respawn_atom:   the supervisor's own backoff timer (a drafter; a worker
///   by role and index).
/// hurry_atom:     from the coordinator when the run stops with a drafter
///   waiting out its restart backoff: that drafter starts now (the final
///   checkpoint is taken from it; a signal must not wait for the backoff).
/// shutdown_atom:  shuts the drafters' current incarnations down, then quits.

#include <cstdint>
#include <string>
#include <string_view>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "messages/atoms.hpp"
#include "messages/coordinator.hpp"
#include "messages/vitals.hpp"

namespace tandem {

/// restart_atom's `from` for a restore point in device memory: the prefix,
/// then the update count it must hold.
inline constexpr std::string_view memory_restore_prefix = "memory:";


using supervise_atom = caf::atom_constant<caf::atom("supervise")>;
using restart_atom = caf::atom_constant<caf::atom("restart")>;
using respawn_atom = caf::atom_constant<caf::atom("respawn")>;
using hurry_atom = caf::atom_constant<caf::atom("hurry")>;

/// The supervisor's answer to a restart request.
struct restart_plan {
  int64_t restart = 0;   ///< failures of this drafter within the window, this one included
  int64_t budget = 0;    ///< supervision.restart_budget
  double backoff_s = 0;  ///< delay before the new incarnation
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, restart_plan& x) {
  return f(caf::meta::type_name("tandem.restart_plan"), x.restart, x.budget, x.backoff_s);
}

/// The start of drafter_down's reason when the drafter was lost with its
/// node (a cluster member whose connection dropped): nothing of that
/// process survives, its restore point in device memory included.
constexpr const char* node_lost_prefix = "its node was lost: ";

using supervisor_actor = caf::typed_actor<
  caf::reacts_to<supervise_atom, coordinator_actor, coordinator_peers>,
  caf::replies_to<restart_atom, int32_t, std::string, std::string>::with<restart_plan>,
  caf::reacts_to<respawn_atom, int32_t, std::string>,
  caf::replies_to<restart_atom, std::string, int32_t, std::string>::with<restart_plan>,
  caf::reacts_to<respawn_atom, std::string, int32_t>,
  caf::reacts_to<hurry_atom>,
  caf::reacts_to<shutdown_atom>,
  vitals_protocol>;

} // namespace tandem
