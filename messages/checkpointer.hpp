#pragma once
/// Checkpointer protocol.  Detached (it blocks on file I/O, never on a
/// GPU): writes snapshots atomically (write, fsync, rename).
///
///   coordinator                        checkpointer
///     | -- (snapshot_desc, extra) ----> |  writes <dir>/step-<k>/
///     | <------------------ dir written |  or an error (errc::bad_input)
///     | -- (shutdown) ----------------> |  quits
///
/// `extra` is the runtime's JSON (ledger, cursor), stored verbatim.  The
/// snapshot's transport handle passes to the checkpointer, which releases it
/// once written (or failed).

#include <string>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "messages/atoms.hpp"
#include "messages/descriptors.hpp"
#include "messages/vitals.hpp"

namespace tandem {

using checkpointer_actor = caf::typed_actor<
  caf::replies_to<snapshot_desc, std::string>::with<std::string>,
  caf::reacts_to<shutdown_atom>,
  vitals_protocol>;

} // namespace tandem
