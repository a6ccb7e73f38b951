// `tandem run CONFIG.toml`: single-node training.  Loads the config,
// places the actors on this host's GPUs (or the CPU), spawns them, runs the
// coordinator until max_steps / the last epoch / a signal, and shuts down
// in order.  `--resume` continues from the newest checkpoint.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/run_config.hpp"
#include "actors/runtime.hpp"
#include "commands.hpp"
#include "gpu/data/dataset.hpp"
#include "gpu/engine/drafter_engine.hpp"
#include "gpu/nccl/communicator.hpp"
#include "gpu/device/runtime.hpp"
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
};

std::filesystem::path newest_checkpoint(const std::filesystem::path& dir) {
  std::filesystem::path best;
  if (!std::filesystem::exists(dir))
    return best;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().rfind("step-", 0) == 0
        && e.path().extension() != ".tmp" && (best.empty() || e.path().filename() > best.filename()))
      best = e.path();
  return best;
}

int run_training(const run_options& ro) {
  auto cfg = load_run_config(ro.config, ro.overrides);
  for (const auto& f : ro.faults)
    cfg.faults.push_back(parse_fault(f));
  const auto rt = gpu::query_runtime();
  const auto plan = resolve_placement(cfg, static_cast<int32_t>(rt.devices.size()));
  std::filesystem::create_directories(cfg.run.output_dir);
  {
    std::ofstream f(cfg.run.output_dir / "config.toml");
    f << to_toml(cfg);
  }
  std::fprintf(stderr, "tandem run: %s\n%s", ro.config.c_str(), plan.describe().c_str());

  check_paths(cfg, cfg.data.sources.empty());
  if (!cfg.data.sources.empty()) {
    // Prepare data.sources into data.path, or reuse what an earlier run
    // prepared from the same files, tokenizer and options.
    std::vector<std::string> args{"--tokenizer", cfg.data.tokenizer.string(), "--output",
                                  cfg.data.path.string(), "--reuse", "--block-size",
                                  std::to_string(cfg.drafter.block_size), "--max-length",
                                  std::to_string(std::max<int64_t>(3072, cfg.data.seq_len))};
    if (!cfg.metrics.progress)
      args.push_back("--quiet");
    for (const auto& src : cfg.data.sources)
      args.push_back(src.string());
    std::fprintf(stderr, "tandem run: preparing data.sources into %s\n", cfg.data.path.c_str());
    int rc = run_prepare(args);
    if (rc != 0) {
      std::fprintf(stderr, "tandem run: preparing data.sources (%s) failed with exit status %d\n",
                   ro.config.c_str(), rc);
      return rc == 2 ? 2 : 1;
    }
  }
  gpu::data::dataset ds(cfg.data.path);
  const auto ckpt_dir = cfg.run.output_dir / cfg.checkpoint.dir;
  coordinator_options co;
  co.num_samples = ds.num_samples();
  co.credits = cfg.runtime.credits;
  co.max_steps = cfg.train.max_steps;
  co.epochs = cfg.data.epochs;
  co.checkpoint_every = cfg.checkpoint.every_steps;
  supervisor_options so;
  so.restart_budget = cfg.supervision.restart_budget;
  so.backoff_s = cfg.supervision.backoff_s;
  so.window_s = cfg.supervision.window_s;
  co.step_timeout_s = cfg.runtime.step_timeout_s;
  co.heartbeat_s = cfg.runtime.heartbeat_s;
  co.group_timeout_s = cfg.runtime.group_timeout_s;
  co.abort_group = [](const std::vector<uint8_t>& id, const std::string& why) {
    if (const auto n = gpu::nccl::abort_group(id, why))
      spdlog::warn("aborted {} communicator(s) of the broken data-parallel group: {}", n, why);
  };
  std::string restore_from;
  if (ro.resume) {
    auto last = newest_checkpoint(ckpt_dir);
    if (last.empty()) {
      std::fprintf(stderr, "tandem run --resume: no checkpoint in %s\n", ckpt_dir.c_str());
      return 2;
    }
    auto extra = nlohmann::json::parse(gpu::read_checkpoint_extra(last));
    co.resume_ledger = extra.at("ledger").dump();
    co.resume_step = extra.at("step").get<int64_t>();
    restore_from = last.string();
    co.resume_checkpoint = restore_from;
    std::fprintf(stderr, "resuming from %s (step %lld)\n", last.c_str(),
                 static_cast<long long>(co.resume_step));
  }
  // The learning-rate schedule spans the epochs (estimated from the data:
  // one packed batch per step at ~90% fill); max_steps only stops earlier,
  // so a run stopped at step k and resumed follows the same schedule.
  const double tokens_per_batch = static_cast<double>(cfg.data.rows * cfg.data.seq_len) * 0.9;
  const int64_t total_steps = static_cast<int64_t>(static_cast<double>(ds.num_tokens())
                                                   * static_cast<double>(cfg.data.epochs)
                                                   / tokens_per_batch) + 1;

  caf::actor_system_config sys_cfg;
  register_messages(sys_cfg);
  caf::actor_system sys{sys_cfg};
  metrics_options mo;
  mo.jsonl = cfg.metrics.jsonl.empty() ? std::filesystem::path() : cfg.run.output_dir / cfg.metrics.jsonl;
  mo.progress = cfg.metrics.progress;
  mo.every_s = cfg.metrics.every_s;
  mo.total_steps = cfg.train.max_steps > 0 ? std::min(cfg.train.max_steps, total_steps) : total_steps;
  mo.log_every = cfg.train.log_every;
  coordinator_peers peers;
  peers.metrics = spawn_metrics(sys, mo);
  peers.checkpointer = spawn_checkpointer(sys, ckpt_dir, cfg.checkpoint.keep);
  auto faults = std::make_shared<fault_plan>();
  faults->hang_s = 2 * cfg.runtime.step_timeout_s + 1;
  for (const auto& f : cfg.faults) {
    auto e = std::make_unique<fault_plan::entry>();
    e->drafter = static_cast<int32_t>(f.drafter);
    e->kind = f.kind;
    e->at_step = f.at_step;
    faults->entries.push_back(std::move(e));
  }
  // Drafter options per index, for the first spawn and every restart.
  auto drafter_opts = std::make_shared<std::vector<gpu::drafter_engine_options>>();
  auto coordinator_handle = std::make_shared<coordinator_actor>();
  so.respawn_drafter = [&sys, drafter_opts, coordinator_handle, faults](int32_t index,
                                                                         const std::string& from) {
    return spawn_drafter(sys, index, (*drafter_opts)[static_cast<size_t>(index)], from,
                         *coordinator_handle, faults);
  };
  auto supervisor = spawn_supervisor(sys, so);
  co.supervisor = supervisor;
  auto coordinator = spawn_coordinator(sys, co);
  *coordinator_handle = coordinator;
  const auto world = static_cast<int32_t>(plan.targets.size());
  for (const auto& t : plan.targets) {
    gpu::prefetch_engine_options po;
    po.dataset = cfg.data.path;
    po.device = t.device;
    po.rows = cfg.data.rows;
    po.seq_len = cfg.data.seq_len;
    po.max_docs = cfg.data.max_docs;
    po.lookahead = cfg.data.lookahead;
    po.seed = cfg.data.seed;
    po.rank = t.index;
    po.world = world;
    peers.prefetch.push_back(spawn_prefetch(sys, t.index, po, coordinator));
    gpu::target_engine_options to;
    to.dir = cfg.model.target;
    to.device = t.device;
    to.dtype = cfg.model.dtype;
    to.tap_ids = cfg.model.tap_layers;
    peers.targets.push_back(spawn_target(sys, t.index, to, coordinator));
  }
  for (const auto& d : plan.drafters) {
    gpu::drafter_engine_options o;
    o.target_dir = cfg.model.target;
    o.device = d.device;
    o.dtype = cfg.model.dtype;
    o.layers = cfg.drafter.layers;
    o.block_size = cfg.drafter.block_size;
    o.mask_token_id = cfg.drafter.mask_token_id;
    o.anchors = cfg.data.anchors;
    o.chunk_rows = cfg.train.chunk_rows;
    o.tap_ids = cfg.model.tap_layers;
    o.seed = cfg.drafter.seed + static_cast<uint64_t>(d.index);
    o.lr = cfg.train.lr;
    o.warmup_ratio = cfg.train.warmup_ratio;
    o.weight_decay = cfg.train.weight_decay;
    o.grad_clip = cfg.train.grad_clip;
    o.beta1 = cfg.train.beta1;
    o.beta2 = cfg.train.beta2;
    o.eps = cfg.train.eps;
    o.total_steps = total_steps;
    o.capture_graphs = cfg.runtime.capture_graphs;
    drafter_opts->push_back(o);
    peers.drafters.push_back(spawn_drafter(sys, d.index, o, restore_from, coordinator, faults));
  }

  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  caf::scoped_actor self{sys};
  auto all = peers;  // handles kept for the shutdown below
  // The launcher asks the coordinator to run and watches it and the
  // supervisor (which watches the workers, restarts drafters and escalates
  // the rest through the coordinator).  It reports to this thread by plain
  // messages, so this thread can keep polling for signals.
  auto reply_to = caf::actor_cast<caf::actor>(self);
  sys.spawn([reply_to, coordinator, supervisor, p = std::move(peers)](caf::event_based_actor* me) mutable
              -> caf::behavior {
    // No broken-promise error in CAF 0.17: a dead coordinator never answers.
    me->monitor(coordinator);
    me->monitor(supervisor);
    const auto coordinator_addr = caf::actor_cast<caf::actor_addr>(coordinator);
    me->set_down_handler([me, reply_to, coordinator_addr](caf::down_msg& m) {
      const bool coord = m.source == coordinator_addr;
      me->send(reply_to, make_error(errc::device_failure,
                                    std::string(coord ? "the coordinator" : "the supervisor")
                                      + " ended: " + me->system().render(m.reason)));
      me->quit();
    });
    me->request(coordinator, caf::infinite, run_atom::value, std::move(p))
      .then([me, reply_to](run_summary& s) { me->send(reply_to, s); me->quit(); },
            [me, reply_to](caf::error& e) { me->send(reply_to, e); me->quit(); });
    return {[me](shutdown_atom) { me->quit(); }};
  });
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
          std::fprintf(stderr, "\ntandem run: signal %d: finishing the step and writing a checkpoint\n",
                       stop_signal.load());
          self->send(coordinator, stop_atom::value);
        }
      });
  }
  // Shutdown order: the supervisor first (no restarts or escalations from
  // here on; it shuts the drafters' current incarnations down), producers,
  // then consumers, then bookkeeping.
  self->send(supervisor, shutdown_atom::value);
  for (auto& p : all.prefetch)
    self->send(p, shutdown_atom::value);
  for (auto& t : all.targets)
    self->send(t, shutdown_atom::value);
  for (auto& d : all.drafters)
    self->send(d, shutdown_atom::value);
  self->send(all.checkpointer, shutdown_atom::value);
  self->send(all.metrics, shutdown_atom::value);
  self->send(coordinator, shutdown_atom::value);
  return exit_code;
}

} // namespace

void add_run(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("run", "Train a drafter on this host (CPU or its GPUs) from a TOML config");
  auto opts = std::make_shared<run_options>();
  cmd->add_option("config", opts->config, "Run configuration (config/README.md)")
    ->required()->check(CLI::ExistingFile);
  cmd->add_flag("--resume", opts->resume, "Continue from the newest checkpoint of this run");
  cmd->add_option("--set", opts->overrides, "Override a field: section.key=value (repeatable)");
  cmd->add_option("--fault", opts->faults,
                  "Inject a fault: drafter=N,kind=throw|nan|hang,at_step=K (repeatable)");
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
