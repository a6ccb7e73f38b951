#pragma once
/// Drafter protocol.  One drafter actor per GPU, detached, owning the
/// drafter's weights, optimizer state and (on a GPU) its captured step.
///
///   coordinator                   drafter[j]
///     | -- work_item ------------> |  one training step
///     | <------------ step_report  |  loss, accuracy, wait, …
///     | -- (snapshot) -----------> |  copy weights + optimizer off the device
///     | <----------- snapshot_desc |  (a request: the reply carries the handle;
///     |                            |   whoever receives it owns and releases it;
///     |                            |   the copy runs on a side stream into
///     |                            |   page-locked buffers while the drafter
///     |                            |   polls it with (snapshot_poll) sent to
///     |                            |   itself, answering heartbeats meanwhile)
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
/// N).
///
/// A rank that fails inside a group step (actors/coordinator_group.cpp,
/// resolve_group_failure; since commit 2767db8):
///   1. the coordinator aborts the group's communicators in this process
///      (coordinator_options::abort_group), so survivors blocked in the
///      collective stop at once rather than after runtime.group_timeout_s;
///   2. each survivor's update is guarded on the device (skipped when the
///      abort flag is up or a one-element all-reduce does not sum to N), it
///      leaves the group and sends a step_report marked group_failed whose
///      `step` is the update count its state holds (read back, sync_step):
///      the step before (update skipped) or the step itself (the collective
///      had completed, every rank's gradient is in);
///   3. once every survivor has reported, the coordinator decides: all of
///      them at the step before or the step itself ("known") — training
///      continues from a survivor at the furthest of the two (restore from
///      peers: no step lost; the step counts if one applied it), and the
///      next group's rank 0 is such a survivor, whose broadcast overwrites
///      the restarted rank; any other state (or no survivor) — every rank
///      goes back to the newest checkpoint, the restarted rank (restored
///      from it) is the next rank 0.
/// A failure between group steps (the group at rest) leaves the survivors
/// at the ledger's step: the same restore from peers, nothing rolled back
/// but the batches in flight.  A report of a step already handled is
/// ignored (a metrics line group_step_abandoned when it says group_failed).
///
/// Liveness, as the coordinator checks it (its tick, every 250 ms):
///   * a busy drafter is inside its step: a step running longer than
///     runtime.step_timeout_s is a hang (while the group is broken or a rank
///     failed inside the step, max(step_timeout_s, group_timeout_s + 10):
///     a survivor's collective returns only after its own deadline);
///   * an idle drafter (no heartbeat outstanding) is asked a heartbeat once
///     runtime.heartbeat_s has passed since it was last asked (or came up);
///     no answer within heartbeat_s is a failure of that incarnation, unless
///     it was replaced meanwhile.  heartbeat_s = 0: never asked.  No
///     heartbeats while a group is being formed (joining blocks the
///     drafters' threads);
///   * forming a group asks every drafter a heartbeat first, answered
///     within step_timeout_s (a restarted one answers once restored);
///   * a drafter asked for a snapshot is busy copying its state (12.6 GB at
///     8B): it is asked no heartbeat and sent no work until it answers
///     (a single drafter's restore point for the shared-memory tier
///     excepted: it copies beside training, from the restore point in
///     device memory, and is sent work up to the next step at which another
///     snapshot is due; actors/coordinator_routing.cpp, work_beside_snapshot), and
///     the snapshot request's own deadline (snapshot_timeout, 10 minutes,
///     actors/coordinator_state.hpp) watches it; its answer counts as a
///     heartbeat.  An outstanding request is accounted for, never taken
///     for silence.
/// A failure is a failure of that incarnation only: its later messages are
/// ignored (the coordinator compares the sender with the live incarnation).
/// A step that throws kills the actor: the supervisor sees the down message
/// and restarts it.  A non-finite loss is reported (finite = false) without
/// applying the update.  Work items are handled one at a time, so a
/// snapshot request never arrives mid-step.

#include <cstdint>
#include <vector>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "messages/atoms.hpp"
#include "messages/descriptors.hpp"
#include "messages/vitals.hpp"

namespace tandem {

using snapshot_atom = caf::atom_constant<caf::atom("snapshot")>;
using heartbeat_atom = caf::atom_constant<caf::atom("heartbeat")>;
/// The drafter's own timer while a snapshot's copy runs (never sent by others).
using snapshot_poll_atom = caf::atom_constant<caf::atom("snappoll")>;

using group_id_atom = caf::atom_constant<caf::atom("group_id")>;

/// Arms an injected fault (the control endpoint, through the coordinator):
/// `kind` as fault_spec's (launch/run_config.hpp), fired at the first step
/// this incarnation takes at or after `at_step` (0: its next step); the
/// snapshot kinds at its first snapshot from then on.
using fault_atom = caf::atom_constant<caf::atom("fault")>;

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
  caf::reacts_to<shutdown_atom>,
  caf::reacts_to<snapshot_poll_atom>,
  caf::reacts_to<fault_atom, std::string, int64_t>,
  vitals_protocol>;

} // namespace tandem
