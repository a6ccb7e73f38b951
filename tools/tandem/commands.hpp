#pragma once
/// The `tandem` subcommands.  Each adds itself to the CLI and returns the
/// process exit code when run.

#include <CLI/CLI.hpp>

namespace tandem::cli {

/// `tandem info`: versions, build options, devices.
void add_info(CLI::App& app, int& exit_code);

/// `tandem doctor`: a detached actor per device runs LibTorch and a Tandem
/// CUDA kernel and replies; fails (exit 1) on any wrong or missing answer.
void add_doctor(CLI::App& app, int& exit_code);

/// `tandem bench`: the benchmark suite, JSON lines.
void add_bench(CLI::App& app, int& exit_code);

/// `tandem prepare`: chat JSONL -> token shards (runs tools/prepare/tandem_prepare.py).
void add_prepare(CLI::App& app, int& exit_code);

/// `tandem run CONFIG.toml`: single-node training.
void add_run(CLI::App& app, int& exit_code);

} // namespace tandem::cli
