// The detached, device-owning actors: prefetch, target, drafter, and the
// checkpointer (detached for its blocking file I/O).  Each keeps its engine
// in its state and builds it inside the behaviour, on its own thread.
#include <chrono>
#include <optional>
#include <thread>
#include <unordered_set>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/runtime.hpp"
#include "gpu/device/error.hpp"
#include "gpu/nccl/communicator.hpp"
#include "messages/errors.hpp"

namespace tandem {

namespace {

using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t).count();
}

/// Logs and answers anything a protocol does not know (STYLE habit 7).
template <class Self>
void install_default_handler(Self* self, const char* name) {
  self->set_default_handler([name](caf::scheduled_actor* me, caf::message_view& view)
                              -> caf::result<caf::message> {
    auto msg = view.copy_content_to_message();
    spdlog::error("{} (actor {}) cannot handle {}", name, me->id(), caf::to_string(msg));
    return make_error(errc::unexpected_message, std::string(name) + " cannot handle "
                                                  + caf::to_string(msg));
  });
}

// ------------------------------------------------------------------ prefetch

struct prefetch_state {
  static inline const char* name = "tandem.prefetch";
  int32_t index = 0;
  std::optional<gpu::prefetch_engine> engine;
  coordinator_actor coordinator;
  int32_t device = -1;
  int32_t credit = 0;
  int64_t epoch = -1;
  bool exhausted = true;
};

prefetch_actor::behavior_type prefetch_behavior(prefetch_actor::stateful_pointer<prefetch_state> self,
                                                int32_t index, gpu::prefetch_engine_options opts,
                                                coordinator_actor coordinator) {
  install_default_handler(self, prefetch_state::name);
  auto& st = self->state;
  st.index = index;
  st.coordinator = coordinator;
  st.device = opts.device;
  try {
    st.engine.emplace(opts);  // on this actor's own thread
  } catch (const std::exception& e) {
    self->quit(make_error(errc::bad_input, std::string("prefetch ") + std::to_string(index) + ": " + e.what()));
    return {[](shutdown_atom) {}, [](epoch_atom, int64_t, const std::vector<int64_t>&) {},
            [](credit_atom, int32_t) {}, [](reissue_atom, const std::vector<int64_t>&) {},
            [](release_atom, uint64_t) {}};
  }
  // Packs and sends batches while credit lasts.
  auto pump = [self] {
    auto& s = self->state;
    while (s.credit > 0 && !s.exhausted) {
      auto b = s.engine->next();
      if (!b) {
        s.exhausted = true;
        self->send(s.coordinator, exhausted_atom::value, s.index, s.epoch);
        break;
      }
      batch_desc d;
      d.epoch = s.epoch;
      d.source = s.index;
      d.sample_ids = std::move(b->sample_ids);
      d.rows = b->rows;
      d.seq_len = b->seq_len;
      d.real_tokens = b->real_tokens;
      d.where.device = s.device;
      d.handle = b->handle;
      --s.credit;
      self->send(s.coordinator, std::move(d));
    }
  };
  return {
    [self, pump](epoch_atom, int64_t epoch, const std::vector<int64_t>& done) {
      auto& s = self->state;
      s.epoch = epoch;
      s.engine->start_epoch(epoch, std::unordered_set<int64_t>(done.begin(), done.end()));
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
      if (s.exhausted) {  // the epoch ran out here, but these must still go
        s.exhausted = false;
      }
      pump();
    },
    [self](release_atom, uint64_t handle) { self->state.engine->release(handle); },
    [self](shutdown_atom) { self->quit(); },
  };
}

// -------------------------------------------------------------------- target

struct target_state {
  static inline const char* name = "tandem.target";
  int32_t index = 0;
  std::optional<gpu::target_engine> engine;
  coordinator_actor coordinator;
};

target_actor::behavior_type target_behavior(target_actor::stateful_pointer<target_state> self,
                                            int32_t index, gpu::target_engine_options opts,
                                            coordinator_actor coordinator) {
  install_default_handler(self, target_state::name);
  self->state.index = index;
  self->state.coordinator = coordinator;
  try {
    self->state.engine.emplace(opts);
  } catch (const std::exception& e) {
    self->quit(make_error(errc::bad_input, "target " + std::to_string(index) + ": " + e.what()));
    return {[](batch_desc&) {}, [](release_atom, uint64_t) {}, [](shutdown_atom) {}};
  }
  return {
    [self](batch_desc& batch) {
      auto& s = self->state;
      auto t0 = clock_type::now();
      work_item w;
      w.features.batch_id = batch.batch_id;
      w.features.target = s.index;
      try {
        w.features.handle = s.engine->forward(batch.handle);
      } catch (const std::exception& e) {
        self->quit(make_error(errc::device_failure, "target " + std::to_string(s.index)
                                                      + ", batch " + std::to_string(batch.batch_id)
                                                      + ": " + e.what()));
        return;
      }
      w.features.forward_ms = ms_since(t0);
      // The descriptor names what is behind the handle (descriptors.hpp):
      // the taps [rows, seq_len, n·D] on this target's device.
      const auto& info = s.engine->info();
      w.features.shape = {batch.rows, batch.seq_len,
                          static_cast<int64_t>(info.tap_ids.size()) * info.hidden_size};
      w.features.where.device = info.device;
      w.features.dtype = info.dtype;
      w.batch = std::move(batch);
      self->send(s.coordinator, std::move(w));
    },
    [self](release_atom, uint64_t handle) { gpu::transport::release(handle); },
    [self](shutdown_atom) { self->quit(); },
  };
}

