#pragma once
/// How a GPU actor reports a failure of its device work: with the engine's
/// own code, unless the device's CUDA context is lost (a sticky error), which
/// is errc::device_lost whatever the code (messages/errors.hpp): nothing on
/// that device can run again in this process.  Called on the actor's own
/// thread, the device's owner.

#include <cstdint>
#include <optional>
#include <string>

#include "gpu/device/runtime.hpp"
#include "messages/errors.hpp"

namespace tandem {

struct failure_class {
  errc code;
  std::string suffix;  ///< appended to the error's sentence ("" unless the context is lost)
};

/// Keeps `engine` alive for the rest of the process when `c` says the
/// device is lost: its destructors would call into the poisoned context
/// (frees, graph and handle teardown), which may abort; the worker process
/// exits with status 75 soon after, and the memory goes with it.
template <class Engine>
void keep_engine_if_lost(const failure_class& c, std::optional<Engine>& engine) {
  if (c.code == errc::device_lost && engine) {
    (void)new Engine(std::move(*engine));  // leaked on purpose
    engine.reset();
  }
}

inline failure_class classify_failure(errc code, int32_t device) {
  const auto lost = gpu::context_error(device);
  if (lost.empty())
    return {code, ""};
  return {errc::device_lost, " [the CUDA context of cuda:" + std::to_string(device) + " is lost: " + lost
                               + "; this process cannot use the device again]"};
}

} // namespace tandem
