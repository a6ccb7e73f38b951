#pragma once
/// Metrics protocol.  Cooperative (cheap handlers): JSON lines, terminal
/// progress.
///
///   anyone               metrics
///     | -- step_report --> |  a line per report, progress every `every_s`
///     | -- (event, json) > |  any other event as a JSON object line
///     | -- (shutdown) ---> |  flushes and quits

#include <string>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "messages/atoms.hpp"
#include "messages/descriptors.hpp"

namespace tandem {

using event_atom = caf::atom_constant<caf::atom("event")>;

using metrics_actor = caf::typed_actor<
  caf::reacts_to<step_report>,
  caf::reacts_to<event_atom, std::string>,
  caf::reacts_to<shutdown_atom>>;

} // namespace tandem
