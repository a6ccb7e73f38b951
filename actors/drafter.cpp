// The drafter actor (messages/drafter.hpp), one per GPU: one training step
// per work item, its data-parallel group, snapshots and heartbeats; injected
// faults (fault_plan) fire here.  Detached; its engine is built inside the
// behaviour, on its own thread.
#include <chrono>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <tuple>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/default_handler.hpp"
#include "actors/device_health.hpp"
#include "actors/spawn.hpp"
#include "actors/time.hpp"
#include "actors/vitals.hpp"
#include "gpu/device/error.hpp"
#include "gpu/nccl/communicator.hpp"
#include "gpu/transport/link.hpp"
#include "messages/errors.hpp"
#include "messages/supervisor.hpp"
#include "messages/target.hpp"

namespace tandem {

namespace {

struct drafter_state {
  static inline const char* name = "tandem.drafter";
  int32_t index = 0;
  /// The snapshot being copied (begin_snapshot), answered once it lands.
  std::optional<caf::typed_response_promise<snapshot_desc>> snapshot_reply;
  snapshot_desc snapshot;
  std::optional<gpu::drafter_engine> engine;
  coordinator_actor coordinator;
  clock_type::time_point idle_since = clock_type::now();
  std::shared_ptr<fault_plan> faults;
  /// Faults armed through the control endpoint (fault_atom): kind, the first
  /// step (0: the next) or, for the snapshot kinds, the first snapshot at or
  /// after it.  This incarnation's only: fired once, then dropped.
  std::vector<std::pair<std::string, int64_t>> armed;
  /// Work items in arrival order; the front one may be waiting for its
  /// payloads from another process (`pulling`, gpu/transport/link.hpp).
  std::deque<work_item> queue;
  bool pulling = false;
  int lost_inputs = 0;  ///< work items in a row whose payloads did not arrive
  /// NCCL links to targets, by target index, with the incarnation they join.
  struct target_link {
    caf::actor_addr producer;
    std::unique_ptr<gpu::transport::link> link;
  };
  std::map<int32_t, target_link> links;
};

bool is_snapshot_fault(const std::string& kind) {
  return kind == "slow_snapshot" || kind == "throw_in_snapshot";
}

/// Fires a step fault of `kind` before step `next_step`.
void fire_step_fault(drafter_state& s, const std::string& kind, int64_t next_step) {
  spdlog::warn("drafter {}: injected fault '{}' at step {}", s.index, kind, next_step);
  if (kind == "throw")
    s.engine->inject(gpu::fault::throw_in_step);
  else if (kind == "nan")
    s.engine->inject(gpu::fault::nan_loss);
  else if (kind == "cuda_error")
    s.engine->inject(gpu::fault::cuda_error);
  else if (kind == "cuda_sticky")
    s.engine->inject(gpu::fault::cuda_sticky);
  else if (kind == "hang")
    std::this_thread::sleep_for(std::chrono::duration<double>(s.faults ? s.faults->hang_s : 0.0));
  else if (kind == "abort")
    std::abort();  // the worker process dies (tandem run's parent restarts it)
}

/// Applies an injected fault due at `next_step`, if any (a planned one once
/// per run; an armed one once, at the first step at or after its own).
void apply_faults(drafter_state& s, int64_t next_step) {
  for (auto it = s.armed.begin(); it != s.armed.end();) {
    if (!is_snapshot_fault(it->first) && it->second <= next_step) {
      const auto kind = it->first;
      it = s.armed.erase(it);
      fire_step_fault(s, kind, next_step);
    } else {
      ++it;
    }
  }
  if (!s.faults)
    return;
  for (auto& f : s.faults->entries) {
    if (f->role != "drafter" || f->drafter != s.index || is_snapshot_fault(f->kind) || f->at_step != next_step || f->fired.exchange(true))
      continue;
    s.faults->record_fired(*f);
    fire_step_fault(s, f->kind, next_step);
  }
}

/// A "slow_snapshot" fault armed for the snapshot about to be taken (the
/// first one at or after its step); true when a "throw_in_snapshot" is due
/// (the drafter dies instead of answering).
bool apply_snapshot_faults(drafter_state& s) {
  std::vector<std::string> due;
  for (auto it = s.armed.begin(); it != s.armed.end();) {
    if (is_snapshot_fault(it->first) && s.engine->step() >= it->second) {
      due.push_back(it->first);
      it = s.armed.erase(it);
    } else {
      ++it;
    }
  }
  if (s.faults)
    for (auto& f : s.faults->entries) {
      if (f->role != "drafter" || f->drafter != s.index || !is_snapshot_fault(f->kind) || s.engine->step() < f->at_step
          || f->fired.exchange(true))
        continue;
      s.faults->record_fired(*f);
      due.push_back(f->kind);
    }
  bool die = false;
  for (const auto& kind : due) {
    if (kind == "throw_in_snapshot") {
      spdlog::warn("drafter {}: injected fault 'throw_in_snapshot' at step {}", s.index, s.engine->step());
      die = true;
      continue;
    }
    const double slow_s = s.faults ? s.faults->slow_snapshot_s : 0.0;
    spdlog::warn("drafter {}: injected fault 'slow_snapshot' at step {}: the snapshot copies for {} s",
                 s.index, s.engine->step(), slow_s);
    s.engine->slow_next_snapshot(slow_s);
  }
  return die;
}

/// Answers the snapshot request once its copy has landed; until then looks
/// again in 2 ms (the mailbox stays open: heartbeats are answered).
void poll_snapshot(drafter_actor::stateful_pointer<drafter_state> self) {
  auto& s = self->state;
  if (!s.snapshot_reply)
    return;
  try {
    auto h = s.engine->poll_snapshot();
    if (!h) {
      self->delayed_send(self, std::chrono::milliseconds(2), snapshot_poll_atom::value);
      return;
    }
    s.snapshot.handle = *h;
    s.snapshot_reply->deliver(s.snapshot);
    s.snapshot_reply.reset();
    s.idle_since = clock_type::now();  // the copy was work, not a wait for data
  } catch (const std::exception& e) {
    const auto c = classify_failure(errc::device_failure, s.engine->info().device);
    auto err = make_error(c.code, "drafter " + std::to_string(s.index) + ": snapshot at step "
                                    + std::to_string(s.snapshot.step) + ": " + e.what() + c.suffix);
    s.snapshot_reply->deliver(err);
    s.snapshot_reply.reset();
    self->quit(err);
  }
}

/// The step failed (`code`, `what`): the actor ends with the error, as
/// errc::device_lost when the device's context is gone (then the engine is
/// kept, not torn down on the poisoned context).
void fail_step(drafter_actor::stateful_pointer<drafter_state> self, errc code, const std::string& what) {
  auto& s = self->state;
  const auto step = s.engine->step() + 1;
  const auto c = classify_failure(code, s.engine->info().device);
  if (c.code == errc::device_lost)
    spdlog::error("drafter {}: step {}: {}{}", s.index, step, what, c.suffix);
  keep_engine_if_lost(c, s.engine);
  self->quit(make_error(c.code, "step " + std::to_string(step) + ": " + what + c.suffix));
}

/// Trains `w` on the payloads behind `batch_h` and `features_h` (its own, or
/// the ones received over a link); false when the actor failed and quit.
bool train(drafter_actor::stateful_pointer<drafter_state> self, const work_item& w, uint64_t batch_h,
           uint64_t features_h) {
  auto& s = self->state;
  const double wait = ms_since(s.idle_since);
  apply_faults(s, s.engine->step() + 1);
  // A failed step ends the actor with the reason; the coordinator
  // (its supervisor) restarts it from the newest checkpoint.
  gpu::step_result r;
  try {
    r = s.engine->train_step(batch_h, features_h, w.contribute, w.lr_scale);
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
        return false;
      }
      rep.batch_id = w.batch.batch_id;
      rep.finite = false;
      rep.contributed = w.contribute;
      rep.group_failed = true;
      s.idle_since = clock_type::now();
      self->send(s.coordinator, rep);
      return true;
    }
    fail_step(self, e.code(), e.what());
    return false;
  } catch (const std::exception& e) {
    fail_step(self, errc::device_failure, e.what());
    return false;
  }
  step_report rep;
  rep.drafter = s.index;
  rep.step = r.step;
  rep.batch_id = w.batch.batch_id;
  rep.loss = r.loss;
  rep.accuracy = r.accuracy;
  rep.sim_accept = r.sim_accept;
  rep.grad_norm = r.grad_norm;
  rep.lr = r.lr;
  rep.scored_tokens = r.scored_tokens;
  rep.real_tokens = w.batch.real_tokens;
  rep.finite = r.finite;
  rep.compute_ms = r.compute_ms;
  rep.tflop = r.tflop;
  rep.wait_ms = wait;
  rep.contributed = w.contribute;
  const auto mem = s.engine->device_memory();
  rep.mem_allocated = mem.allocated;
  rep.mem_reserved = mem.reserved;
  rep.mem_peak = mem.peak;
  std::tie(rep.graphs, rep.graph_pool_bytes) = s.engine->graph_pools();
  if (r.finite) {
    try {
      rep.restore_point = s.engine->keep_restore_point();
    } catch (const std::exception& e) {
      const auto c = classify_failure(errc::device_failure, s.engine->info().device);
      self->quit(make_error(c.code, "step " + std::to_string(r.step) + ": keeping the restore point in device memory: "
                                      + e.what() + c.suffix));
      return false;
    }
  }
  s.idle_since = clock_type::now();
  self->send(s.coordinator, rep);
  return true;
}

