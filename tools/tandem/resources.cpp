#include "resources.hpp"

#include <system_error>

#include "build_info.hpp"

namespace tandem::cli {

std::filesystem::path resource_root() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    auto installed = exe.parent_path().parent_path() / "share" / "tandem";
    if (std::filesystem::is_directory(installed, ec))
      return installed;
  }
  return build::source_dir;
}

std::filesystem::path resource(const std::string& relative) {
  return resource_root() / relative;
}

} // namespace tandem::cli
