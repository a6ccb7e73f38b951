#pragma once
/// Atoms shared by several protocols.  Each protocol header declares the
/// atoms only it uses.

#include <caf/atom.hpp>

namespace tandem {

/// Lifecycle: the owner tells an actor to finish and quit (no reply).
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;

/// A consumer is done with a transport handle; its owner frees it.
using release_atom = caf::atom_constant<caf::atom("release")>;

} // namespace tandem