/// Where `w`'s payloads are: acquirable in this process (its own, or
/// another process's of this host through shared memory or CUDA IPC, unless
/// cluster.transport = "nccl"), to be pulled over a link from its target,
/// or out of reach (another host's, without a target to pull from).
enum class route { local, pull, unreachable };

route route_of(drafter_actor::stateful_pointer<drafter_state> self, const work_item& w) {
  const auto& f = w.features;
  const bool same_host = f.host.empty() || f.host == gpu::transport::host_identity();
  if (!f.producer)
    return same_host ? route::local : route::unreachable;
  if (f.producer.node() == self->node())
    return route::local;
  return same_host && !gpu::transport::forcing_links() ? route::local : route::pull;
}

void pull(drafter_actor::stateful_pointer<drafter_state> self);

/// The front work item's payloads did not arrive (`why`): nothing is
/// trained.  A single drafter reports it (the coordinator issues the
/// batches in flight again) and goes on; one in a data-parallel group, or
/// one whose pulls keep failing, fails its step instead.
/// False when the actor failed and quit.
bool lose_input(drafter_actor::stateful_pointer<drafter_state> self, const std::string& why) {
  auto& s = self->state;
  auto w = std::move(s.queue.front());
  s.queue.pop_front();
  s.pulling = false;
  s.links.erase(w.features.target);  // a new link next time (this one aborted)
  constexpr int in_a_row = 3;
  if (s.engine->group_world() > 1 || ++s.lost_inputs >= in_a_row) {
    fail_step(self, errc::device_failure,
              why + (s.lost_inputs >= in_a_row ? " (" + std::to_string(in_a_row) + " work items in a row)" : ""));
    return false;
  }
  spdlog::warn("drafter {}: {}: nothing trained, the coordinator issues it again", s.index, why);
  step_report rep;
  rep.drafter = s.index;
  rep.step = s.engine->step();
  rep.batch_id = w.batch.batch_id;
  rep.contributed = w.contribute;
  rep.lost_input = true;
  s.idle_since = clock_type::now();
  self->send(s.coordinator, rep);
  return true;
}

