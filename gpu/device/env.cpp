#include "gpu/device/env.hpp"

#include <cstdlib>

#include "gpu/device/error.hpp"

namespace tandem::gpu {

std::string mode_choice(const std::string& mode, const char* name, std::initializer_list<const char*> choices) {
  std::string v = mode;
  if (v.empty())
    if (const char* e = std::getenv(name))
      v = e;
  if (v.empty())
    return *choices.begin();
  std::string list;
  for (const char* c : choices) {
    if (v == c)
      return v;
    list += (list.empty() ? "" : ", ") + std::string(c);
  }
  throw error(errc::bad_input, std::string(name) + "='" + v + "' is not one of " + list);
}

std::string env_choice(const char* name, std::initializer_list<const char*> choices) {
  return mode_choice("", name, choices);
}

} // namespace tandem::gpu
