#pragma once
/// The TANDEM_* variables that pick one of a few modes (docs/environment.md),
/// read and checked in one place.

#include <initializer_list>
#include <string>

namespace tandem::gpu {

/// The value of the environment variable `name` when it is one of `choices`;
/// unset or empty gives `choices`' first, the default.  Anything else is
/// bad input: "NAME='X' is not one of a, b, c".
std::string env_choice(const char* name, std::initializer_list<const char*> choices);

/// The same check for a mode given by code or by `name`: `mode` when it is
/// not empty, else the variable (unset or empty: the first choice).
std::string mode_choice(const std::string& mode, const char* name, std::initializer_list<const char*> choices);

} // namespace tandem::gpu