/// Trains the queued work items in their order; one whose payloads must be
/// pulled waits for them (the mailbox stays open meanwhile).
void advance(drafter_actor::stateful_pointer<drafter_state> self) {
  auto& s = self->state;
  while (!s.pulling && !s.queue.empty()) {
    const auto r = route_of(self, s.queue.front());
    if (r == route::unreachable) {
      const auto& f = s.queue.front().features;
      if (!lose_input(self, "batch " + std::to_string(f.batch_id) + ": its features are on host '" + f.host
                              + "' and name no target to pull them from"))
        return;
      continue;
    }
    if (r == route::pull) {
      s.pulling = true;
      pull(self);
      return;
    }
    auto w = std::move(s.queue.front());
    s.queue.pop_front();
    if (!train(self, w, w.batch.handle, w.features.handle))
      return;
  }
}

/// The front work item's batch and features, over the link to their target
/// (asked for first when there is none, or its target is a new incarnation).
void pull(drafter_actor::stateful_pointer<drafter_state> self) {
  auto& s = self->state;
  const auto& w = s.queue.front();
  const auto t = w.features.target;
  const auto producer = w.features.producer;
  const auto target = caf::actor_cast<target_actor>(producer);
  const auto timeout = gpu::transport::link_timeout();
  const auto from = "batch " + std::to_string(w.batch.batch_id) + " from target " + std::to_string(t);
  auto& l = s.links[t];
  if (!l.link || l.producer != producer.address() || !l.link->usable()) {
    l.link.reset();  // aborted
    self->request(target, timeout, link_atom::value, s.index)
      .then(
        [self, t, producer, timeout, from](std::vector<uint8_t>& id) {
          auto& s = self->state;
          try {
            auto link = std::make_unique<gpu::transport::link>(
              id, 1, s.engine->info().device, timeout,
              "features from target " + std::to_string(t) + " to drafter " + std::to_string(s.index));
            spdlog::info("drafter {}: {}", s.index, link->describe());
            s.links[t] = {producer.address(), std::move(link)};
          } catch (const std::exception& e) {
            if (lose_input(self, from + ": joining the link: " + e.what()))
              advance(self);
            return;
          }
          pull(self);
        },
        [self, from](caf::error& err) {
          if (lose_input(self, from + ": no link: " + self->system().render(err)))
            advance(self);
        });
    return;
  }
  self->request(target, timeout, pull_atom::value, s.index, std::vector<uint64_t>{w.batch.handle, w.features.handle})
    .then(
      [self, t, from](pulled& p) {
        auto& s = self->state;
        std::vector<uint64_t> got;
        try {
          got = s.links[t].link->receive(p.payloads);
        } catch (const std::exception& e) {
          if (lose_input(self, from + ": " + e.what()))
            advance(self);
          return;
        }
        if (got.size() != 2) {
          for (auto h : got)
            gpu::transport::release(h);
          if (lose_input(self, from + ": the target sent " + std::to_string(got.size())
                             + " payloads, expected {batch, features}"))
            advance(self);
          return;
        }
        auto w = std::move(s.queue.front());
        s.queue.pop_front();
        s.pulling = false;
        s.lost_inputs = 0;
        const bool ok = train(self, w, got[0], got[1]);
        for (auto h : got)
          gpu::transport::release(h);
        if (ok)
          advance(self);
      },
      [self, from](caf::error& err) {
        if (lose_input(self, from + ": pull refused: " + self->system().render(err)))
          advance(self);
      });
}