// ------------------------------------------------------------------- drafter

struct drafter_state {
  static inline const char* name = "tandem.drafter";
  int32_t index = 0;
  std::optional<gpu::drafter_engine> engine;
  coordinator_actor coordinator;
  clock_type::time_point idle_since = clock_type::now();
  std::shared_ptr<fault_plan> faults;
};

/// Applies an injected fault due at `next_step`, if any (once per run).
void apply_faults(drafter_state& s, int64_t next_step) {
  if (!s.faults)
    return;
  for (auto& f : s.faults->entries) {
    if (f->drafter != s.index || f->at_step != next_step || f->fired.exchange(true))
      continue;
    spdlog::warn("drafter {}: injected fault '{}' at step {}", s.index, f->kind, next_step);
    if (f->kind == "throw")
      s.engine->inject(gpu::fault::throw_in_step);
    else if (f->kind == "nan")
      s.engine->inject(gpu::fault::nan_loss);
    else if (f->kind == "hang")
      std::this_thread::sleep_for(std::chrono::duration<double>(s.faults->hang_s));
  }
}

drafter_actor::behavior_type drafter_behavior(drafter_actor::stateful_pointer<drafter_state> self,
                                              int32_t index, gpu::drafter_engine_options opts,
                                              std::string restore_from,
                                              coordinator_actor coordinator,
                                              std::shared_ptr<fault_plan> faults) {
  install_default_handler(self, drafter_state::name);
  auto& st = self->state;
  st.index = index;
  st.coordinator = coordinator;
  st.faults = std::move(faults);
  try {
    st.engine.emplace(opts);
    if (!restore_from.empty())
      st.engine->restore(restore_from);
  } catch (const std::exception& e) {
    self->quit(make_error(errc::bad_input, "drafter " + std::to_string(index) + ": " + e.what()));
    return {[](const work_item&) {}, [](group_id_atom) { return std::vector<uint8_t>{}; },
            [](const group_spec&) { return int64_t{0}; }, [](snapshot_atom) { return snapshot_desc{}; },
            [](heartbeat_atom) { return int64_t{0}; }, [](shutdown_atom) {}};
  }
  st.idle_since = clock_type::now();
  return {
    [self](const work_item& w) {
      auto& s = self->state;
      const double wait = ms_since(s.idle_since);
      apply_faults(s, s.engine->step() + 1);
      // A failed step ends the actor with the reason; the coordinator
      // (its supervisor) restarts it from the newest checkpoint.
      gpu::step_result r;
      try {
        r = s.engine->train_step(w.batch.handle, w.features.handle, w.contribute);
      } catch (const gpu::error& e) {
        if (s.engine->group_broken()) {
          // The step's collective did not complete: a peer failed, not this
          // drafter.  Leave the group and wait for the next one; the
          // coordinator decides from the reported step whether these
          // weights are where training continues.
          spdlog::warn("drafter {}: step {}: {} (leaving the group)", s.index, s.engine->step() + 1, e.what());
          s.engine->leave_group(std::chrono::seconds(2));
          step_report rep;
          rep.drafter = s.index;
          // Where this drafter's state is: the update skipped (the step
          // before) or applied (the collective had completed).
          try {
            rep.step = s.engine->sync_step();
          } catch (const std::exception& x) {
            self->quit(make_error(errc::device_failure, "step " + std::to_string(s.engine->step() + 1)
                                                          + ": reading the update count after the group failed: "
                                                          + x.what()));
            return;
          }
          rep.batch_id = w.batch.batch_id;
          rep.finite = false;
          rep.contributed = w.contribute;
          rep.group_failed = true;
          s.idle_since = clock_type::now();
          self->send(s.coordinator, rep);
          return;
        }
        self->quit(make_error(e.code(), "step " + std::to_string(s.engine->step() + 1) + ": " + e.what()));
        return;
      } catch (const std::exception& e) {
        self->quit(make_error(errc::device_failure,
                              "step " + std::to_string(s.engine->step() + 1) + ": " + e.what()));
        return;
      }
      step_report rep;
      rep.drafter = s.index;
      rep.step = r.step;
      rep.batch_id = w.batch.batch_id;
      rep.loss = r.loss;
      rep.accuracy = r.accuracy;
      rep.grad_norm = r.grad_norm;
      rep.lr = r.lr;
      rep.scored_tokens = r.scored_tokens;
      rep.real_tokens = w.batch.real_tokens;
      rep.finite = r.finite;
      rep.compute_ms = r.compute_ms;
      rep.tflop = r.tflop;
      rep.wait_ms = wait;
      rep.contributed = w.contribute;
      s.idle_since = clock_type::now();
      self->send(s.coordinator, rep);
    },
    [self](group_id_atom) -> caf::result<std::vector<uint8_t>> {
      try {
        return gpu::nccl::new_unique_id();
      } catch (const gpu::error& e) {
        return make_error(e.code(), "drafter " + std::to_string(self->state.index) + ": " + e.what());
      }
    },
    [self](const group_spec& g) -> caf::result<int64_t> {
      auto& s = self->state;
      try {
        s.engine->leave_group(std::chrono::seconds(2));  // the previous group, if any
        const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::duration<double>(g.timeout_s));
        s.engine->join_group(g.nccl_id, g.rank, g.world, timeout);
        spdlog::info("drafter {}: joined data-parallel group {} as rank {} of {} at step {}", s.index,
                     g.generation, g.rank, g.world, s.engine->step());
        s.idle_since = clock_type::now();
        return s.engine->step();
      } catch (const gpu::error& e) {
        return make_error(e.code(), "drafter " + std::to_string(s.index) + ": group "
                                      + std::to_string(g.generation) + ": " + e.what());
      }
    },
    [self](snapshot_atom) -> snapshot_desc {
      auto& s = self->state;
      snapshot_desc d;
      d.drafter = s.index;
      d.step = s.engine->step();
      d.handle = s.engine->snapshot();
      return d;
    },
    [self](heartbeat_atom) -> int64_t { return self->state.engine->step(); },
    [self](shutdown_atom) { self->quit(); },
  };
}

