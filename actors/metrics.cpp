// The metrics actor: a JSON line per logged step and per event, and a
// terminal progress line (step, loss, accuracy, tokens/s, data wait, ETA).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>

#include <unistd.h>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/runtime.hpp"

namespace tandem {

namespace {

using clock_type = std::chrono::steady_clock;

struct metrics_state {
  static inline const char* name = "tandem.metrics";
  metrics_options opts;
  std::ofstream jsonl;
  clock_type::time_point start = clock_type::now();
  clock_type::time_point last_progress{};
  // Running sums since the last progress line.
  double loss_sum = 0, acc_sum = 0, wait_ms = 0, busy_ms = 0;
  int64_t steps = 0, tokens = 0, last_step = 0;
  std::set<int32_t> drafters;  ///< reporting since the last progress line (data-parallel: several)
  double ema_loss = std::nan("");
  int64_t first_step = -1;     ///< the step before this process's first report (a resume starts late)
  bool tty = false;
};

void write_line(metrics_state& s, const nlohmann::json& j) {
  if (s.jsonl.is_open()) {
    s.jsonl << j.dump() << '\n';
    s.jsonl.flush();
  }
}

} // namespace

metrics_actor spawn_metrics(caf::actor_system& sys, metrics_options opts) {
  auto behavior = [](metrics_actor::stateful_pointer<metrics_state> self,
                     metrics_options o) -> metrics_actor::behavior_type {
    auto& s = self->state;
    s.opts = std::move(o);
    s.tty = isatty(fileno(stderr)) != 0;
    if (!s.opts.jsonl.empty()) {
      std::filesystem::create_directories(s.opts.jsonl.parent_path());
      s.jsonl.open(s.opts.jsonl, std::ios::app);
    }
    return {
      [self](const step_report& r) {
        auto& s = self->state;
        const double elapsed = std::chrono::duration<double>(clock_type::now() - s.start).count();
        s.ema_loss = std::isnan(s.ema_loss) ? r.loss : 0.9 * s.ema_loss + 0.1 * r.loss;
        s.loss_sum += r.loss;
        s.acc_sum += r.accuracy;
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
                         {"accuracy", r.accuracy},   {"grad_norm", r.grad_norm},
                         {"lr", r.lr},               {"scored_tokens", r.scored_tokens},
                         {"tokens", r.real_tokens},  {"finite", r.finite},
                         {"compute_ms", r.compute_ms}, {"wait_ms", r.wait_ms},
                         {"tflop", r.tflop}});
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
          std::fprintf(stderr, "%sstep %lld%s  loss %.4f (avg %.4f)  acc %.3f  %.0f tok/s  data wait %.1f%%  ETA %s%s",
                       s.tty ? "\r" : "", static_cast<long long>(r.step),
                       s.opts.total_steps > 0 ? ("/" + std::to_string(s.opts.total_steps)).c_str() : "",
                       s.ema_loss, s.loss_sum / s.steps, s.acc_sum / s.steps, tok_s,
                       100.0 * wait_share, eta.c_str(), s.tty ? "   " : "\n");
          std::fflush(stderr);
          s.last_progress = clock_type::now();
          s.loss_sum = s.acc_sum = s.wait_ms = s.busy_ms = 0;
          s.steps = s.tokens = 0;
          s.drafters.clear();
        }
      },
      [self](event_atom, const std::string& json) {
        auto& s = self->state;
        auto j = nlohmann::json::parse(json, nullptr, false);
        if (j.is_discarded())
          j = {{"event", "text"}, {"text", json}};
        j["time_s"] = std::chrono::duration<double>(clock_type::now() - s.start).count();
        write_line(s, j);
        if (s.opts.progress && s.tty)
          std::fprintf(stderr, "\n");
        if (s.opts.progress)
          std::fprintf(stderr, "%s\n", j.dump().c_str());
      },
      [self](shutdown_atom) {
        if (self->state.opts.progress && self->state.tty)
          std::fprintf(stderr, "\n");
        self->quit();
      },
    };
  };
  return sys.spawn(behavior, std::move(opts));
}

} // namespace tandem