drafter_actor::behavior_type drafter_behavior(drafter_actor::stateful_pointer<drafter_state> self,
                                              int32_t index, gpu::drafter_engine_options opts,
                                              std::string restore_from,
                                              coordinator_actor coordinator,
                                              std::shared_ptr<fault_plan> faults, bool own_thread) {
  install_default_handler(self, drafter_state::name);
  auto meter = std::make_shared<vitals_meter>(self->system(), "drafter", index, own_thread);
  // capture_graphs: its first step captures the whole step as a CUDA graph
  // (the tree says "capturing" until a graph exists).
  const bool captures = opts.capture_graphs && opts.device >= 0;
  meter->figures = [self, captures] {
    auto& s = self->state;
    return std::vector<vitals_figure>{{"step", s.engine ? static_cast<double>(s.engine->step()) : 0.0},
                                      {"armed_faults", static_cast<double>(s.armed.size())},
                                      {"capture_graphs", captures ? 1.0 : 0.0},
                                      {"captured_graphs", s.engine ? static_cast<double>(s.engine->graph_pools().first)
                                                                   : 0.0}};
  };
  auto& st = self->state;
  st.index = index;
  st.coordinator = coordinator;
  st.faults = std::move(faults);
  std::optional<caf::error> failed;
  try {
    st.engine.emplace(opts);
    // The attention's path: the dense-mask fallback on a GPU is worth a
    // warning (a shape the kernels do not take: ≈ 7× the attention's work).
    if (const auto& path = st.engine->info().attention; opts.device >= 0 && path.rfind("sdpa", 0) == 0)
      spdlog::warn("drafter {}: attention: {}: the dense-mask path, ≈ 7× the work of the CUDA kernels (they "
                   "take bf16 or fp16, head_dim 32, 64 or 128, block sizes up to 16)",
                   index, path);
    else
      spdlog::info("drafter {}: attention: {}", index, path);
    // "memory:<k>": the restore point in device memory, which must hold
    // update k (coordinator_failures.cpp); else a checkpoint folder.
    if (restore_from.rfind(memory_restore_prefix, 0) == 0)
      st.engine->restore_memory(std::stoll(std::string(restore_from).substr(memory_restore_prefix.size())));
    else if (!restore_from.empty())
      st.engine->restore(restore_from);
  } catch (const gpu::error& e) {
    // The engine's own code: bad_input stops the run (the supervisor does
    // not retry it); a restore point that is gone is a device_failure, and
    // the coordinator falls back to the checkpoint.
    failed = make_error(e.code(), "drafter " + std::to_string(index) + ": " + e.what());
  } catch (const std::exception& e) {
    // Not one of the engine's own errors (an allocation or a CUDA call that
    // failed): a device failure, which the supervisor may retry.
    failed = make_error(errc::device_failure, "drafter " + std::to_string(index) + ": " + e.what());
  }
  if (failed) {
    self->quit(*failed);
    return {[](const work_item&) {}, [](group_id_atom) { return std::vector<uint8_t>{}; },
            [](const group_spec&) { return int64_t{0}; },
            [](snapshot_atom) -> caf::result<snapshot_desc> { return snapshot_desc{}; },
            [](heartbeat_atom) { return int64_t{0}; }, [](shutdown_atom) {}, [](snapshot_poll_atom) {},
            [](fault_atom, const std::string&, int64_t) {}, vitals_handler(self, meter)};
  }
  st.idle_since = clock_type::now();
  return counted(meter, drafter_actor::behavior_type{
    vitals_handler(self, meter),
    [self](work_item& w) {
      self->state.queue.push_back(std::move(w));
      advance(self);
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
        s.engine->join_group(g.nccl_id, g.rank, g.world, seconds_to<std::chrono::milliseconds>(g.timeout_s));
        spdlog::info("drafter {}: joined data-parallel group {} as rank {} of {} at step {}", s.index,
                     g.generation, g.rank, g.world, s.engine->step());
        s.idle_since = clock_type::now();
        return s.engine->step();
      } catch (const gpu::error& e) {
        return make_error(e.code(), "drafter " + std::to_string(s.index) + ": group "
                                      + std::to_string(g.generation) + ": " + e.what());
      }
    },
    [self](snapshot_atom) -> caf::result<snapshot_desc> {
      auto& s = self->state;
      snapshot_desc d;
      d.drafter = s.index;
      d.step = s.engine->step();
      if (apply_snapshot_faults(s)) {
        auto err = make_error(errc::device_failure, "snapshot at step " + std::to_string(d.step)
                                                      + ": injected fault (throw_in_snapshot)");
        self->quit(err);
        return err;
      }
      if (s.snapshot_reply)
        return make_error(errc::bad_input, "drafter " + std::to_string(s.index)
                                             + ": a snapshot is already being taken");
      try {
        const auto t0 = clock_type::now();
        s.engine->begin_snapshot();
        // Starting it should not hold this thread (the copy is asynchronous);
        // the first snapshots allocate their page-locked host buffers here.
        if (const double held = ms_since(t0); held > 250.0)
          spdlog::info("drafter {}: snapshot at step {}: starting it held the drafter for {:.2f} s (the first "
                       "snapshots allocate their page-locked host buffers)",
                       s.index, d.step, held / 1e3);
      } catch (const std::exception& e) {
        auto err = make_error(errc::device_failure, "drafter " + std::to_string(s.index) + ": snapshot at step "
                                                      + std::to_string(d.step) + ": " + e.what());
        self->quit(err);
        return err;
      }
      s.snapshot = d;
      s.snapshot_reply = self->make_response_promise<snapshot_desc>();
      auto reply = *s.snapshot_reply;
      poll_snapshot(self);
      return reply;
    },
    [self](snapshot_poll_atom) { poll_snapshot(self); },
    [self](heartbeat_atom) -> int64_t { return self->state.engine->step(); },
    [self](shutdown_atom) { self->quit(); },
    [self](fault_atom, const std::string& kind, int64_t at_step) {
      spdlog::warn("drafter {}: fault '{}' armed through the control endpoint for {}", self->state.index, kind,
                   at_step > 0 ? "step " + std::to_string(at_step) : std::string("the next step"));
      self->state.armed.emplace_back(kind, at_step);
    },
  });
}

} // namespace

template <caf::spawn_options Os>
drafter_actor spawn_drafter(caf::actor_system& sys, int32_t index, gpu::drafter_engine_options opts,
                            std::string restore_from, coordinator_actor coordinator,
                            std::shared_ptr<fault_plan> faults) {
  return sys.spawn<Os>(drafter_behavior, index, std::move(opts), std::move(restore_from),
                       std::move(coordinator), std::move(faults), Os == caf::detached);
}

// Production (detached) and the deterministic test scheduler (scheduled).
template drafter_actor spawn_drafter<caf::detached>(caf::actor_system&, int32_t, gpu::drafter_engine_options,
                                                    std::string, coordinator_actor,
                                                    std::shared_ptr<fault_plan>);
template drafter_actor spawn_drafter<caf::no_spawn_options>(caf::actor_system&, int32_t, gpu::drafter_engine_options,
                                                            std::string, coordinator_actor,
                                                            std::shared_ptr<fault_plan>);

} // namespace tandem
