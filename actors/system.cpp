#include "actors/system.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <set>

#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include "gpu/nccl/communicator.hpp"
#include "messages/errors.hpp"

namespace tandem {

namespace {

std::string fired_line(int32_t drafter, const std::string& kind, int64_t at_step) {
  return std::to_string(drafter) + "," + kind + "," + std::to_string(at_step);
}

} // namespace

void fault_plan::record_fired(const entry& e) const {
  if (fired_file.empty())
    return;
  const auto line = fired_line(e.drafter, e.kind, e.at_step) + "\n";
  const int fd = ::open(fired_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    spdlog::warn("faults: cannot record a fired fault in {}", fired_file);
    return;
  }
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()) || ::fsync(fd) != 0)
    spdlog::warn("faults: cannot record a fired fault in {}", fired_file);
  ::close(fd);
}

running_system spawn_system(caf::actor_system& sys, const launch_plan& plan) {
  running_system run;
  run.peers.checkpointer = spawn_checkpointer(sys, plan.checkpointer.dir, plan.checkpointer.keep);
  if (plan.coordinator.host_every > 0) {
    // A run resumed from a restore point in shared memory may roll back to
    // it until a checkpoint holds a newer step: never rotated away.
    const auto resumed = std::filesystem::path(plan.restore_from);
    const bool from_host = !resumed.empty() && resumed.parent_path() == plan.host_checkpointer.dir;
    run.peers.host_checkpointer = spawn_checkpointer(sys, plan.host_checkpointer.dir, plan.host_checkpointer.keep,
                                                     from_host ? resumed : std::filesystem::path{});
  }

  auto faults = std::make_shared<fault_plan>();
  faults->hang_s = plan.hang_s;
  faults->slow_snapshot_s = plan.slow_snapshot_s;
  faults->fired_file = plan.faults_fired_file;
  std::set<std::string> fired_before;
  if (!faults->fired_file.empty()) {
    std::ifstream in(faults->fired_file);
    for (std::string line; std::getline(in, line);)
      fired_before.insert(line);
  }
  for (const auto& f : plan.faults) {
    auto e = std::make_unique<fault_plan::entry>();
    e->drafter = static_cast<int32_t>(f.drafter);
    e->kind = f.kind;
    e->at_step = f.at_step;
    if (fired_before.count(fired_line(e->drafter, e->kind, e->at_step)))
      e->fired = true;  // an earlier worker process of this run fired it
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
  if (plan.control) {
    // The control endpoint: its actor first (the metrics actor feeds it),
    // then its server; a port that cannot be bound fails the start.
    run.control = spawn_control(sys, *plan.control, run.coordinator);
    control_server_options so;
    so.host = plan.control->host;
    so.port = plan.control->port;
    so.token = random_token();
    so.tls_cert = plan.control->tls_cert;
    so.tls_key = plan.control->tls_key;
    // Past the actor's own wait for the coordinator, so its 503 (which
    // says why) arrives before the server gives up.
    so.answer_timeout_ms = plan.control->answer_timeout_ms + 1000;
    run.control_token = so.token;
    try {
      run.control_http = std::make_shared<control_server>(sys, run.control, so);
    } catch (...) {
      // Nothing runs yet: end what is spawned (the actor system's end waits for it).
      for (const auto& a : {caf::actor_cast<caf::actor>(run.control), caf::actor_cast<caf::actor>(run.coordinator),
                            caf::actor_cast<caf::actor>(run.supervisor),
                            caf::actor_cast<caf::actor>(run.peers.checkpointer),
                            caf::actor_cast<caf::actor>(run.peers.host_checkpointer)})
        if (a)
          caf::anon_send(a, shutdown_atom::value);
      throw;
    }
  }
  run.peers.metrics = spawn_metrics(sys, plan.metrics, run.control);

  for (size_t i = 0; i < plan.placement.targets.size(); ++i) {
    const auto index = plan.placement.targets[i].index;
    run.peers.prefetch.push_back(spawn_prefetch(sys, index, plan.prefetch[i], run.coordinator));
    run.peers.targets.push_back(spawn_target(sys, index, plan.targets[i], run.coordinator));
  }
  for (size_t i = 0; i < plan.placement.drafters.size(); ++i)
    run.peers.drafters.push_back(spawn_drafter(sys, plan.placement.drafters[i].index, plan.drafters[i],
                                               plan.restore_from, run.coordinator, faults));
  if (plan.eval)
    run.peers.eval = spawn_eval(sys, *plan.eval);
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
  if (run.control_http)
    run.control_http->stop();  // no request reaches the actors from here on
  if (run.control)
    caf::anon_send(run.control, shutdown_atom::value);
  caf::anon_send(run.supervisor, shutdown_atom::value);
  for (auto& p : run.peers.prefetch)
    caf::anon_send(p, shutdown_atom::value);
  for (auto& t : run.peers.targets)
    caf::anon_send(t, shutdown_atom::value);
  for (auto& d : run.peers.drafters)
    caf::anon_send(d, shutdown_atom::value);
  caf::anon_send(run.peers.checkpointer, shutdown_atom::value);
  if (run.peers.eval)
    caf::anon_send(run.peers.eval, shutdown_atom::value);
  if (run.peers.host_checkpointer)
    caf::anon_send(run.peers.host_checkpointer, shutdown_atom::value);
  caf::anon_send(run.peers.metrics, shutdown_atom::value);
  caf::anon_send(run.coordinator, shutdown_atom::value);
}

} // namespace tandem
