// The eval actor (messages/eval.hpp, config [eval]): real τ of the drafter
// during training.  Each snapshot the coordinator sends is decoded against
// the actor's own copy of the frozen target (gpu::eval_engine), one held-out
// prompt per message, so that the mailbox is served between prompts (a
// shutdown never waits for a whole evaluation).  Detached; its engine is
// built inside the behaviour, on its own thread, and the target's weights
// are loaded at the first evaluation.
#include <chrono>
#include <optional>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/default_handler.hpp"
#include "actors/spawn.hpp"
#include "actors/time.hpp"
#include "actors/vitals.hpp"
#include "messages/errors.hpp"

namespace tandem {

namespace {

struct eval_state {
  static inline const char* name = "tandem.eval";
  std::optional<gpu::eval_engine> engine;
  std::string broken;  ///< why the engine could not be built ("" = it was)
  std::string device;
  std::optional<caf::typed_response_promise<eval_event>> reply;
  eval_event result;
  clock_type::time_point started;
};

/// The answer to the evaluation in progress; `error` set when it failed.
void answer(eval_actor::stateful_pointer<eval_state> self, const std::string& error) {
  auto& s = self->state;
  auto& e = s.result;
  e.error = error;
  e.seconds = ms_since(s.started) / 1000.0;
  if (error.empty() && s.engine) {
    const auto r = s.engine->report();
    e.tau = r.tau;
    e.tau_prompt_mean = r.tau_prompt_mean;
    e.prompts = static_cast<int64_t>(r.prompts.size());
    e.cycles = r.cycles;
    e.new_tokens = r.new_tokens;
    e.tokens_per_s = r.spec_tokens_per_s;
    e.histogram = r.histogram;
    e.device = r.device;
  }
  if (s.reply) {
    s.reply->deliver(e);
    s.reply.reset();
  }
}

eval_actor::behavior_type eval_behavior(eval_actor::stateful_pointer<eval_state> self,
                                        gpu::eval_engine_options opts, bool own_thread) {
  install_default_handler(self, eval_state::name);
  auto meter = std::make_shared<vitals_meter>(self->system(), "eval", 0, own_thread);
  meter->figures = [self] {
    return std::vector<vitals_figure>{{"evaluating", self->state.reply ? 1.0 : 0.0}};
  };
  auto& s = self->state;
  s.device = opts.device < 0 ? "cpu" : "cuda:" + std::to_string(opts.device);
  try {
    s.engine.emplace(std::move(opts));
  } catch (const std::exception& e) {
    s.broken = e.what();
    spdlog::warn("eval: {} (real tau is not measured in this run)", s.broken);
  }
  return counted(meter, eval_actor::behavior_type{
    vitals_handler(self, meter),
    [self](const snapshot_desc& snap) -> caf::result<eval_event> {
      auto& s = self->state;
      s.result = eval_event{};
      s.result.step = snap.step;
      s.result.device = s.device;
      s.started = clock_type::now();
      if (s.reply) {  // one at a time (the coordinator waits for the answer)
        gpu::transport::release(snap.handle);
        s.result.error = "an evaluation is already in progress";
        return s.result;
      }
      if (!s.engine) {
        gpu::transport::release(snap.handle);
        s.result.error = s.broken;
        return s.result;
      }
      s.reply = self->make_response_promise<eval_event>();
      try {
        s.engine->begin(snap.handle);
      } catch (const std::exception& e) {
        gpu::transport::release(snap.handle);
        auto promise = *s.reply;
        answer(self, e.what());
        return promise;
      }
      gpu::transport::release(snap.handle);
      self->send(self, eval_next_atom::value);
      return *s.reply;
    },
    [self](eval_next_atom) {
      auto& s = self->state;
      if (!s.reply)
        return;
      try {
        if (s.engine->next()) {
          self->send(self, eval_next_atom::value);
          return;
        }
      } catch (const std::exception& e) {
        answer(self, e.what());
        return;
      }
      answer(self, "");
    },
    [self](shutdown_atom) { self->quit(); },
  });
}

} // namespace

template <caf::spawn_options Os>
eval_actor spawn_eval(caf::actor_system& sys, gpu::eval_engine_options opts) {
  return sys.spawn<Os>(eval_behavior, std::move(opts), Os == caf::detached);
}

// Production (detached) and the deterministic test scheduler (scheduled).
template eval_actor spawn_eval<caf::detached>(caf::actor_system&, gpu::eval_engine_options);
template eval_actor spawn_eval<caf::no_spawn_options>(caf::actor_system&, gpu::eval_engine_options);

} // namespace tandem
