// The prefetch actor (messages/prefetch.hpp), one per target GPU: reads and
// packs the shards, stages batches into its device and sends them to the
// coordinator while credit lasts.  Detached; its engine is built inside the
// behaviour, on its own thread.
#include <memory>
#include <optional>
#include <unordered_set>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/default_handler.hpp"
#include "actors/spawn.hpp"
#include "actors/time.hpp"
#include "actors/vitals.hpp"
#include "gpu/device/error.hpp"
#include "messages/errors.hpp"

namespace tandem {

namespace {

struct prefetch_state {
  static inline const char* name = "tandem.prefetch";
  int32_t index = 0;
  std::optional<gpu::prefetch_engine> engine;
  coordinator_actor coordinator;
  int32_t device = -1;
  int32_t credit = 0;
  int64_t epoch = -1;
  int64_t generation = -1;
  bool exhausted = true;
  // Vitals figures: this epoch's cursor and the throughput since the first batch.
  int64_t epoch_sent = 0;       ///< samples sent in this epoch (re-issued ones too)
  int64_t reissued = 0;         ///< samples asked again after a rollback, this epoch
  int64_t batches = 0, samples = 0, real_tokens = 0, batch_tokens = 0;
  std::optional<clock_type::time_point> first_batch;
  std::shared_ptr<fault_plan> faults;  ///< injected faults (tests)
};

prefetch_actor::behavior_type prefetch_behavior(prefetch_actor::stateful_pointer<prefetch_state> self,
                                                int32_t index, gpu::prefetch_engine_options opts,
                                                coordinator_actor coordinator, std::shared_ptr<fault_plan> faults,
                                                bool own_thread) {
  install_default_handler(self, prefetch_state::name);
  auto meter = std::make_shared<vitals_meter>(self->system(), "prefetch", index, own_thread);
  meter->figures = [self] {
    auto& s = self->state;
    const double secs = s.first_batch ? std::chrono::duration<double>(clock_type::now() - *s.first_batch).count() : 0;
    const auto rate = [&](int64_t n) { return secs > 0 ? static_cast<double>(n) / secs : 0.0; };
    return std::vector<vitals_figure>{
      {"epoch", static_cast<double>(s.epoch)},
      {"epoch_samples", s.engine ? static_cast<double>(s.engine->epoch_samples()) : 0.0},
      {"epoch_sent", static_cast<double>(s.epoch_sent)},
      {"reissued", static_cast<double>(s.reissued)},
      {"credit", static_cast<double>(s.credit)},
      {"batches", static_cast<double>(s.batches)},
      {"samples_per_s", rate(s.samples)},
      {"tokens_per_s", rate(s.real_tokens)},
      {"padding_waste", s.batch_tokens > 0
                          ? 1.0 - static_cast<double>(s.real_tokens) / static_cast<double>(s.batch_tokens)
                          : 0.0}};
  };
  auto& st = self->state;
  st.index = index;
  st.coordinator = coordinator;
  st.device = opts.device;
  st.faults = std::move(faults);
  try {
    st.engine.emplace(opts);  // on this actor's own thread
  } catch (const gpu::error& e) {
    // bad_input: the data set does not open, or is not the target's.
    self->quit(make_error(e.code(), std::string("prefetch ") + std::to_string(index) + ": " + e.what()));
  } catch (const std::exception& e) {
    self->quit(make_error(errc::device_failure, std::string("prefetch ") + std::to_string(index) + ": " + e.what()));
  }
  if (!st.engine) {
    return {[](shutdown_atom) {}, [](epoch_atom, int64_t, int64_t, const std::vector<int64_t>&) {},
            [](credit_atom, int32_t) {}, [](reissue_atom, const std::vector<int64_t>&) {},
            [](release_atom, uint64_t) {}, vitals_handler(self, meter)};
  }
  for (const auto& w : st.engine->warnings())
    spdlog::warn("prefetch {}: {}", index, w);
  // Packs and sends batches while credit lasts.  A shard that fails its
  // verification (gpu::error(bad_input): a changed byte, a token past the
  // vocabulary) ends this actor with that error before any of its batches
  // is sent; the supervisor stops the run (a bad input is not retried: the
  // same bytes would fail again).  Any other failure is restarted.
  auto pump = [self] {
    auto& s = self->state;
    while (s.credit > 0 && !s.exhausted) {
      std::optional<gpu::staged_batch> b;
      try {
        if (s.faults)
          if (auto kind = s.faults->take("prefetch", s.index, s.batches + 1); !kind.empty())
            fault_plan::fire("prefetch", s.index, kind);
        b = s.engine->next();
      } catch (const gpu::error& e) {
        self->quit(make_error(e.code(), "prefetch " + std::to_string(s.index) + ": " + e.what()));
        return;
      } catch (const std::exception& e) {
        self->quit(make_error(errc::device_failure, "prefetch " + std::to_string(s.index) + ": " + e.what()));
        return;
      }
      if (!b) {
        s.exhausted = true;
        self->send(s.coordinator, exhausted_atom::value, s.index, s.epoch, s.generation);
        break;
      }
      batch_desc d;
      d.epoch = s.epoch;
      d.generation = s.generation;
      d.source = s.index;
      d.sample_ids = std::move(b->sample_ids);
      d.rows = b->rows;
      d.seq_len = b->seq_len;
      d.real_tokens = b->real_tokens;
      d.where.device = s.device;
      d.handle = b->handle;
      --s.credit;
      if (!s.first_batch)
        s.first_batch = clock_type::now();
      ++s.batches;
      s.samples += static_cast<int64_t>(d.sample_ids.size());
      s.epoch_sent += static_cast<int64_t>(d.sample_ids.size());
      s.real_tokens += d.real_tokens;
      s.batch_tokens += d.rows * d.seq_len;
      self->send(s.coordinator, std::move(d));
    }
  };
  return counted(meter, prefetch_actor::behavior_type{
    vitals_handler(self, meter),
    [self, pump](epoch_atom, int64_t epoch, int64_t generation, const std::vector<int64_t>& done) {
      auto& s = self->state;
      s.epoch = epoch;
      s.epoch_sent = 0;
      s.reissued = 0;
      s.generation = generation;
      try {
        s.engine->start_epoch(epoch, std::unordered_set<int64_t>(done.begin(), done.end()));
      } catch (const gpu::error& e) {
        self->quit(make_error(e.code(), "prefetch " + std::to_string(s.index) + ": " + e.what()));
        return;
      }
      s.exhausted = false;
      pump();
    },
    [self, pump](credit_atom, int32_t n) {
      self->state.credit += n;
      pump();
    },
    [self, pump](reissue_atom, const std::vector<int64_t>& ids) {
      auto& s = self->state;
      s.engine->reissue(ids);
      s.reissued += static_cast<int64_t>(ids.size());
      if (s.exhausted) {  // the epoch ran out here, but these must still go
        s.exhausted = false;
      }
      pump();
    },
    [self](release_atom, uint64_t handle) { self->state.engine->release(handle); },
    [self](shutdown_atom) { self->quit(); },
  });
}

} // namespace

template <caf::spawn_options Os>
prefetch_actor spawn_prefetch(caf::actor_system& sys, int32_t index, gpu::prefetch_engine_options opts,
                              coordinator_actor coordinator, std::shared_ptr<fault_plan> faults) {
  return sys.spawn<Os>(prefetch_behavior, index, std::move(opts), std::move(coordinator), std::move(faults),
                       Os == caf::detached);
}

// Production (detached) and the deterministic test scheduler (scheduled).
template prefetch_actor spawn_prefetch<caf::detached>(caf::actor_system&, int32_t, gpu::prefetch_engine_options,
                                                      coordinator_actor, std::shared_ptr<fault_plan>);
template prefetch_actor spawn_prefetch<caf::no_spawn_options>(caf::actor_system&, int32_t,
                                                              gpu::prefetch_engine_options, coordinator_actor,
                                                              std::shared_ptr<fault_plan>);

} // namespace tandem
