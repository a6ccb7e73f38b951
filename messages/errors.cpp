#include "messages/errors.hpp"

namespace tandem {

std::string to_string(errc x) {
  switch (x) {
    case errc::device_unavailable: return "device_unavailable";
    case errc::device_failure: return "device_failure";
    case errc::wrong_result: return "wrong_result";
    case errc::bad_input: return "bad_input";
    case errc::timeout: return "timeout";
    case errc::unexpected_message: return "unexpected_message";
    case errc::device_lost: return "device_lost";
  }
  return "errc(" + std::to_string(static_cast<int>(x)) + ")";
}

} // namespace tandem
