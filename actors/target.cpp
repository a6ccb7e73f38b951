// The target actor (messages/target.hpp), one per GPU: the frozen target's
// forward pass; sends the batch with its tapped features' descriptor to the
// coordinator.  Detached; its engine is built inside the behaviour, on its
// own thread.
#include <map>
#include <memory>
#include <optional>
#include <vector>

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

namespace tandem {

namespace {

struct target_state {
  static inline const char* name = "tandem.target";
  int32_t index = 0;
  std::optional<gpu::target_engine> engine;
  coordinator_actor coordinator;
  // Vitals figures: forward passes done and their times.
  int64_t batches = 0;
  double forward_ms_last = 0, forward_ms_total = 0;
  std::shared_ptr<fault_plan> faults;  ///< injected faults (tests)
  /// NCCL links to drafters that pull from this target (messages/target.hpp),
  /// by drafter index, with the incarnation that asked for it: a drafter's
  /// new incarnation replaces its link, and a pull from any other sender is
  /// refused.  A drafter that goes down takes its link with it (aborted: a
  /// send still waiting for its receive ends).
  struct drafter_link {
    caf::actor_addr peer;
    std::unique_ptr<gpu::transport::link> link;
  };
  std::map<int32_t, drafter_link> links;
};

target_actor::behavior_type target_behavior(target_actor::stateful_pointer<target_state> self,
                                            int32_t index, gpu::target_engine_options opts,
                                            coordinator_actor coordinator, std::shared_ptr<fault_plan> faults,
                                            bool own_thread) {
  install_default_handler(self, target_state::name);
  auto meter = std::make_shared<vitals_meter>(self->system(), "target", index, own_thread);
  meter->figures = [self] {
    auto& s = self->state;
    return std::vector<vitals_figure>{
      {"batches", static_cast<double>(s.batches)},
      {"forward_ms_last", s.forward_ms_last},
      {"forward_ms_mean", s.batches > 0 ? s.forward_ms_total / static_cast<double>(s.batches) : 0.0},
      {"queue_depth", static_cast<double>(self->mailbox().size())}};
  };
  self->state.index = index;
  self->state.coordinator = coordinator;
  self->state.faults = std::move(faults);
  // The engine's own code says what failed: bad_input (weights or config
  // that do not load: deterministic), device_unavailable; anything else
  // (LibTorch, CUDA) is a device failure, not known to be the input's.
  auto fail_start = [&](errc code, const char* what) {
    self->quit(make_error(code, "target " + std::to_string(index) + ": " + what));
  };
  try {
    self->state.engine.emplace(opts);
  } catch (const gpu::error& e) {
    fail_start(e.code(), e.what());
  } catch (const std::exception& e) {
    fail_start(errc::device_failure, e.what());
  }
  if (!self->state.engine)
    return {[](batch_desc&) {}, [](release_atom, uint64_t) {},
            [](link_atom, int32_t) -> caf::result<std::vector<uint8_t>> {
              return make_error(errc::device_failure, "the target failed to start");
            },
            [](pull_atom, int32_t, const std::vector<uint64_t>&) -> caf::result<pulled> {
              return make_error(errc::device_failure, "the target failed to start");
            },
            [](shutdown_atom) {}, vitals_handler(self, meter)};
  // A drafter that pulled from this target went down: its link goes too.
  self->set_down_handler([self](caf::down_msg& m) {
    auto& links = self->state.links;
    for (auto it = links.begin(); it != links.end();)
      it = it->second.peer == m.source ? links.erase(it) : std::next(it);
  });
  return counted(meter, target_actor::behavior_type{
    vitals_handler(self, meter),
    [self](batch_desc& batch) {
      auto& s = self->state;
      auto t0 = clock_type::now();
      work_item w;
      w.features.batch_id = batch.batch_id;
      w.features.target = s.index;
      try {
        if (s.faults)
          if (auto kind = s.faults->take("target", s.index, s.batches + 1); !kind.empty())
            fault_plan::fire("target", s.index, kind);
        w.features.handle = s.engine->forward(batch.handle);
      } catch (const std::exception& e) {
        // The engine's own code where it has one (bad_input: out of memory
        // for these shapes); a lost device context is device_lost.
        const auto* ge = dynamic_cast<const gpu::error*>(&e);
        const auto c = classify_failure(ge ? ge->code() : errc::device_failure, s.engine->info().device);
        auto err = make_error(c.code, "target " + std::to_string(s.index) + ", batch "
                                        + std::to_string(batch.batch_id) + ": " + e.what() + c.suffix);
        keep_engine_if_lost(c, s.engine);
        self->quit(std::move(err));
        return;
      }
      w.features.forward_ms = ms_since(t0);
      ++s.batches;
      s.forward_ms_last = w.features.forward_ms;
      s.forward_ms_total += w.features.forward_ms;
      // The descriptor names what is behind the handle (descriptors.hpp):
      // the taps [rows, seq_len, n·D] on this target's device.
      const auto& info = s.engine->info();
      w.features.shape = {batch.rows, batch.seq_len,
                          static_cast<int64_t>(info.tap_ids.size()) * info.hidden_size};
      w.features.where.device = info.device;
      w.features.dtype = info.dtype;
      w.features.host = gpu::transport::host_identity();
      w.features.producer = caf::actor_cast<caf::actor>(self);
      w.batch = std::move(batch);
      self->send(s.coordinator, std::move(w));
    },
    [self](release_atom, uint64_t handle) { gpu::transport::release(handle); },
    [self](link_atom, int32_t drafter) -> caf::result<std::vector<uint8_t>> {
      auto& s = self->state;
      const auto who = "target " + std::to_string(s.index) + ": link to drafter " + std::to_string(drafter);
      s.links.erase(drafter);  // its old incarnation's: aborted, a send stuck on it ends
      std::vector<uint8_t> id;
      try {
        id = gpu::nccl::new_unique_id();
      } catch (const gpu::error& e) {
        return make_error(e.code(), who + ": " + e.what());
      }
      const auto peer = caf::actor_cast<caf::actor>(self->current_sender());
      self->monitor(peer);
      // Answered before joining: the drafter joins when it has the id.
      auto rp = self->make_response_promise<std::vector<uint8_t>>();
      rp.deliver(id);
      try {
        auto link = std::make_unique<gpu::transport::link>(
          id, 0, s.engine->info().device, gpu::transport::link_timeout(),
          "features from target " + std::to_string(s.index) + " to drafter " + std::to_string(drafter));
        spdlog::info("{}: {}", who, link->describe());
        s.links[drafter] = {peer.address(), std::move(link)};
      } catch (const std::exception& e) {
        // The drafter's side fails too (by its own deadline) and says so.
        spdlog::warn("{}: {}", who, e.what());
      }
      return rp;
    },
    [self](pull_atom, int32_t drafter, const std::vector<uint64_t>& handles) -> caf::result<pulled> {
      auto& s = self->state;
      const auto who = "target " + std::to_string(s.index) + ": pull of drafter " + std::to_string(drafter);
      auto it = s.links.find(drafter);
      if (it == s.links.end() || !it->second.link->usable())
        return make_error(errc::device_failure, who + ": no usable link (ask for a new one)");
      if (caf::actor_cast<caf::actor_addr>(self->current_sender()) != it->second.peer)
        return make_error(errc::bad_input, who + ": from another incarnation than the link's");
      pulled p;
      try {
        p.payloads = it->second.link->check(handles);
      } catch (const gpu::error& e) {
        return make_error(e.code(), who + ": " + e.what());  // nothing was sent
      }
      // Answered before the sends are enqueued: the drafter's receives come
      // after the answer, and the sends need them once the pair is busy.
      auto rp = self->make_response_promise<pulled>();
      rp.deliver(p);
      try {
        it->second.link->send(handles, p.payloads);
      } catch (const std::exception& e) {
        // The drafter's receive ends at its deadline and says so.
        spdlog::warn("{}: {}", who, e.what());
        s.links.erase(it);
      }
      return rp;
    },
    [self](shutdown_atom) { self->quit(); },
  });
}

} // namespace

template <caf::spawn_options Os>
target_actor spawn_target(caf::actor_system& sys, int32_t index, gpu::target_engine_options opts,
                          coordinator_actor coordinator, std::shared_ptr<fault_plan> faults) {
  return sys.spawn<Os>(target_behavior, index, std::move(opts), std::move(coordinator), std::move(faults),
                       Os == caf::detached);
}

// Production (detached) and the deterministic test scheduler (scheduled).
template target_actor spawn_target<caf::detached>(caf::actor_system&, int32_t, gpu::target_engine_options,
                                                  coordinator_actor, std::shared_ptr<fault_plan>);
template target_actor spawn_target<caf::no_spawn_options>(caf::actor_system&, int32_t, gpu::target_engine_options,
                                                          coordinator_actor, std::shared_ptr<fault_plan>);

} // namespace tandem
