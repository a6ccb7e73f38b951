#include "actors/probe.hpp"

#include <caf/all.hpp>

#include "actors/default_handler.hpp"
#include "gpu/device/error.hpp"
#include "gpu/device/probe.hpp"
#include "messages/errors.hpp"

namespace tandem {

probe_fn default_probe_fn() {
  return [](int32_t device) { return gpu::run_probe(device); };
}

probe_actor::behavior_type probe_behavior(probe_actor::stateful_pointer<probe_state> self,
                                          probe_fn compute) {
  self->state.compute = std::move(compute);
  install_default_handler(self, probe_state::name);
  return {
    [self](probe_atom, int32_t device) -> caf::result<probe_report> {
      try {
        auto report = self->state.compute(device);
        ++self->state.probes_run;
        return report;
      } catch (const gpu::error& e) {
        return make_error(e.code(), e.what());
      } catch (const std::exception& e) {
        return make_error(errc::device_failure, e.what());
      }
    },
    [self](shutdown_atom) { self->quit(); },
  };
}

} // namespace tandem
