#pragma once
/// Prefetch protocol.  One prefetch actor per target, detached, owning its
/// rank's share of the dataset, its pinned staging memory and its copy
/// stream.  It packs and stages batches only against credits, so no queue
/// grows without bound.
///
///   coordinator                  prefetch[i]
///     | -- (epoch, e, g, done) --> |  starts epoch e (minus the samples done)
///     | -- (credit, n) ----------> |  packs and stages up to n more batches
///     | <------------ batch_desc - |  one per batch (payload behind a handle)
///     | <-- (exhausted, i, e, g) - |  epoch e has no more batches here
///     | -- (reissue, ids) -------> |  pack these first (after a rollback)
///     | -- (release, handle) ----> |  the batch was consumed: free it
///     | -- (shutdown) -----------> |  quits
///
/// All messages are asynchronous; none arrives mid-step (the actor has no
/// step: every handler runs to completion).
///
/// Data generation `g`: every epoch message starts a new one, and so does a
/// rollback, which sends the epoch again with the samples trained into the
/// restore point as `done`: the packer then produces exactly the batches an
/// uninterrupted run packs after that point (the batches depend only on the
/// samples consumed, gpu/data/packer.hpp), so a run with failures trains the
/// same batches as one without.  Batches and `exhausted` carry the generation
/// they belong to; the coordinator drops those of an older one (sent before
/// the prefetch saw the rollback) and returns their credit.

#include <cstdint>
#include <vector>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "messages/atoms.hpp"
#include "messages/descriptors.hpp"
#include "messages/vitals.hpp"

namespace tandem {

using credit_atom = caf::atom_constant<caf::atom("credit")>;
using epoch_atom = caf::atom_constant<caf::atom("epoch")>;
using reissue_atom = caf::atom_constant<caf::atom("reissue")>;
using exhausted_atom = caf::atom_constant<caf::atom("exhausted")>;

using prefetch_actor = caf::typed_actor<
  caf::reacts_to<epoch_atom, int64_t, int64_t, std::vector<int64_t>>,  ///< epoch, generation, samples done
  caf::reacts_to<credit_atom, int32_t>,
  caf::reacts_to<reissue_atom, std::vector<int64_t>>,
  caf::reacts_to<release_atom, uint64_t>,
  caf::reacts_to<shutdown_atom>,
  vitals_protocol>;

} // namespace tandem
