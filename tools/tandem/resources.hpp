#pragma once
/// Where the `tandem` executable finds the files it ships with (the Python
/// half of `tandem prepare`, the bench's PyTorch reference, the embedded
/// default's config): relative to the executable first — an installed
/// program (`cmake --install`) is PREFIX/bin/tandem beside
/// PREFIX/share/tandem/ — and only then in the source tree the build came
/// from, so a build moved or installed elsewhere keeps working.

#include <filesystem>
#include <string>

namespace tandem::cli {

/// PREFIX/share/tandem when this executable is installed (that folder
/// exists beside its bin/), else the build's source tree.
std::filesystem::path resource_root();

/// resource_root() / `relative`, e.g. "tools/prepare/tandem_prepare.py".
std::filesystem::path resource(const std::string& relative);

} // namespace tandem::cli