// -------------------------------------------------------------- checkpointer

struct checkpointer_state {
  static inline const char* name = "tandem.checkpointer";
  std::filesystem::path dir;
  int keep = 3;
  std::vector<std::filesystem::path> written;
};

checkpointer_actor::behavior_type
checkpointer_behavior(checkpointer_actor::stateful_pointer<checkpointer_state> self,
                      std::filesystem::path dir, int keep) {
  install_default_handler(self, checkpointer_state::name);
  self->state.dir = std::move(dir);
  self->state.keep = keep;
  return {
    [self](const snapshot_desc& snap, const std::string& extra) -> caf::result<std::string> {
      auto& s = self->state;
      char name[32];
      std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(snap.step));
      auto target = s.dir / name;
      try {
        gpu::write_checkpoint(snap.handle, target, extra);
      } catch (const std::exception& e) {
        gpu::transport::release(snap.handle);
        return make_error(errc::bad_input, std::string("checkpoint ") + target.string() + ": " + e.what());
      }
      gpu::transport::release(snap.handle);
      s.written.push_back(target);
      while (s.keep > 0 && static_cast<int>(s.written.size()) > s.keep) {
        std::error_code ec;
        std::filesystem::remove_all(s.written.front(), ec);
        s.written.erase(s.written.begin());
      }
      return target.string();
    },
    [self](shutdown_atom) { self->quit(); },
  };
}

} // namespace

template <caf::spawn_options Os>
prefetch_actor spawn_prefetch(caf::actor_system& sys, int32_t index,
                              gpu::prefetch_engine_options opts, coordinator_actor coordinator) {
  return sys.spawn<Os>(prefetch_behavior, index, std::move(opts), std::move(coordinator));
}

template <caf::spawn_options Os>
target_actor spawn_target(caf::actor_system& sys, int32_t index, gpu::target_engine_options opts,
                          coordinator_actor coordinator) {
  return sys.spawn<Os>(target_behavior, index, std::move(opts), std::move(coordinator));
}

template <caf::spawn_options Os>
drafter_actor spawn_drafter(caf::actor_system& sys, int32_t index, gpu::drafter_engine_options opts,
                            std::string restore_from, coordinator_actor coordinator,
                            std::shared_ptr<fault_plan> faults) {
  return sys.spawn<Os>(drafter_behavior, index, std::move(opts), std::move(restore_from),
                       std::move(coordinator), std::move(faults));
}

template <caf::spawn_options Os>
checkpointer_actor spawn_checkpointer(caf::actor_system& sys, std::filesystem::path dir, int keep) {
  return sys.spawn<Os>(checkpointer_behavior, std::move(dir), keep);
}

// Production (detached) and the deterministic test scheduler (scheduled).
#define TANDEM_INSTANTIATE_SPAWNS(Os)                                                          \
  template prefetch_actor spawn_prefetch<Os>(caf::actor_system&, int32_t,                      \
                                             gpu::prefetch_engine_options, coordinator_actor); \
  template target_actor spawn_target<Os>(caf::actor_system&, int32_t,                          \
                                         gpu::target_engine_options, coordinator_actor);       \
  template drafter_actor spawn_drafter<Os>(caf::actor_system&, int32_t,                        \
                                           gpu::drafter_engine_options, std::string,           \
                                           coordinator_actor, std::shared_ptr<fault_plan>);    \
  template checkpointer_actor spawn_checkpointer<Os>(caf::actor_system&, std::filesystem::path, int);
TANDEM_INSTANTIATE_SPAWNS(caf::detached)
TANDEM_INSTANTIATE_SPAWNS(caf::no_spawn_options)
#undef TANDEM_INSTANTIATE_SPAWNS

} // namespace tandem
