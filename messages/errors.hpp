#pragma once
/// Tandem's error codes, carried by `caf::error` in category "tandem".
///
/// Append only: the numeric values cross node boundaries once several nodes
/// talk, so a code is never renumbered or reused.

#include <cstdint>
#include <string>

#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/make_message.hpp>

namespace tandem {

enum class errc : uint8_t {
  /// A GPU was asked for that this host does not have (or no driver).
  device_unavailable = 1,
  /// A CUDA, cuBLAS or NCCL call failed; the context names the call.
  device_failure = 2,
  /// A computed result disagreed with its reference beyond tolerance.
  wrong_result = 3,
  /// Input (config, shard, weights) is malformed; the context names the file.
  bad_input = 4,
  /// A request got no answer within its timeout.
  timeout = 5,
  /// An actor received a message its protocol does not handle.
  unexpected_message = 6,
  /// A device's CUDA context is poisoned (a sticky error such as an illegal
  /// address): nothing on that device can be used again in this process.
  /// Not retried in-process; `tandem run`'s worker exits with status 75 and
  /// its parent starts a new worker from the newest restore point that
  /// outlived it (DESIGN.md §3, restore tiers).
  device_lost = 7,
};

/// The error category atom of every Tandem error.
constexpr caf::atom_value error_category = caf::atom("tandem");

/// Human-readable name of a code ("device_failure").
std::string to_string(errc x);

/// Turns a code into a `caf::error` (found by ADL, so `return errc::x;`
/// works inside `caf::result<T>` handlers).
inline caf::error make_error(errc x) {
  return caf::error{static_cast<uint8_t>(x), error_category};
}

/// As above, with context (usually a sentence naming what failed).
inline caf::error make_error(errc x, std::string context) {
  return caf::error{static_cast<uint8_t>(x), error_category,
                    caf::make_message(std::move(context))};
}

} // namespace tandem
