#pragma once
/// The exception gpu/ throws; actors turn it into a `caf::error`.
/// Torch-free, so actors/ can catch it without LibTorch headers.

#include <stdexcept>
#include <string>

#include "messages/errors.hpp"

namespace tandem::gpu {

class error : public std::runtime_error {
public:
  error(errc code, const std::string& what) : std::runtime_error(what), code_(code) {}
  errc code() const noexcept { return code_; }

private:
  errc code_;
};

} // namespace tandem::gpu
