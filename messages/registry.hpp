#pragma once
/// The one registry of Tandem's message types and error category.
///
/// Every type that may travel in a message is added here, in one function,
/// append only: once nodes talk, these names are on the wire.

#include <caf/actor_system_config.hpp>

namespace tandem {

/// Adds every Tandem message type and the "tandem" error category to `cfg`.
void register_messages(caf::actor_system_config& cfg);

} // namespace tandem
