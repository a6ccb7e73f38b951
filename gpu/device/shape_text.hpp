#pragma once
/// A tensor shape as gpu/'s error messages write it: "[2, 3, 4]".

#include <string>

#include <c10/util/ArrayRef.h>

namespace tandem::gpu {

inline std::string shape_text(c10::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i)
    out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

} // namespace tandem::gpu
