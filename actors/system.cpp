#include "actors/system.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <set>

#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include "actors/cluster.hpp"
#include "gpu/nccl/communicator.hpp"
#include "messages/errors.hpp"

namespace tandem {

namespace {

std::string fired_line(const std::string& role, int32_t index, const std::string& kind, int64_t at_step) {
  // A drafter's without its role (the form older runs wrote).
  return (role == "drafter" ? "" : role + ":") + std::to_string(index) + "," + kind + "," + std::to_string(at_step);
}

} // namespace

void fault_plan::record_fired(const entry& e) const {
  if (fired_file.empty())
    return;
  const auto line = fired_line(e.role, e.drafter, e.kind, e.at_step) + "\n";
  const int fd = ::open(fired_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    spdlog::warn("faults: cannot record a fired fault in {}", fired_file);
    return;
  }
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()) || ::fsync(fd) != 0)
    spdlog::warn("faults: cannot record a fired fault in {}", fired_file);
  ::close(fd);
}

std::string fault_plan::take(const std::string& role, int32_t index, int64_t count) {
  for (auto& f : entries)
    if (f->role == role && f->drafter == index && f->at_step == count && !f->fired.exchange(true)) {
      record_fired(*f);
      return f->kind;
    }
  return "";
}

void fault_plan::fire(const std::string& role, int32_t index, const std::string& kind) {
  spdlog::warn("{} {}: injected fault '{}'", role, index, kind);
  if (kind == "abort")
    std::abort();  // the worker process dies (tandem run's parent restarts it)
  throw std::runtime_error("injected fault '" + kind + "'");
}

std::shared_ptr<fault_plan> make_fault_plan(const launch_plan& plan) {
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
    e->role = f.role;
    e->drafter = static_cast<int32_t>(f.drafter);
    e->kind = f.kind;
    e->at_step = f.at_step;
    if (fired_before.count(fired_line(e->role, e->drafter, e->kind, e->at_step)))
      e->fired = true;  // an earlier worker process of this run fired it
    faults->entries.push_back(std::move(e));
  }
  return faults;
}

namespace {

/// Asks member `node`'s agent to spawn something and waits for its handle
/// (the calling thread blocks: the launcher's, or the supervisor's for a
/// restart on a member).
template <class Handle, class... Ts>
Handle spawn_on(caf::actor_system& sys, const cluster_members& members, const std::string& node,
                const std::string& what, Ts&&... xs) {
  auto it = members.agents.find(node);
  if (it == members.agents.end())
    throw std::runtime_error(what + ": node '" + node + "' has not joined");
  caf::scoped_actor self{sys};
  Handle out;
  std::string failed;
  self->request(it->second, std::chrono::milliseconds(static_cast<int64_t>(members.spawn_timeout_s * 1000)),
                std::forward<Ts>(xs)...)
    .receive([&](Handle& h) { out = std::move(h); },
             [&](caf::error& e) { failed = sys.render(e); });
  if (!failed.empty() || !out)
    throw std::runtime_error(what + " on node '" + node + "': " + (failed.empty() ? "no handle" : failed));
  return out;
}

} // namespace

namespace {

void spawn_into(running_system& run, caf::actor_system& sys, const launch_plan& plan, const cluster_members& members);

/// Sends shutdown to every actor of `run` spawned so far (a start that
/// failed half-way: the actor system's end waits for them all).
void end_spawned(const running_system& run) {
  std::vector<caf::actor> all{caf::actor_cast<caf::actor>(run.control), caf::actor_cast<caf::actor>(run.coordinator),
                              caf::actor_cast<caf::actor>(run.supervisor),
                              caf::actor_cast<caf::actor>(run.peers.checkpointer),
                              caf::actor_cast<caf::actor>(run.peers.host_checkpointer),
                              caf::actor_cast<caf::actor>(run.peers.metrics),
                              caf::actor_cast<caf::actor>(run.peers.eval)};
  for (const auto& p : run.peers.prefetch)
    all.push_back(caf::actor_cast<caf::actor>(p));
  for (const auto& t : run.peers.targets)
    all.push_back(caf::actor_cast<caf::actor>(t));
  for (const auto& d : run.peers.drafters)
    all.push_back(caf::actor_cast<caf::actor>(d));
  for (const auto& a : all)
    if (a)
      caf::anon_send(a, shutdown_atom::value);
}

} // namespace

