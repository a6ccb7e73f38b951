// tandem — trains speculative-decoding drafters next to their frozen target.
// Each subcommand lives in its own file; this one only wires them up.

#include <cstdio>

#include <CLI/CLI.hpp>

#include "build_info.hpp"
#include "commands.hpp"

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
  if (argc == 1) {  // bare `tandem`: show what it can do
    std::printf("%s", app.help().c_str());
    return 0;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}
