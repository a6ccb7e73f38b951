#pragma once
/// Prefetch protocol.  One prefetch actor per target, detached, owning its
/// rank's share of the dataset, its pinned staging memory and its copy
/// stream.  It packs and stages batches only against credits, so no queue
/// grows without bound.
///
///   coordinator                  prefetch[i]
///     | -- (epoch, e, done) -----> |  starts epoch e (minus committed samples)
///     | -- (credit, n) ----------> |  packs and stages up to n more batches
///     | <------------ batch_desc - |  one per batch (payload behind a handle)
///     | <--- (exhausted, i, e) --- |  epoch e has no more batches here
///     | -- (reissue, ids) -------> |  pack these first (after a rollback)
///     | -- (release, handle) ----> |  the batch was consumed: free it
///     | -- (shutdown) -----------> |  quits
///
/// All messages are asynchronous; none arrives mid-step (the actor has no
/// step: every handler runs to completion).

#include <cstdint>
#include <vector>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "messages/atoms.hpp"
#include "messages/descriptors.hpp"

namespace tandem {

using credit_atom = caf::atom_constant<caf::atom("credit")>;
using epoch_atom = caf::atom_constant<caf::atom("epoch")>;
using reissue_atom = caf::atom_constant<caf::atom("reissue")>;
using exhausted_atom = caf::atom_constant<caf::atom("exhausted")>;

using prefetch_actor = caf::typed_actor<
  caf::reacts_to<epoch_atom, int64_t, std::vector<int64_t>>,  ///< epoch, samples already committed
  caf::reacts_to<credit_atom, int32_t>,
  caf::reacts_to<reissue_atom, std::vector<int64_t>>,
  caf::reacts_to<release_atom, uint64_t>,
  caf::reacts_to<shutdown_atom>>;

} // namespace tandem
