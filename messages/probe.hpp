#pragma once
/// Device probe protocol: the smallest real round trip through Tandem's
/// stack.  A detached actor that owns one device (a GPU, or the CPU) runs a
/// LibTorch operation and one of Tandem's own CUDA kernels on it, checks the
/// result against a host reference, and replies with a report.
///
///   caller                      probe (detached, owns device d)
///     | -- (probe_atom, d) ------> |  set device, matmul + kernel on a side
///     |                            |  stream, compare with host reference
///     | <----- probe_report ------ |
///     | -- (shutdown_atom) ------> |  quits; no reply
///
/// probe_atom:    sent by `tandem doctor` and tests; answered with a
///                probe_report, or an error (errc::device_unavailable,
///                errc::device_failure, errc::wrong_result).
/// shutdown_atom: sent by the owner when done; the probe quits.
/// There is no step in flight here, so nothing arrives mid-step.

#include <cstdint>
#include <string>

#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "messages/atoms.hpp"

namespace tandem {

using probe_atom = caf::atom_constant<caf::atom("probe")>;

/// Device index meaning "the CPU".
constexpr int32_t cpu_device = -1;

/// What one probe measured on one device.
struct probe_report {
  int32_t device = cpu_device;  ///< CUDA ordinal, or cpu_device
  std::string backend;          ///< "cuda" or "cpu"
  std::string device_name;      ///< e.g. "NVIDIA H200"
  std::string thread_id;        ///< the probe actor's thread, as text
  double max_abs_error = 0;     ///< vs. a float64 host reference
  double elapsed_ms = 0;        ///< device work, measured by the probe
  bool custom_kernel = false;   ///< a Tandem-built CUDA kernel also ran
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, probe_report& x) {
  return f(caf::meta::type_name("tandem.probe_report"), x.device, x.backend,
           x.device_name, x.thread_id, x.max_abs_error, x.elapsed_ms,
           x.custom_kernel);
}

using probe_actor = caf::typed_actor<
  caf::replies_to<probe_atom, int32_t>::with<probe_report>,
  caf::reacts_to<shutdown_atom>>;

} // namespace tandem
