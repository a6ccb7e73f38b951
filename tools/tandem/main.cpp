// tandem — trains speculative-decoding drafters next to their frozen target.
// Each subcommand lives in its own file; this one only wires them up.

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "build_info.hpp"
#include "commands.hpp"

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

/// `tandem WORD ...` where WORD is no subcommand: says so, suggests the
/// nearest one (within two edits, or the one it starts), lists them all.
/// CLI11 alone would answer "A subcommand is required", and `tandem WORD
/// --help` would print the main help and exit 0.
bool unknown_subcommand(const CLI::App& app, const char* word) {
  if (word[0] == '-')
    return false;
  std::vector<std::string> names;
  for (const auto* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(sub->get_name());
  if (std::find(names.begin(), names.end(), word) != names.end())
    return false;
  std::string best;
  size_t best_d = 3;
  for (const auto& n : names) {
    const size_t d = n.rfind(word, 0) == 0 ? 1 : edit_distance(word, n);
    if (d < best_d)
      best_d = d, best = n;
  }
  std::string all;
  for (const auto& n : names)
    all += (all.empty() ? "" : ", ") + n;
  std::fprintf(stderr, "tandem: unknown command '%s'%s\ncommands: %s (tandem --help)\n", word,
               best.empty() ? "" : (" (did you mean '" + best + "'?)").c_str(), all.c_str());
  return true;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tandem: trains speculative-decoding drafters (DFlash) next to their frozen "
               "target LLM, as a system of GPU-owning actors."};
  app.set_version_flag("--version", std::string("tandem ") + tandem::build::version + " ("
                                      + tandem::build::git_commit + ")");
  app.require_subcommand(1);
  int exit_code = 0;
  tandem::cli::add_info(app, exit_code);
  tandem::cli::add_doctor(app, exit_code);
  tandem::cli::add_bench(app, exit_code);
  tandem::cli::add_prepare(app, exit_code);
  tandem::cli::add_run(app, exit_code);
  tandem::cli::add_shell(app, exit_code);
  tandem::cli::add_node(app, exit_code);
  tandem::cli::add_certs(app, exit_code);
  tandem::cli::add_eval(app, exit_code);
  tandem::cli::add_export(app, exit_code);
  tandem::cli::add_generate(app, exit_code);
  if (argc == 1) {  // bare `tandem`: show what it can do
    std::printf("%s", app.help().c_str());
    return 0;
  }
  if (unknown_subcommand(app, argv[1]))
    return 2;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints it; --help and --version are successes, any other
    // mistake on the command line is a usage error: 2, as every check of
    // Tandem's own (CLI11's codes, 105 and up, meant nothing to a user).
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  return exit_code;
}
