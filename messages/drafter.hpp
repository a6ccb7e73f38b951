#pragma once
/// Drafter protocol.  One drafter actor per GPU, detached, owning the
/// drafter's weights, optimizer state and (on a GPU) its captured step.
///
///   coordinator                   drafter[j]
///     | -- work_item ------------> |  one training step
///     | <------------ step_report  |  loss, accuracy, wait, …
///     | -- (snapshot) -----------> |  copy weights + optimizer off the device
///     | <----------- snapshot_desc |  (a request: the reply carries the handle;
///     |                            |   whoever receives it owns and releases it)
///     | -- (heartbeat) ----------> |  liveness, asked of an idle drafter
///     | <-------------- int64_t    |  (the reply: updates applied so far)
///     | -- (shutdown) -----------> |  quits
///
/// A step that throws kills the actor: the supervisor sees the down message
/// and restarts it.  An idle drafter that does not answer a heartbeat within
/// runtime.heartbeat_s counts as failed too (a busy one is watched by
/// runtime.step_timeout_s instead: its thread is inside the step).  A non-finite loss is reported (finite = false) without
/// applying the update.  Work items are handled one at a time, so a
/// snapshot request never arrives mid-step.

#include <cstdint>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "messages/atoms.hpp"
#include "messages/descriptors.hpp"

namespace tandem {

using snapshot_atom = caf::atom_constant<caf::atom("snapshot")>;
using heartbeat_atom = caf::atom_constant<caf::atom("heartbeat")>;

using drafter_actor = caf::typed_actor<
  caf::reacts_to<work_item>,
  caf::replies_to<snapshot_atom>::with<snapshot_desc>,
  caf::replies_to<heartbeat_atom>::with<int64_t>,
  caf::reacts_to<shutdown_atom>>;

} // namespace tandem
