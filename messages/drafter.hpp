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
/// Data-parallel drafters (N > 1) form one NCCL group, through messages:
///
///   coordinator                   drafter[0]            drafter[j], every j
///     | -- (heartbeat) ----------------------------------> |  up? (a restarted
///     | <------------------------------------- int64_t --- |   one answers once
///     |                            |                       |   restored)
///     | -- (group_id) ----------> |  a fresh ncclUniqueId (its process
///     | <------------ bytes ----- |   hosts the bootstrap root)
///     | -- group_spec{id, rank, world, generation} ---------> |  leaves any old
///     |                            |                          |  group, joins
///     | <---------------------------- int64_t (rank 0's step) |  (all ranks at
///     |                                                       |   once; rank 0's
///     |                                                       |   state broadcast)
///
/// Then every group step is N work items dispatched together, one a rank;
/// their captured steps all-reduce the gradient.  A work item with
/// contribute = false (the last group step of an epoch, when fewer than N
/// batches are left) trains on a copy of another rank's batch with its loss
/// scaled by 0: the rank joins the all-reduce with a zero gradient, as
/// PyTorch DDP's Join does for uneven inputs (the average still divides by
/// N).  A step whose collective cannot complete (a rank died) ends after
/// runtime.group_timeout_s with a report marked group_failed instead of
/// killing the survivor: its weights are reset by the next group's
/// broadcast from a rank restored from the newest checkpoint.
/// A step that throws kills the actor: the supervisor sees the down message
/// and restarts it.  An idle drafter that does not answer a heartbeat within
/// runtime.heartbeat_s counts as failed too (a busy one is watched by
/// runtime.step_timeout_s instead: its thread is inside the step).  A non-finite loss is reported (finite = false) without
/// applying the update.  Work items are handled one at a time, so a
/// snapshot request never arrives mid-step.

#include <cstdint>
#include <vector>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "messages/atoms.hpp"
#include "messages/descriptors.hpp"

namespace tandem {

using snapshot_atom = caf::atom_constant<caf::atom("snapshot")>;
using heartbeat_atom = caf::atom_constant<caf::atom("heartbeat")>;

using group_id_atom = caf::atom_constant<caf::atom("group_id")>;

/// Join NCCL group `nccl_id` as `rank` of `world` (leaving any group this
/// drafter is in first).  `generation` counts the groups formed in a run
/// (logs, errors); `timeout_s` bounds the join and every later collective.
struct group_spec {
  std::vector<uint8_t> nccl_id;
  int32_t rank = 0;
  int32_t world = 1;
  int64_t generation = 0;
  double timeout_s = 30;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, group_spec& x) {
  return f(caf::meta::type_name("tandem.group_spec"), x.nccl_id, x.rank, x.world, x.generation,
           x.timeout_s);
}

using drafter_actor = caf::typed_actor<
  caf::reacts_to<work_item>,
  caf::replies_to<group_id_atom>::with<std::vector<uint8_t>>,
  caf::replies_to<group_spec>::with<int64_t>,
  caf::replies_to<snapshot_atom>::with<snapshot_desc>,
  caf::replies_to<heartbeat_atom>::with<int64_t>,
  caf::reacts_to<shutdown_atom>>;

} // namespace tandem