running_system spawn_system(caf::actor_system& sys, const launch_plan& plan, const cluster_members& members) {
  running_system run;
  try {
    spawn_into(run, sys, plan, members);
  } catch (...) {
    if (run.control_http)
      run.control_http->stop();
    end_spawned(run);
    throw;
  }
  return run;
}

namespace {

void spawn_into(running_system& run, caf::actor_system& sys, const launch_plan& plan, const cluster_members& members) {
  // Checkpointers: this process's for its drafters; each member with
  // drafters gets its own, and a router in front of them all.
  bool remote_drafters = false, local_drafters = false;
  for (const auto& d : plan.placement.drafters) {
    remote_drafters = remote_drafters || !d.node.empty();
    local_drafters = local_drafters || d.node.empty();
  }
  checkpointer_actor local_disk, local_host;
  if (local_drafters) {
    local_disk = spawn_checkpointer(sys, plan.checkpointer.dir, plan.checkpointer.keep);
    if (plan.coordinator.host_every > 0) {
      // A run resumed from a restore point in shared memory may roll back to
      // it until a checkpoint holds a newer step: never rotated away.
      const auto resumed = std::filesystem::path(plan.restore_from);
      const bool from_host = !resumed.empty() && resumed.parent_path() == plan.host_checkpointer.dir;
      local_host = spawn_checkpointer(sys, plan.host_checkpointer.dir, plan.host_checkpointer.keep,
                                      from_host ? resumed : std::filesystem::path{}, false);
    }
  }
  if (!remote_drafters) {
    run.peers.checkpointer = local_disk;
    run.peers.host_checkpointer = local_host;
  } else {
    std::map<std::string, std::pair<checkpointer_actor, checkpointer_actor>> by_node;
    std::vector<checkpointer_actor> disk, host;
    // The router takes the local ones over at once, so a failure below ends them too.
    std::vector<std::string> nodes;
    for (const auto& d : plan.placement.drafters)
      nodes.push_back(d.node);
    auto route = [&] {
      disk.resize(nodes.size());
      host.resize(nodes.size());
      run.peers.checkpointer = spawn_checkpoint_router(sys, disk, nodes, 0, members.door);
      if (plan.coordinator.host_every > 0)
        run.peers.host_checkpointer = spawn_checkpoint_router(sys, host, nodes, 1, members.door);
    };
    try {
      for (const auto& d : plan.placement.drafters) {
        if (!d.node.empty() && !by_node.count(d.node)) {
          auto& c = by_node[d.node];
          c.first = spawn_on<checkpointer_actor>(sys, members, d.node, "the checkpointer", spawn_ckpt_atom::value,
                                                 int32_t{0});
          if (plan.coordinator.host_every > 0)
            c.second = spawn_on<checkpointer_actor>(sys, members, d.node, "the restore-point checkpointer",
                                                    spawn_ckpt_atom::value, int32_t{1});
        }
        disk.push_back(d.node.empty() ? local_disk : by_node[d.node].first);
        host.push_back(d.node.empty() ? local_host : by_node[d.node].second);
      }
    } catch (...) {
      // The router takes whatever was spawned, so shutting it down ends them.
      if (disk.size() < nodes.size()) {
        disk.push_back(local_disk);
        host.push_back(local_host);
      }
      route();
      throw;
    }
    route();
  }

  auto faults = make_fault_plan(plan);

  // Drafter options per index, for the first spawn and every restart; the
  // coordinator's handle is known only once it is spawned.
  auto drafter_opts = std::make_shared<const std::vector<gpu::drafter_engine_options>>(plan.drafters);
  auto coordinator_handle = std::make_shared<coordinator_actor>();
  supervisor_options so;
  static_cast<supervisor_settings&>(so) = plan.supervisor;
  so.respawn_drafter = [&sys, drafter_opts, coordinator_handle, faults](int32_t index, const std::string& from) {
    return spawn_drafter(sys, index, (*drafter_opts)[static_cast<size_t>(index)], from,
                         *coordinator_handle, faults);
  };
  // Targets and prefetches are stateless: their first options again.
  auto target_opts = std::make_shared<const std::vector<gpu::target_engine_options>>(plan.targets);
  auto prefetch_opts = std::make_shared<const std::vector<gpu::prefetch_engine_options>>(plan.prefetch);
  auto slots = std::make_shared<const placement_plan>(plan.placement);
  so.respawn_target = [&sys, target_opts, slots, coordinator_handle, faults](int32_t i) {
    const auto ii = static_cast<size_t>(i);
    return spawn_target(sys, slots->targets[ii].index, (*target_opts)[ii], *coordinator_handle, faults);
  };
  so.respawn_prefetch = [&sys, prefetch_opts, slots, coordinator_handle, faults](int32_t i) {
    const auto ii = static_cast<size_t>(i);
    return spawn_prefetch(sys, slots->prefetch[ii].index, (*prefetch_opts)[ii], *coordinator_handle, faults);
  };
  // Members' actors are restarted through the door, without blocking.
  for (const auto& d : plan.placement.drafters)
    so.drafter_nodes.push_back(d.node);
  for (const auto& t : plan.placement.targets)
    so.target_nodes.push_back(t.node);
  so.cluster_door = members.door;
  so.rejoin_timeout_s = members.rejoin_timeout_s;
  run.supervisor = spawn_supervisor(sys, so);

  coordinator_options co;
  static_cast<coordinator_settings&>(co) = plan.coordinator;
  co.abort_group = [](const std::vector<uint8_t>& id, const std::string& why) {
    if (const auto n = gpu::nccl::abort_group(id, why))
      spdlog::warn("aborted {} communicator(s) of the broken data-parallel group: {}", n, why);
  };
  co.supervisor = run.supervisor;
  co.cluster_door = members.door;
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
    const auto& node = plan.placement.targets[i].node;
    const auto i32 = static_cast<int32_t>(i);
    if (!node.empty()) {
      run.peers.prefetch.push_back(spawn_on<prefetch_actor>(sys, members, node, "prefetch " + std::to_string(i),
                                                            spawn_prefetch_atom::value, i32, run.coordinator));
      run.peers.targets.push_back(spawn_on<target_actor>(sys, members, node, "target " + std::to_string(i),
                                                         spawn_target_atom::value, i32, run.coordinator));
      continue;
    }
    run.peers.prefetch.push_back(spawn_prefetch(sys, plan.placement.prefetch[i].index, plan.prefetch[i],
                                                run.coordinator, faults));
    run.peers.targets.push_back(spawn_target(sys, index, plan.targets[i], run.coordinator, faults));
  }
  for (size_t i = 0; i < plan.placement.drafters.size(); ++i) {
    const auto& node = plan.placement.drafters[i].node;
    if (!node.empty()) {
      run.peers.drafters.push_back(spawn_on<drafter_actor>(sys, members, node, "drafter " + std::to_string(i),
                                                           spawn_drafter_atom::value, static_cast<int32_t>(i),
                                                           plan.restore_from, run.coordinator));
      continue;
    }
    run.peers.drafters.push_back(spawn_drafter(sys, plan.placement.drafters[i].index, plan.drafters[i],
                                               plan.restore_from, run.coordinator, faults));
  }
  if (plan.eval)
    run.peers.eval = spawn_eval(sys, *plan.eval);
}

} // namespace

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
