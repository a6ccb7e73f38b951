// `tandem prepare`: chat JSONL → token shards (docs/data.md).  Tokenising
// and templating use the target's own Hugging Face tokenizer, so this
// subcommand runs tools/prepare/tandem_prepare.py with the Python
// environment Tandem was built against (TANDEM_PYTHON overrides it) and
// hands it every argument; `tandem prepare --help` shows the script's help.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "build_info.hpp"
#include "commands.hpp"

namespace tandem::cli {

void add_prepare(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
    "prepare", "Chat JSONL (ShareGPT, OpenAI messages, or tokenized) -> token shards with "
               "assistant-only loss masks, using the target's own tokenizer and chat template");
  cmd->set_help_flag();  // --help goes to the script
  cmd->allow_extras();
  cmd->prefix_command();
  cmd->callback([cmd, &exit_code] {
    const char* env = std::getenv("TANDEM_PYTHON");
    std::string python = env && *env ? env : build::python;
    std::filesystem::path script = std::filesystem::path(build::source_dir) / "tools" / "prepare"
                                   / "tandem_prepare.py";
    if (!std::filesystem::exists(script)) {
      std::fprintf(stderr, "tandem prepare: %s not found (Tandem's source tree moved?)\n",
                   script.c_str());
      exit_code = 2;
      return;
    }
    std::vector<std::string> args{python, script.string(), "--tandem-version",
                                  std::string(build::version) + " (" + build::git_commit + ")"};
    for (const auto& a : cmd->remaining())
      args.push_back(a);
    std::vector<char*> argv;
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    std::fflush(stdout);
    execv(python.c_str(), argv.data());
    std::fprintf(stderr, "tandem prepare: cannot run %s: %s (set TANDEM_PYTHON)\n", python.c_str(),
                 std::strerror(errno));
    exit_code = 2;
  });
}

} // namespace tandem::cli
