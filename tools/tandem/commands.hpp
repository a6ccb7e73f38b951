#pragma once
/// The `tandem` subcommands.  Each adds itself to the CLI and returns the
/// process exit code when run.

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/expected.hpp>

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

/// The Python that runs tools/prepare/tandem_prepare.py: TANDEM_PYTHON when
/// set and not empty (a path, or a name looked up on PATH), else the one
/// the build was configured with.
std::string prepare_python();

/// Runs `tandem prepare ARGS...` as a child process and waits for it; its
/// output goes to this process's stderr.  Returns its exit status (127 when
/// it could not be started, 128 + N when killed by signal N).
int run_prepare(const std::vector<std::string>& args);

/// `text` read as a finite number into `v`: "" or what is wrong with it.
inline std::string read_finite_number(const std::string& text, double& v) {
  if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v))
    return "must be a number, got '" + text + "'";
  return std::string();
}

/// Range checks for numeric options, said as a person would ("--batch: must
/// be at least 1, got 0"; CLI11's own print the whole double range).
inline CLI::Validator number_at_least(double low) {
  return CLI::Validator(
    [low](std::string& text) -> std::string {
      double v = 0;
      if (auto why = read_finite_number(text, v); !why.empty())
        return why;
      if (!(v >= low)) {
        auto bound = std::to_string(low);
        bound.erase(bound.find_last_not_of('0') + 1);
        if (!bound.empty() && bound.back() == '.')
          bound.pop_back();
        return "must be at least " + bound + ", got " + text;
      }
      return std::string();
    },
    low == 0 ? "NONNEGATIVE" : "AT LEAST " + std::to_string(static_cast<long long>(low)));
}
inline const CLI::Validator non_negative = number_at_least(0);
inline const CLI::Validator positive = CLI::Validator(
  [](std::string& text) -> std::string {
    double v = 0;
    if (auto why = read_finite_number(text, v); !why.empty())
      return why;
    return v > 0 ? std::string() : "must be more than 0, got " + text;
  },
  "POSITIVE");
inline const CLI::Validator at_least_one = number_at_least(1);
/// A duration in seconds: more than 0 and at most `most` (a timer's range:
/// "--wait-s: must be more than 0 and at most 86400 s, got inf").
inline CLI::Validator seconds_up_to(double most) {
  return CLI::Validator(
    [most](std::string& text) -> std::string {
      double v = 0;
      if (auto why = read_finite_number(text, v); !why.empty())
        return why;
      return v > 0 && v <= most ? std::string()
                                : "must be more than 0 and at most " + std::to_string(static_cast<long long>(most))
                                    + " s, got " + text;
    },
    "SECONDS");
}

/// --top-p of eval and generate ("--top-p: must be in (0, 1] (1: off), got 0"; the
/// engine's own check printed "top_p ... got 0.000000").
inline const CLI::Validator top_p_range = CLI::Validator(
  [](std::string& text) -> std::string {
    double v = 0;
    if (auto why = read_finite_number(text, v); !why.empty())
      return why;
    return v > 0 && v <= 1 ? std::string() : "must be in (0, 1] (1: off), got " + text;
  },
  "IN (0, 1]");

/// A file to be written whose folder must exist ("--out: no folder /x for /x/f.jsonl"
/// before any work, not "cannot write /x/f.jsonl" without the option's name).
inline const CLI::Validator in_existing_folder = CLI::Validator(
  [](std::string& text) -> std::string {
    std::error_code ec;
    const auto dir = std::filesystem::path(text).parent_path();
    return dir.empty() || std::filesystem::is_directory(dir, ec) ? std::string()
                                                                  : "no folder " + dir.string() + " for " + text;
  },
  "FILE");

/// `message` without a leading `prefix` (an engine's error that already
/// names the command, printed after the command's own name).
inline std::string unprefixed(const std::string& message, const std::string& prefix) {
  return message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
}

/// `tandem eval`: speculative decoding of held-out prompts, τ and speedup.
void add_eval(CLI::App& app, int& exit_code);

/// --device of eval and generate: "cpu" → −1, "cuda" / "cuda:N" → N,
/// "auto" → 0 when a GPU is present; anything else throws gpu::error(bad_input).
int32_t parse_device(const std::string& s);

/// The prompts file of `tandem prepare --prompts-out` (tandem.prompts.v1):
/// each prompt's token ids into `prompts`, the tokenizer's stop ids into
/// `stop_ids`.  Throws gpu::error(bad_input) naming the file and line.
void read_prompt_file(const std::string& file, std::vector<std::vector<int64_t>>& prompts,
                      std::vector<int64_t>& stop_ids);

/// Adds the EOS ids of `target`/generation_config.json (one or a list) to
/// `stop_ids`, unless already there.
void add_generation_eos(const std::string& target, std::vector<int64_t>& stop_ids);

/// `tandem generate`: target-only batched decoding (prepare --regenerate).
void add_generate(CLI::App& app, int& exit_code);

/// `tandem export`: a drafter checkpoint → the z-lab DFlash layout.
void add_export(CLI::App& app, int& exit_code);

/// `tandem run CONFIG.toml`: single-node training.
void add_run(CLI::App& app, int& exit_code);

/// `tandem node --join HOST:PORT --name NAME`: a cluster member.
void add_node(CLI::App& app, int& exit_code);

/// This build's hello strings (messages/node.hpp, hello_fields) for node
/// `name` with its join token and `gpus` CUDA devices (0: the CPU).
std::vector<std::string> build_hello(const std::string& name, const std::string& token, int32_t gpus);

/// An actor system config for a cluster process (leader or member): the
/// message types, CAF's middleman with heartbeats every `heartbeat_s` and
/// connections dropped after `timeout_s` of silence, and the wire
/// protocol's application identifier.
/// With `certs` (a node folder of `tandem certs`: cert.pem, key.pem,
/// ca.pem), CAF's OpenSSL layer too: every connection is TLS with that
/// certificate, and the peer's must be the same CA's.  Throws
/// std::runtime_error naming a missing file.
void configure_cluster_system(caf::actor_system_config& cfg, double heartbeat_s, double timeout_s,
                              const std::string& certs = "");

/// The leader's door published on HOST:PORT (TLS with the system's
/// OpenSSL layer when `tls`), and a member's connection to it.
caf::expected<uint16_t> publish_door(caf::actor_system& sys, const caf::actor& door, uint16_t port,
                                     const std::string& host, bool tls);
caf::expected<caf::actor> connect_to(caf::actor_system& sys, const std::string& host, uint16_t port, bool tls);

/// `tandem shell RUN_DIR|HOST:PORT`: the inspection shell (the control endpoint).
void add_shell(CLI::App& app, int& exit_code);

/// `tandem certs DIR --nodes a,b`: a cluster's CA, secret, node certificates
/// and join tokens (OpenSSL).
void add_certs(CLI::App& app, int& exit_code);

/// On SIGSEGV, SIGBUS, SIGFPE, SIGILL or SIGABRT, writes "<who>: fatal
/// signal …" and the stack to stderr, then dies of the signal as before (a
/// parent that restarts the process still sees it).  tools/tandem/crash.cpp.
void report_crashes(const char* who);

} // namespace tandem::cli
