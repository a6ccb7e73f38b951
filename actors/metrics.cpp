// The metrics actor: a JSON line per logged step and per event (the typed
// run_events' line schema is here, event_line), and a terminal progress line
// (step, recent and moving-average loss, accuracy, simulated acceptance, the
// last real τ, tokens/s, data wait, ETA).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <set>

#include <unistd.h>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/default_handler.hpp"
#include "actors/jsonl_log.hpp"
#include "actors/metrics_lines.hpp"
#include "actors/vitals.hpp"
#include "actors/spawn.hpp"
#include "actors/tensorboard/writer.hpp"

namespace tandem {

namespace {

/// One line's fields per kind; the names are the schema of metrics.jsonl
/// (messages/metrics.hpp): never rename one.
struct line_writer {
  using result_type = nlohmann::json;
  nlohmann::json operator()(const epoch_event& x) const {
    return {{"event", "epoch"}, {"epoch", x.epoch}, {"samples", x.samples},
            {"already_committed", x.already_committed}};
  }
  nlohmann::json operator()(const checkpoint_event& x) const {
    nlohmann::json j{{"event", "checkpoint"}, {"step", x.step}, {"dir", x.dir},
                     {"committed_now", x.committed_now}, {"committed", x.committed}};
    if (!x.node.empty())
      j["node"] = x.node;  // a cluster member's file system holds it
    return j;
  }
  nlohmann::json operator()(const checkpoint_discarded_event& x) const {
    return {{"event", "checkpoint_discarded"}, {"step", x.step}, {"dir", x.dir}};
  }
  nlohmann::json operator()(const group_formed_event& x) const {
    return {{"event", "group_formed"}, {"generation", x.generation}, {"world", x.world},
            {"root", x.root}, {"step", x.step}};
  }
  nlohmann::json operator()(const group_step_abandoned_event& x) const {
    return {{"event", "group_step_abandoned"}, {"drafter", x.drafter}};
  }
  nlohmann::json operator()(const drafter_failed_event& x) const {
    return {{"event", "drafter_failed"},    {"drafter", x.drafter},
            {"reason", x.reason},           {"restore_step", x.restore_step},
            {"steps_lost", x.steps_lost},   {"restore_from", x.restore_from},
            {"samples_reissued", x.samples_reissued}, {"checkpoint", x.checkpoint},
            {"restart", x.restart},         {"budget", x.budget},
            {"backoff_s", x.backoff_s}};
  }
  nlohmann::json operator()(const budget_exhausted_event& x) const {
    return {{"event", "budget_exhausted"}, {"drafter", x.drafter}, {"report", x.report}};
  }
  nlohmann::json operator()(const drafter_restarted_event& x) const {
    return {{"event", "drafter_restarted"}, {"drafter", x.drafter}, {"step", x.step}, {"from", x.from}};
  }
  nlohmann::json operator()(const actor_failed_event& x) const {
    return {{"event", "actor_failed"}, {"role", x.role},       {"index", x.index},
            {"reason", x.reason},      {"step", x.step},       {"restart", x.restart},
            {"budget", x.budget},      {"backoff_s", x.backoff_s}};
  }
  nlohmann::json operator()(const actor_restarted_event& x) const {
    return {{"event", "actor_restarted"}, {"role", x.role}, {"index", x.index}, {"step", x.step}};
  }
  nlohmann::json operator()(const reissued_event& x) const {
    return {{"event", "reissued"}, {"step", x.step}, {"samples", x.samples}};
  }
  nlohmann::json operator()(const escalated_event& x) const {
    return {{"event", "escalated"}, {"reason", x.reason}, {"step", x.step}};
  }
  nlohmann::json operator()(const checkpoint_skipped_event& x) const {
    return {{"event", "checkpoint_skipped"}, {"step", x.step}, {"writing", x.writing}};
  }
  nlohmann::json operator()(const restore_point_event& x) const {
    nlohmann::json j{{"event", "restore_point"}, {"tier", x.tier}, {"step", x.step}, {"dir", x.dir}};
    if (!x.error.empty())
      j["error"] = x.error;
    return j;
  }
  nlohmann::json operator()(const eval_event& x) const {
    nlohmann::json j{{"event", "eval"},         {"step", x.step},
                     {"tau", x.tau},            {"tau_prompt_mean", x.tau_prompt_mean},
                     {"prompts", x.prompts},    {"cycles", x.cycles},
                     {"new_tokens", x.new_tokens}, {"tokens_per_s", x.tokens_per_s},
                     {"seconds", x.seconds},    {"device", x.device},
                     {"histogram", x.histogram}};
    if (!x.error.empty())
      j["error"] = x.error;
    return j;
  }
  nlohmann::json operator()(const control_event& x) const {
    nlohmann::json j{{"event", "control"}, {"action", x.action}, {"source", x.source}, {"step", x.step},
                     {"result", x.result}};
    if (!x.lr_from.empty()) {
      j["lr_schedule"] = nlohmann::json::array();
      for (size_t i = 0; i < x.lr_from.size() && i < x.lr_scale.size(); ++i)
        j["lr_schedule"].push_back({x.lr_from[i], x.lr_scale[i]});
    }
    return j;
  }
  nlohmann::json operator()(const resumed_event& x) const {
    return {{"event", "resumed"}, {"step", x.step}, {"from", x.from}, {"tier", x.tier},
            {"durable_step", x.durable_step}, {"unix_s", x.unix_s}};
  }
  nlohmann::json operator()(const worker_restarted_event& x) const {
    return {{"event", "worker_restarted"}, {"exit", x.exit}, {"restart", x.restart}, {"budget", x.budget},
            {"unix_s", x.unix_s}};
  }
  nlohmann::json operator()(const end_event& x) const {
    nlohmann::json j{{"event", "end"},     {"reason", x.reason},         {"steps", x.steps},
                     {"checkpoint", x.checkpoint}, {"durable_step", x.durable_step}};
    if (!x.error.empty())
      j["error"] = x.error;
    return j;
  }
};

} // namespace

nlohmann::json event_line(const run_event& e) {
  return caf::visit(line_writer{}, e);
}

namespace {

using clock_type = std::chrono::steady_clock;
constexpr double peak_tflops = 989.0;  ///< dense bf16 H100/H200: the MFU denominator (docs/bench.md)

struct metrics_state {
  static inline const char* name = "tandem.metrics";
  metrics_options opts;
  jsonl_log jsonl;              ///< metrics.jsonl (actors/jsonl_log.hpp: nothing lost to a full disk it can keep)
  bool jsonl_failing = false;   ///< its last write failed (said once until it recovers)
  clock_type::time_point start = clock_type::now();
  clock_type::time_point last_progress{};
  // Running sums since the last progress line.
  // Loss, accuracy and sim-accept average over the steps that scored tokens
  // (`scored`): a step whose rows hold no supervised position reports 0 for
  // all three, which is no measurement.
  double loss_sum = 0, acc_sum = 0, sim_sum = 0, wait_ms = 0, busy_ms = 0;
  int64_t steps = 0, scored = 0, tokens = 0, last_step = 0;
  int64_t unscored_total = 0;  ///< steps that scored no token, this process
  std::set<int32_t> drafters;  ///< reporting since the last progress line (data-parallel: several)
  double ema_loss = std::nan("");
  int64_t first_step = -1;     ///< the step before this process's first report (a resume starts late)
  bool tty = false;
  std::string tau;             ///< the last real τ ([eval]) for the progress line: " tau 2.31 (step 400)"
  control_actor feed;          ///< the control endpoint's actor, sent every report and event (or none)
  std::unique_ptr<tensorboard::writer> tb;  ///< metrics.tensorboard's event file (or none)
};

/// The scalars of a logged step in TensorBoard, under "drafterN/": the
/// fields of its metrics.jsonl line (names alike).
void tb_step(metrics_state& s, const step_report& r) {
  if (!s.tb)
    return;
  const std::string d = "drafter" + std::to_string(r.drafter) + "/";
  std::vector<std::pair<std::string, double>> v{
    {d + "grad_norm", r.grad_norm},
    {d + "lr", r.lr},
    {d + "tokens", static_cast<double>(r.real_tokens)},
    {d + "compute_ms", r.compute_ms},
    {d + "wait_ms", r.wait_ms},
    {d + "mfu", r.compute_ms > 0 ? r.tflop / (r.compute_ms / 1e3) / peak_tflops : 0.0}};
  if (r.scored_tokens > 0)  // else no measurement: left out of the curves
    v.insert(v.begin(), {{d + "loss", r.loss}, {d + "accuracy", r.accuracy}, {d + "sim_accept", r.sim_accept}});
  s.tb->scalars(r.step, v);
  s.tb->flush();
}

void write_line(metrics_state& s, nlohmann::json j) {
  if (!s.opts.run_name.empty())
    j["run"] = s.opts.run_name;  // run.name: which run a line belongs to, when logs are merged
  if (!s.jsonl.is_open())
    return;
  const bool ok = s.jsonl.append(j.dump());
  if (!ok && !s.jsonl_failing) {
    s.jsonl_failing = true;
    spdlog::error("metrics: cannot write {} ({}): its records wait in memory, in order, and are written once it "
                  "can (the run goes on; free space there)",
                  s.jsonl.path().string(), s.jsonl.trouble());
  } else if (ok && s.jsonl_failing) {
    s.jsonl_failing = false;
    spdlog::warn("metrics: {} is writable again: the records that waited are in it{}", s.jsonl.path().string(),
                 s.jsonl.dropped() > 0 ? " (the oldest " + std::to_string(s.jsonl.dropped())
                                           + " were dropped: too many waited)"
                                       : std::string());
  }
}

/// At the end: what still waits is tried once more, and said if it cannot be.
void close_jsonl(metrics_state& s) {
  if (!s.jsonl.is_open())
    return;
  if (!s.jsonl.flush())
    spdlog::error("metrics: {} records could not be written to {} ({}): they are lost; the checkpoints are not "
                  "affected",
                  s.jsonl.pending(), s.jsonl.path().string(), s.jsonl.trouble());
  s.jsonl.close();
}

/// An event's line: stamped with the time, written, and shown on stderr.
/// Replaces opts.lr_schedule with `schedule` ([[from, scale], ...]):
/// written beside, flushed, renamed over (a crash leaves the old or the new).
void keep_lr_schedule(metrics_state& s, const nlohmann::json& schedule) {
  if (s.opts.lr_schedule.empty())
    return;
  const auto tmp = s.opts.lr_schedule.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << nlohmann::json{{"lr_scale", schedule}}.dump() << "\n";
    out.flush();
    if (!out) {
      spdlog::warn("metrics: cannot write {}: a worker restart would not keep the learning-rate multiplier", tmp);
      return;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, s.opts.lr_schedule, ec);
  if (ec)
    spdlog::warn("metrics: cannot replace {}: {}", s.opts.lr_schedule.string(), ec.message());
}

void write_event(metrics_state& s, nlohmann::json j) {
  j["time_s"] = std::chrono::duration<double>(clock_type::now() - s.start).count();
  write_line(s, j);
  if (s.opts.progress && s.tty)
    std::fprintf(stderr, "\n");
  if (s.opts.progress)
    std::fprintf(stderr, "%s\n", j.dump().c_str());
}

} // namespace

metrics_actor spawn_metrics(caf::actor_system& sys, metrics_options opts, control_actor feed) {
  auto behavior = [](metrics_actor::stateful_pointer<metrics_state> self, metrics_options o,
                     control_actor f) -> metrics_actor::behavior_type {
    auto& s = self->state;
    install_default_handler(self, metrics_state::name);
    auto meter = std::make_shared<vitals_meter>(self->system(), "metrics", 0, false);
    meter->figures = [self] {
      return std::vector<vitals_figure>{{"step_reports", static_cast<double>(self->state.steps)}};
    };
    s.opts = std::move(o);
    s.feed = std::move(f);
    s.tty = isatty(fileno(stderr)) != 0;
    if (!s.opts.jsonl.empty()) {
      try {
        std::filesystem::create_directories(s.opts.jsonl.parent_path());
        s.jsonl.open(s.opts.jsonl);
        if (s.jsonl.repaired() > 0)
          spdlog::warn("metrics: {} ended in a torn line ({} bytes of a record a process did not finish "
                       "writing): cut, so that the records from here on parse",
                       s.opts.jsonl.string(), s.jsonl.repaired());
      } catch (const std::exception& e) {
        spdlog::error("metrics: {}: this run writes no metrics.jsonl", e.what());
      }
    }
    if (!s.opts.tensorboard.empty()) {
      // TensorBoard is a view: a folder it cannot write costs the view, not the run.
      try {
        s.tb = std::make_unique<tensorboard::writer>(s.opts.tensorboard);
      } catch (const std::exception& e) {
        spdlog::warn("metrics: {} (metrics.tensorboard): no TensorBoard files for this run", e.what());
      }
    }
    return counted(meter, metrics_actor::behavior_type{
      vitals_handler(self, meter),
      [self](const step_report& r) {
        auto& s = self->state;
        if (s.feed)
          self->send(s.feed, r);
        const double elapsed = std::chrono::duration<double>(clock_type::now() - s.start).count();
        if (r.scored_tokens > 0) {
          s.ema_loss = std::isnan(s.ema_loss) ? r.loss : 0.9 * s.ema_loss + 0.1 * r.loss;
          s.loss_sum += r.loss;
          s.acc_sum += r.accuracy;
          s.sim_sum += r.sim_accept;
          ++s.scored;
        } else if (const auto n = r.finite ? ++s.unscored_total : 0; n > 0 && (n & (n - 1)) == 0) {  // 1st, 2nd, 4th, ...
          nlohmann::json w{{"event", "warning"},
                           {"step", r.step},
                           {"drafter", r.drafter},
                           {"unscored_steps", s.unscored_total},
                           {"text", "step " + std::to_string(r.step) + " scored no token: its rows hold no "
                                      "supervised position a draft block can start at (is data.seq_len shorter "
                                      "than the prompts?); " + std::to_string(s.unscored_total)
                                      + " such step(s) so far, left out of the loss averages"}};
          spdlog::warn("metrics: {}", w["text"].get<std::string>());
          write_line(s, w);
        }
        s.wait_ms += r.wait_ms;
        s.busy_ms += r.compute_ms;
        s.tokens += r.real_tokens;
        s.drafters.insert(r.drafter);
        ++s.steps;
        s.last_step = r.step;
        if (s.first_step < 0)
          s.first_step = r.step - 1;
        if (s.opts.log_every > 0 && (r.step % s.opts.log_every == 0 || !r.finite))
          write_line(s, {{"event", "step"},          {"time_s", elapsed},
                         {"drafter", r.drafter},     {"step", r.step},
                         {"batch", r.batch_id},      {"loss", r.loss},
                         {"accuracy", r.accuracy},   {"sim_accept", r.sim_accept},
                         {"grad_norm", r.grad_norm},
                         {"lr", r.lr},               {"scored_tokens", r.scored_tokens},
                         {"tokens", r.real_tokens},  {"finite", r.finite},
                         {"compute_ms", r.compute_ms}, {"wait_ms", r.wait_ms},
                         {"tflop", r.tflop}});
        if (s.opts.log_every > 0 && (r.step % s.opts.log_every == 0 || !r.finite))
          tb_step(s, r);
        const double since = std::chrono::duration<double>(clock_type::now() - s.last_progress).count();
        if (s.opts.progress && since >= s.opts.every_s) {
          // The drafters run side by side: their summed time over their number
          // is the window, and the tokens of all of them went through in it.
          const double window_s = (s.wait_ms + s.busy_ms) / 1e3 / std::max<size_t>(1, s.drafters.size());
          const double tok_s = window_s > 0 ? s.tokens / window_s : 0;
          const double wait_share = (s.wait_ms + s.busy_ms) > 0 ? s.wait_ms / (s.wait_ms + s.busy_ms) : 0;
          std::string eta = "?";
          if (s.opts.total_steps > 0 && r.step > s.first_step) {
            // Time per step of this process (a resumed run did its first steps earlier).
            const double per_step = elapsed / static_cast<double>(r.step - s.first_step);
            const auto left = static_cast<int64_t>(per_step * static_cast<double>(s.opts.total_steps - r.step));
            eta = std::to_string(left / 60) + "m" + std::to_string(left % 60) + "s";
          }
          // "recent": the mean over the reports since the last line (what
          // training does now); "ema": the slow moving average (0.9 decay,
          // seeded with the first loss, so it lags well behind early on).
          const double n = static_cast<double>(std::max<int64_t>(1, s.scored));
          const double nan = std::nan("");
          std::fprintf(stderr, "%s%sstep %lld%s  loss %.4f (recent), %.4f (ema)  acc %.3f  sim-accept %.2f%s  %.0f tok/s  data wait %.1f%%  ETA %s%s",
                       s.tty ? "\r" : "", s.opts.run_name.empty() ? "" : (s.opts.run_name + ": ").c_str(),
                       static_cast<long long>(r.step),
                       s.opts.total_steps > 0 ? ("/" + std::to_string(s.opts.total_steps)).c_str() : "",
                       s.scored ? s.loss_sum / n : nan, s.ema_loss, s.scored ? s.acc_sum / n : nan,
                       s.scored ? s.sim_sum / n : nan, s.tau.c_str(), tok_s,
                       100.0 * wait_share, eta.c_str(), s.tty ? "   " : "\n");
          std::fflush(stderr);
          s.last_progress = clock_type::now();
          s.loss_sum = s.acc_sum = s.sim_sum = s.wait_ms = s.busy_ms = 0;
          s.steps = s.scored = s.tokens = 0;
          s.drafters.clear();
        }
      },
      [self](log_every_atom, int64_t n) {
        if (n > 0)
          self->state.opts.log_every = n;
      },
      [self](const run_event& e) {
        if (const auto* c = caf::get_if<control_event>(&e); c && !c->lr_from.empty())
          keep_lr_schedule(self->state, event_line(e)["lr_schedule"]);
        if (const auto* ev = caf::get_if<eval_event>(&e); ev && ev->error.empty()) {
          char buf[64];
          std::snprintf(buf, sizeof buf, "  tau %.2f (step %lld)", ev->tau, static_cast<long long>(ev->step));
          self->state.tau = buf;
          if (self->state.tb) {
            self->state.tb->scalars(ev->step, {{"eval/tau", ev->tau},
                                               {"eval/tau_prompt_mean", ev->tau_prompt_mean},
                                               {"eval/tokens_per_s", ev->tokens_per_s}});
            self->state.tb->flush();
          }
        }
        if (self->state.feed)
          self->send(self->state.feed, e);
        write_event(self->state, event_line(e));
      },
      [self](event_atom, const std::string& json) {  // free-form: the file only (messages/metrics.hpp)
        auto j = nlohmann::json::parse(json, nullptr, false);
        if (j.is_discarded())
          j = {{"event", "text"}, {"text", json}};
        write_event(self->state, std::move(j));
      },
      [self](shutdown_atom) {
        if (self->state.opts.progress && self->state.tty)
          std::fprintf(stderr, "\n");
        close_jsonl(self->state);
        self->quit();
      },
    });
  };
  return sys.spawn(behavior, std::move(opts), std::move(feed));
}

} // namespace tandem
