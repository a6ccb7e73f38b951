#pragma once
/// Target protocol.  One target actor per GPU, detached, owning the frozen
/// target model.  It turns staged batches into tapped features.
///
///   coordinator                   target[i]
///     | -- batch_desc -----------> |  forward up to the deepest tap
///     | <--------------- work_item |  the batch with its features_desc
///     | -- (release, handle) ----> |  a drafter is done with the features
///     | -- (shutdown) -----------> |  quits
///
/// Asynchronous.  A failed forward ends the target with a caf::error naming
/// the batch; the supervisor restarts it (messages/supervisor.hpp,
/// worker_down) and the coordinator re-issues what was in flight.
///
/// A drafter that cannot map a work item's payloads (on another host, or
/// any other process with cluster.transport = "nccl") pulls them from the
/// target named in its features_desc over an NCCL link
/// (gpu/transport/link.hpp):
///
///   drafter[j]                    target[i]
///     | -- (link, j) ------------> |  a fresh NCCL id, answered at once; then
///     | <------------------ bytes  |  both join the two-rank link (replacing
///     |                            |  any link of drafter j: a send stuck on
///     |                            |  its dead incarnation ends)
///     | -- (pull, j, handles) ---> |  checks the handles (batch, features)
///     | <----------------- pulled  |  answered, then the sends are enqueued
///     |   receives on its link     |  on the link's stream
///
/// An error answer (an unknown handle, no link) means nothing was sent.

#include <cstdint>
#include <vector>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "messages/atoms.hpp"
#include "messages/descriptors.hpp"
#include "messages/vitals.hpp"

namespace tandem {

/// A drafter asks for an NCCL link (its index; the answer is the NCCL id).
using link_atom = caf::atom_constant<caf::atom("link")>;
/// A drafter pulls payloads over its link (its index, the handles).
using pull_atom = caf::atom_constant<caf::atom("pull")>;

using target_actor = caf::typed_actor<
  caf::reacts_to<batch_desc>,
  caf::reacts_to<release_atom, uint64_t>,
  caf::replies_to<link_atom, int32_t>::with<std::vector<uint8_t>>,
  caf::replies_to<pull_atom, int32_t, std::vector<uint64_t>>::with<pulled>,
  caf::reacts_to<shutdown_atom>,
  vitals_protocol>;

} // namespace tandem
