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
/// the batch; `tandem run` monitors the targets and stops the run with that
/// reason (only drafters are restarted).

#include <cstdint>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "messages/atoms.hpp"
#include "messages/descriptors.hpp"
#include "messages/vitals.hpp"

namespace tandem {

using target_actor = caf::typed_actor<
  caf::reacts_to<batch_desc>,
  caf::reacts_to<release_atom, uint64_t>,
  caf::reacts_to<shutdown_atom>,
  vitals_protocol>;

} // namespace tandem
