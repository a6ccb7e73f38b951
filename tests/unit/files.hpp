#pragma once
/// Disk and process helpers of the CPU unit tests that write files and run
/// TANDEM_PYTHON (data, safetensors, hf_config).  Torch-free.

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include <ftw.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

namespace tandem::test {

/// Deletes `p` and everything below it. Not std::filesystem::remove_all:
/// libtorch.so exports its own copy of it, built against a newer libstdc++,
/// which calls recursive_directory_iterator::__erase, absent from Debian 12's
/// libstdc++, and jumps to address 0.
inline void remove_tree(const std::filesystem::path& p) {
  ::nftw(
    p.c_str(), [](const char* f, const struct stat*, int, struct FTW*) { return ::remove(f); },
    16, FTW_DEPTH | FTW_PHYS);
}

inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Writes `bytes` to `p` (replacing it); a failed write fails the test.
inline void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
  ASSERT_TRUE(out.good()) << p;
}

#ifdef TANDEM_PYTHON
/// Runs TANDEM_PYTHON with `args`; returns its exit status (-1 when it did
/// not exit normally) and its stdout and stderr together.
inline std::pair<int, std::string> run_python(const std::string& args) {
  const std::string cmd = std::string("'") + TANDEM_PYTHON + "' " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr)
    return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
    out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}
#endif

} // namespace tandem::test
