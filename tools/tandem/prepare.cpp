// `tandem prepare`: chat JSONL → token shards (docs/data.md).  Tokenising
// and templating use the target's own Hugging Face tokenizer, so this
// subcommand runs tools/prepare/tandem_prepare.py with the Python
// environment Tandem was built against (TANDEM_PYTHON overrides it) and
// hands it every argument; `tandem prepare --help` shows the script's help.
// `tandem run` uses the same script for `data.sources` (run_prepare).
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "build_info.hpp"
#include "commands.hpp"
#include "resources.hpp"

extern char** environ;

namespace tandem::cli {

std::string prepare_python() {
  const char* env = std::getenv("TANDEM_PYTHON");
  return env && *env ? env : build::python;
}

namespace {

/// python, the script, --tandem-version, then `args`; empty when the script
/// is missing (reported).
std::vector<std::string> prepare_argv(const std::vector<std::string>& args) {
  const auto script = resource("tools/prepare/tandem_prepare.py");
  if (!std::filesystem::exists(script)) {
    std::fprintf(stderr, "tandem prepare: %s not found (install with `cmake --install BUILD "
                         "--prefix PREFIX`, or run the tandem of a build tree)\n",
                 script.c_str());
    return {};
  }
  std::vector<std::string> argv{prepare_python(), script.string(), "--tandem-version",
                                std::string(build::version) + " (" + build::git_commit + ")"};
  // --regenerate decodes with this executable (`tandem generate`).
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec)
    argv.insert(argv.end(), {"--tandem-bin", self.string()});
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

std::vector<char*> c_argv(std::vector<std::string>& args) {
  std::vector<char*> out;
  for (auto& a : args)
    out.push_back(a.data());
  out.push_back(nullptr);
  return out;
}

} // namespace

int run_prepare(const std::vector<std::string>& args) {
  auto argv = prepare_argv(args);
  if (argv.empty())
    return 127;
  auto cargv = c_argv(argv);
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = 0;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);  // all on stderr
  int rc = posix_spawnp(&pid, argv[0].c_str(), &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    std::fprintf(stderr, "tandem prepare: cannot run %s: %s (set TANDEM_PYTHON)\n",
                 argv[0].c_str(), std::strerror(rc));
    return 127;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR)
      return 127;
  if (WIFSIGNALED(status))
    return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

void add_prepare(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
    "prepare", "Chat JSONL (ShareGPT, OpenAI messages, or tokenized) -> token shards with "
               "assistant-only loss masks, using the target's own tokenizer and chat template");
  cmd->set_help_flag();  // --help goes to the script
  cmd->allow_extras();
  cmd->prefix_command();
  cmd->callback([cmd, &exit_code] {
    auto argv = prepare_argv(cmd->remaining());
    if (argv.empty()) {
      exit_code = 2;
      return;
    }
    auto cargv = c_argv(argv);
    std::fflush(stdout);
    execvp(argv[0].c_str(), cargv.data());
    std::fprintf(stderr, "tandem prepare: cannot run %s: %s (set TANDEM_PYTHON)\n",
                 argv[0].c_str(), std::strerror(errno));
    exit_code = 2;
  });
}

} // namespace tandem::cli
