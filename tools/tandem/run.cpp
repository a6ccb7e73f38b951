// `tandem run CONFIG.toml`: single-node training.  Argument handling and
// the signal loop; the config becomes a launch plan (launch/plan.hpp), the
// plan an actor system (actors/system.hpp), which runs until max_steps, the
// last epoch or a signal.  `--resume` continues from the newest checkpoint.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/system.hpp"
#include "commands.hpp"
#include "gpu/data/dataset.hpp"
#include "gpu/engine/drafter_engine.hpp"
#include "gpu/device/runtime.hpp"
#include "launch/plan.hpp"
#include "launch/run_config.hpp"
#include "messages/errors.hpp"
#include "messages/registry.hpp"

namespace tandem::cli {

namespace {

std::atomic<int> stop_signal{0};

extern "C" void on_signal(int sig) {
  stop_signal.store(sig);
}

struct run_options {
  std::string config;
  bool resume = false;
  std::vector<std::string> overrides;
  std::vector<std::string> faults;
  bool force = false;
};

/// Refuses a run whose checkpoint folder cannot hold checkpoint.keep + 1
/// checkpoints of this drafter (the newest `keep` and the one being written
/// beside them), counting the space the run's existing checkpoints take;
/// --force runs anyway.  Returns the exit status (0: go on).
int check_checkpoint_space(const launch_plan& plan, bool force) {
  const auto& dir = plan.checkpointer.dir;
  const auto params = gpu::drafter_engine::parameter_count(plan.drafters.front());
  const auto one = gpu::checkpoint_bytes(params);
  const auto need = one * static_cast<uint64_t>(plan.checkpointer.keep + 1);
  uint64_t have = gpu::available_bytes(dir);
  if (have == UINT64_MAX)
    return 0;
  for (const auto& c : gpu::list_checkpoints(dir))
    have += gpu::folder_bytes(c);  // replaced as the run rotates
  if (have >= need)
    return 0;
  std::fprintf(stderr,
               "tandem run: %s: %s checkpoint.dir %s holds %s (free plus this run's existing checkpoints), "
               "but checkpoint.keep + 1 = %d checkpoints of this drafter (%lld parameters: %s each) need %s%s\n",
               force ? "warning" : "not enough disk space", force ? "(--force)" : "", dir.c_str(),
               gpu::human_bytes(have).c_str(), plan.checkpointer.keep + 1, static_cast<long long>(params),
               gpu::human_bytes(one).c_str(), gpu::human_bytes(need).c_str(),
               force ? "; a checkpoint that does not fit stops the run" 
                     : ". Free space, lower checkpoint.keep, set checkpoint.dir to a larger disk, or pass --force");
  return force ? 0 : 2;
}

int run_training(const run_options& ro) {
  auto cfg = load_run_config(ro.config, ro.overrides);
  for (const auto& f : ro.faults)
    cfg.faults.push_back(parse_fault(f));
  const auto devices = inventory::this_host(static_cast<int32_t>(gpu::query_runtime().devices.size()));
  // Placement first (before any data is prepared): a config that cannot be
  // placed on this host stops here.
  const auto placement = resolve_placement(cfg, devices.nodes.front().gpus);
  std::filesystem::create_directories(cfg.run.output_dir);
  {
    std::ofstream f(cfg.run.output_dir / "config.toml");
    f << to_toml(cfg);
  }
  std::fprintf(stderr, "tandem run: %s (run '%s')\n%s", ro.config.c_str(), cfg.run.name.c_str(),
               placement.describe().c_str());

  check_paths(cfg, cfg.data.sources.empty());
  if (const auto args = prepare_arguments(cfg); !args.empty()) {
    std::fprintf(stderr, "tandem run: preparing data.sources into %s\n", cfg.data.path.c_str());
    int rc = run_prepare(args);
    if (rc != 0) {
      std::fprintf(stderr, "tandem run: preparing data.sources (%s) failed with exit status %d\n",
                   ro.config.c_str(), rc);
      return rc == 2 ? 2 : 1;
    }
  }
  gpu::data::dataset ds(cfg.data.path);
  std::optional<resume_point> resume;
  if (ro.resume) {
    const auto ckpt_dir = cfg.checkpoint_dir();
    const auto found = gpu::find_resume_checkpoint(ckpt_dir);
    for (const auto& w : found.warnings)
      std::fprintf(stderr, "tandem run --resume: warning: %s\n", w.c_str());
    if (found.dir.empty()) {
      std::fprintf(stderr, "tandem run --resume: no complete checkpoint in %s\n", ckpt_dir.c_str());
      return 2;
    }
    auto extra = nlohmann::json::parse(gpu::read_checkpoint_extra(found.dir));
    resume = resume_point{found.dir.string(), extra.at("step").get<int64_t>(), extra.at("ledger").dump()};
    std::fprintf(stderr, "resuming from %s (step %lld)\n", found.dir.c_str(),
                 static_cast<long long>(resume->step));
  }
  const auto plan = make_plan(cfg, devices, {ds.num_samples(), ds.num_tokens()}, resume);
  if (int rc = check_checkpoint_space(plan, ro.force); rc != 0)
    return rc;

  caf::actor_system_config sys_cfg;
  register_messages(sys_cfg);
  caf::actor_system sys{sys_cfg};
  const auto run = spawn_system(sys, plan);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  caf::scoped_actor self{sys};
  start_run(sys, run, caf::actor_cast<caf::actor>(self));
  int exit_code = 0;
  bool done = false;
  bool stop_sent = false;
  while (!done) {
    self->receive(
      [&](const run_summary& s) {
        done = true;
        std::fprintf(stderr,
                     "tandem run: %s after %lld steps (%lld epochs complete); loss %.4f -> %.4f; "
                     "checkpoint %s\n",
                     s.stop_reason.c_str(), static_cast<long long>(s.steps),
                     static_cast<long long>(s.epochs_completed), s.first_loss, s.last_loss,
                     s.checkpoint.empty() ? "(none)" : s.checkpoint.c_str());
      },
      [&](const caf::error& err) {
        done = true;
        exit_code = 1;
        std::fprintf(stderr, "tandem run failed: %s\n", sys.render(err).c_str());
      },
      caf::after(std::chrono::milliseconds(200)) >> [&] {
        if (stop_signal.load() != 0 && !stop_sent) {
          stop_sent = true;
          std::fprintf(stderr, plan.checkpoint_on_signal
                                 ? "\ntandem run: signal %d: finishing the step and writing a checkpoint\n"
                                 : "\ntandem run: signal %d: finishing the step (checkpoint.on_signal = "
                                   "false: no checkpoint)\n",
                       stop_signal.load());
          request_stop(run);
        }
      });
  }
  shutdown_system(run);
  return exit_code;
}

} // namespace

void add_run(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("run", "Train a drafter on this host (CPU or its GPUs) from a TOML config");
  auto opts = std::make_shared<run_options>();
  cmd->add_option("config", opts->config, "Run configuration (config/README.md)")
    ->required()->check(CLI::ExistingFile);
  cmd->add_flag("--resume", opts->resume,
                "Continue from the newest complete checkpoint of this run (each one is verified; a corrupt "
                "one is moved aside as <name>.corrupt and the previous one is used, with a warning)");
  cmd->add_flag("--force", opts->force,
                "Start even when checkpoint.dir's disk cannot hold checkpoint.keep + 1 checkpoints");
  cmd->add_option("--set", opts->overrides, "Override a field: section.key=value (repeatable)");
  cmd->add_option("--fault", opts->faults,
                  "Inject a fault: drafter=N,kind=throw|nan|hang|slow_snapshot|throw_in_snapshot,at_step=K (repeatable)");
  cmd->callback([opts, &exit_code] {
    try {
      exit_code = run_training(*opts);
    } catch (const config_error& e) {
      std::fprintf(stderr, "tandem run: %s\n", e.what());
      exit_code = 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem run: %s\n", e.what());
      exit_code = 1;
    }
  });
}

} // namespace tandem::cli
