#include "actors/system.hpp"

#include <memory>

#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include "gpu/nccl/communicator.hpp"
#include "messages/errors.hpp"

namespace tandem {

running_system spawn_system(caf::actor_system& sys, const launch_plan& plan) {
  running_system run;
  run.peers.metrics = spawn_metrics(sys, plan.metrics);
  run.peers.checkpointer = spawn_checkpointer(sys, plan.checkpointer.dir, plan.checkpointer.keep);

  auto faults = std::make_shared<fault_plan>();
  faults->hang_s = plan.hang_s;
  faults->slow_snapshot_s = plan.slow_snapshot_s;
  for (const auto& f : plan.faults) {
    auto e = std::make_unique<fault_plan::entry>();
    e->drafter = static_cast<int32_t>(f.drafter);
    e->kind = f.kind;
    e->at_step = f.at_step;
    faults->entries.push_back(std::move(e));
  }

  // Drafter options per index, for the first spawn and every restart; the
  // coordinator's handle is known only once it is spawned.
  auto drafter_opts = std::make_shared<const std::vector<gpu::drafter_engine_options>>(plan.drafters);
  auto coordinator_handle = std::make_shared<coordinator_actor>();
  supervisor_options so;
  static_cast<supervisor_settings&>(so) = plan.supervisor;
  so.respawn_drafter = [&sys, drafter_opts, coordinator_handle, faults](int32_t index,
                                                                         const std::string& from) {
    return spawn_drafter(sys, index, (*drafter_opts)[static_cast<size_t>(index)], from,
                         *coordinator_handle, faults);
  };
  run.supervisor = spawn_supervisor(sys, so);

  coordinator_options co;
  static_cast<coordinator_settings&>(co) = plan.coordinator;
  co.abort_group = [](const std::vector<uint8_t>& id, const std::string& why) {
    if (const auto n = gpu::nccl::abort_group(id, why))
      spdlog::warn("aborted {} communicator(s) of the broken data-parallel group: {}", n, why);
  };
  co.supervisor = run.supervisor;
  run.coordinator = spawn_coordinator(sys, co);
  *coordinator_handle = run.coordinator;

  for (size_t i = 0; i < plan.placement.targets.size(); ++i) {
    const auto index = plan.placement.targets[i].index;
    run.peers.prefetch.push_back(spawn_prefetch(sys, index, plan.prefetch[i], run.coordinator));
    run.peers.targets.push_back(spawn_target(sys, index, plan.targets[i], run.coordinator));
  }
  for (size_t i = 0; i < plan.placement.drafters.size(); ++i)
    run.peers.drafters.push_back(spawn_drafter(sys, plan.placement.drafters[i].index, plan.drafters[i],
                                               plan.restore_from, run.coordinator, faults));
  return run;
}

void start_run(caf::actor_system& sys, const running_system& run, caf::actor reply_to) {
  // The launcher asks the coordinator to run and watches it and the
  // supervisor (which watches the workers, restarts drafters and escalates
  // the rest through the coordinator); it reports by a plain message, so
  // the caller's thread can keep polling for signals.
  sys.spawn([reply_to, coordinator = run.coordinator, supervisor = run.supervisor,
             p = run.peers](caf::event_based_actor* me) mutable -> caf::behavior {
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
}

void request_stop(const running_system& run) {
  caf::anon_send(run.coordinator, stop_atom::value);
}

void shutdown_system(const running_system& run) {
  caf::anon_send(run.supervisor, shutdown_atom::value);
  for (auto& p : run.peers.prefetch)
    caf::anon_send(p, shutdown_atom::value);
  for (auto& t : run.peers.targets)
    caf::anon_send(t, shutdown_atom::value);
  for (auto& d : run.peers.drafters)
    caf::anon_send(d, shutdown_atom::value);
  caf::anon_send(run.peers.checkpointer, shutdown_atom::value);
  caf::anon_send(run.peers.metrics, shutdown_atom::value);
  caf::anon_send(run.coordinator, shutdown_atom::value);
}

} // namespace tandem
