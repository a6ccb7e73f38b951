#pragma once
/// The device probe actor (protocol: messages/probe.hpp).
///
/// Spawn it detached: it owns its device for its whole life and runs the
/// compute function on its private thread.  The compute function is a
/// parameter so that protocol tests can run it on CAF's deterministic
/// scheduler with a fake backend that returns or throws.

#include <functional>

#include <caf/actor_system.hpp>
#include <caf/spawn_options.hpp>
#include <caf/stateful_actor.hpp>

#include "messages/probe.hpp"

namespace tandem {

/// Computes one probe on the calling thread; throws gpu::error on failure.
using probe_fn = std::function<probe_report(int32_t device)>;

struct probe_state {
  static inline const char* name = "tandem.probe";
  probe_fn compute;
  int32_t probes_run = 0;
};

probe_actor::behavior_type probe_behavior(probe_actor::stateful_pointer<probe_state> self,
                                          probe_fn compute);

/// The real backend: gpu::run_probe.
probe_fn default_probe_fn();

/// Spawns a probe; `Os` is caf::detached in production (its own thread) and
/// caf::no_spawn_options under the deterministic test scheduler.
template <caf::spawn_options Os = caf::detached>
probe_actor spawn_probe(caf::actor_system& sys, probe_fn compute = default_probe_fn()) {
  return sys.spawn<Os>(probe_behavior, std::move(compute));
}

} // namespace tandem
