// The supervisor: owns the drafters' incarnations and restart budgets,
// monitors every worker, restarts failed drafters, escalates the rest
// (messages/supervisor.hpp).  Cooperative: its handlers count, kill, spawn
// and send; the rollback a failure needs is the coordinator's.
#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/default_handler.hpp"
#include "actors/spawn.hpp"
#include "actors/time.hpp"
#include "actors/vitals.hpp"
#include "messages/errors.hpp"
#include "messages/node.hpp"

namespace tandem {

namespace {

/// A target or prefetch the supervisor restarts (stateless: its new
/// incarnation is its first again).
struct worker_slot {
  caf::actor_addr addr;   ///< the live incarnation (none while down)
  caf::actor handle;      ///< the same, to shut down at the end
  bool given_up = false;  ///< budget spent, or a bad input: never restarted again
  bool respawning = false;
  std::vector<std::pair<caf::actor_clock::time_point, std::string>> failures;
};

struct supervisor_state {
  static inline const char* name = "tandem.supervisor";
  supervisor_options opts;
  coordinator_actor coordinator;
  bool stopped = false;
  std::vector<drafter_actor> drafters;        ///< the live incarnation of each (null: none)
  std::vector<caf::actor_addr> drafter_addr;  ///< its address (down messages carry only that)
  std::vector<bool> given_up;                 ///< budget spent: never restarted again
  std::vector<bool> respawning;               ///< asked a cluster member to spawn it, no answer yet
  /// Drafter j's backoff is under way: the restore point its next
  /// incarnation starts from (cleared when it is spawned).
  std::vector<std::optional<std::string>> waiting;
  /// Why drafter j's last incarnation ended with errc::bad_input ("" = it
  /// did not): a deterministic bad input (a truncated target file, a
  /// corrupt checkpoint) fails the same way on every restart, so the
  /// restart it leads to is refused at once with this reason.
  std::vector<std::string> bad_input;
  // Failures per drafter within window_s, on the actor clock (the
  // deterministic clock in protocol tests, like the backoff timer).
  std::vector<std::vector<std::pair<caf::actor_clock::time_point, std::string>>> failures;
  std::map<caf::actor_addr, std::string> others;  ///< watched workers that are not restarted
  std::map<std::string, std::vector<worker_slot>> workers;  ///< targets and prefetches, by role
};

using self_ptr = supervisor_actor::stateful_pointer<supervisor_state>;

int32_t drafter_of(self_ptr self, const caf::actor_addr& a) {
  auto& v = self->state.drafter_addr;
  auto it = std::find(v.begin(), v.end(), a);
  return it == v.end() || !a ? -1 : static_cast<int32_t>(it - v.begin());
}

/// The role and index of the target or prefetch incarnation `a` (none: "").
std::pair<std::string, int32_t> worker_of(self_ptr self, const caf::actor_addr& a) {
  if (!a)
    return {"", -1};
  for (auto& [role, slots] : self->state.workers)
    for (size_t i = 0; i < slots.size(); ++i)
      if (slots[i].addr == a)
        return {role, static_cast<int32_t>(i)};
  return {"", -1};
}

/// Counts a failure in `f` (the window of supervision.window_s) and returns
/// how many it now holds.
int64_t count_failure(self_ptr self, std::vector<std::pair<caf::actor_clock::time_point, std::string>>& f,
                      const std::string& why) {
  const auto now = self->clock().now();
  f.emplace_back(now, why);
  f.erase(std::remove_if(f.begin(), f.end(),
                         [&](const auto& x) {
                           return std::chrono::duration<double>(now - x.first).count() > self->state.opts.window_s;
                         }),
          f.end());
  return static_cast<int64_t>(f.size());
}

/// The restart budget's report: `what` failed n times within the window.
std::string budget_report(self_ptr self, const std::string& what,
                          const std::vector<std::pair<caf::actor_clock::time_point, std::string>>& f) {
  const auto& o = self->state.opts;
  std::string report = what + " failed " + std::to_string(f.size()) + " times within "
                       + std::to_string(static_cast<int64_t>(o.window_s)) + " s (restart budget "
                       + std::to_string(o.restart_budget) + "):";
  for (auto& [t, w] : f)
    report += "\n  - " + w;
  return report;
}

double backoff_for(self_ptr self, int64_t n) {
  const auto& b = self->state.opts.backoff_s;
  return b.empty() ? 0.0 : b[std::min(b.size(), static_cast<size_t>(n)) - 1];
}

/// An exit reason in errc::bad_input: deterministic, not worth a restart.
bool is_bad_input(const caf::error& reason) {
  return reason.category() == error_category
         && reason.code() == static_cast<uint8_t>(errc::bad_input);
}

/// An exit reason in errc::device_lost: the device's context is poisoned;
/// no restart in this process can work.
bool is_device_lost(const caf::error& reason) {
  return reason.category() == error_category
         && reason.code() == static_cast<uint8_t>(errc::device_lost);
}

/// The context sentence of a Tandem error (what make_error was given), or
/// the rendered error when it has none.
std::string bad_input_text(const caf::error& reason, const std::string& rendered) {
  const auto& ctx = reason.context();
  if (ctx.match_elements<std::string>())
    return ctx.get_as<std::string>(0);
  return rendered;
}

void adopt(self_ptr self, size_t d, drafter_actor h) {
  auto& s = self->state;
  self->monitor(h);
  s.drafter_addr[d] = h.address();
  s.drafters[d] = std::move(h);
}

template <class Handle>
void watch(self_ptr self, const Handle& h, std::string what) {
  if (!h)
    return;
  self->monitor(h);
  self->state.others[h.address()] = std::move(what);
}

caf::result<restart_plan> restart(self_ptr self, int32_t d, const std::string& why,
                                  const std::string& from) {
  auto& s = self->state;
  if (d < 0 || static_cast<size_t>(d) >= s.drafters.size())
    return make_error(errc::bad_input, "supervisor: no drafter " + std::to_string(d));
  const auto di = static_cast<size_t>(d);
  if (!s.bad_input[di].empty()) {
    // Not counted against the budget and not retried: the same input fails
    // the same way after every backoff.  The run stops with the error.
    s.given_up[di] = true;
    return make_error(errc::bad_input, "drafter " + std::to_string(d) + " cannot start: "
                                         + s.bad_input[di]
                                         + " (bad input is not retried: fix it and run again)");
  }
  if (s.given_up[di])
    return make_error(errc::device_failure, "supervisor: drafter " + std::to_string(d)
                                              + " is past its restart budget");
  // The failed incarnation, if still alive (non-finite loss, hang, missed
  // heartbeat), is killed: a hung one dies when it unblocks.  Its down
  // message no longer matches and is ignored.
  if (s.drafters[di])
    self->send_exit(s.drafters[di], caf::exit_reason::kill);
  s.drafters[di] = drafter_actor{};
  s.drafter_addr[di] = caf::actor_addr{};
  const auto n = count_failure(self, s.failures[di], why);
  if (n > s.opts.restart_budget) {
    s.given_up[di] = true;
    return make_error(errc::device_failure, budget_report(self, "drafter " + std::to_string(d), s.failures[di]));
  }
  const double wait = backoff_for(self, n);
  s.waiting[di] = from;
  self->delayed_send(self, seconds_to<std::chrono::milliseconds>(wait), respawn_atom::value, d, from);
  return restart_plan{n, s.opts.restart_budget, wait};
}

/// Target or prefetch `i` failed (`why`): counted like a drafter's failure;
/// its new incarnation follows the backoff.
caf::result<restart_plan> restart_worker(self_ptr self, const std::string& role, int32_t i, const std::string& why) {
  auto& s = self->state;
  auto it = s.workers.find(role);
  if (it == s.workers.end() || i < 0 || static_cast<size_t>(i) >= it->second.size())
    return make_error(errc::bad_input, "supervisor: no " + role + " " + std::to_string(i));
  auto& w = it->second[static_cast<size_t>(i)];
  if (w.given_up)
    return make_error(errc::device_failure, "supervisor: " + role + " " + std::to_string(i)
                                              + " is past its restart budget");
  const auto n = count_failure(self, w.failures, why);
  if (n > s.opts.restart_budget) {
    w.given_up = true;
    return make_error(errc::device_failure, budget_report(self, role + " " + std::to_string(i), w.failures));
  }
  const double wait = backoff_for(self, n);
  self->delayed_send(self, seconds_to<std::chrono::milliseconds>(wait), respawn_atom::value, role, i);
  return restart_plan{n, s.opts.restart_budget, wait};
}

/// Watches target or prefetch `i`'s new incarnation and hands it to the coordinator.
template <class Handle>
void adopt_worker(self_ptr self, const std::string& role, int32_t i, Handle h) {
  auto& s = self->state;
  auto& w = s.workers[role][static_cast<size_t>(i)];
  w.respawning = false;
  if (s.stopped || w.addr || w.given_up) {
    caf::anon_send(h, shutdown_atom::value);
    return;
  }
  self->monitor(h);
  w.addr = h.address();
  w.handle = caf::actor_cast<caf::actor>(h);
  self->send(s.coordinator, worker_up_atom::value, i, std::move(h));
}

template <class Handle, class Atom>
void respawn_on_node(self_ptr self, const std::string& role, int32_t i, const std::string& node, Atom atom) {
  auto& s = self->state;
  const auto wait = std::chrono::milliseconds(static_cast<int64_t>((s.opts.rejoin_timeout_s + 60) * 1000));
  self->request(s.opts.cluster_door, wait, atom, node, i, s.coordinator)
    .then([self, role, i](Handle& fresh) { adopt_worker(self, role, i, std::move(fresh)); },
          [self, role, i, node](caf::error& e) {
            auto& s = self->state;
            auto& w = s.workers[role][static_cast<size_t>(i)];
            w.respawning = false;
            if (s.stopped)
              return;
            w.given_up = true;
            auto why = role + " " + std::to_string(i) + " could not be restarted on node '" + node
                       + "': " + self->system().render(e);
            spdlog::error("tandem.supervisor: {}", why);
            if (is_bad_input(e))
              self->send(s.coordinator, escalate_atom::value, bad_input_atom::value, std::move(why));
            else
              self->send(s.coordinator, escalate_atom::value, std::move(why));
          });
}

void respawn_worker(self_ptr self, const std::string& role, int32_t i) {
  auto& s = self->state;
  auto& w = s.workers[role][static_cast<size_t>(i)];
  if (s.stopped || w.addr || w.given_up || w.respawning)
    return;
  const auto ii = static_cast<size_t>(i);
  const bool target = role == target_role;
  if (ii < s.opts.target_nodes.size() && !s.opts.target_nodes[ii].empty() && s.opts.cluster_door) {
    w.respawning = true;
    if (target)
      respawn_on_node<target_actor>(self, role, i, s.opts.target_nodes[ii], spawn_target_atom::value);
    else
      respawn_on_node<prefetch_actor>(self, role, i, s.opts.target_nodes[ii], spawn_prefetch_atom::value);
    return;
  }
  if (target && s.opts.respawn_target)
    adopt_worker(self, role, i, s.opts.respawn_target(i));
  else if (!target && s.opts.respawn_prefetch)
    adopt_worker(self, role, i, s.opts.respawn_prefetch(i));
  else
    self->send(s.coordinator, escalate_atom::value, role + " " + std::to_string(i) + " cannot be restarted here");
}

void respawn(self_ptr self, int32_t d, const std::string& from) {
  auto& s = self->state;
  const auto di = static_cast<size_t>(d);
  if (s.stopped || s.drafters[di] || s.given_up[di])
    return;
  s.waiting[di].reset();
  if (di < s.opts.drafter_nodes.size() && !s.opts.drafter_nodes[di].empty() && s.opts.cluster_door) {
    // On a cluster member: its agent spawns it, once the node is (back) up.
    if (s.respawning[di])
      return;
    s.respawning[di] = true;
    const auto node = s.opts.drafter_nodes[di];
    const auto wait = std::chrono::milliseconds(static_cast<int64_t>((s.opts.rejoin_timeout_s + 60) * 1000));
    self->request(s.opts.cluster_door, wait, spawn_drafter_atom::value, node, d, from, s.coordinator)
      .then(
        [self, d, di](drafter_actor& fresh) {
          auto& s = self->state;
          s.respawning[di] = false;
          if (s.stopped || s.drafters[di] || s.given_up[di]) {
            caf::anon_send(fresh, shutdown_atom::value);
            return;
          }
          adopt(self, di, fresh);
          self->send(s.coordinator, drafter_up_atom::value, d, std::move(fresh));
        },
        [self, d, di, node](caf::error& e) {
          auto& s = self->state;
          s.respawning[di] = false;
          if (s.stopped)
            return;
          s.given_up[di] = true;
          auto why = "drafter " + std::to_string(d) + " could not be restarted on node '" + node
                     + "': " + self->system().render(e);
          spdlog::error("tandem.supervisor: {}", why);
          if (is_bad_input(e))
            self->send(s.coordinator, escalate_atom::value, bad_input_atom::value, d, std::move(why));
          else
            self->send(s.coordinator, escalate_atom::value, d, std::move(why));
        });
    return;
  }
  auto fresh = s.opts.respawn_drafter(d, from);
  adopt(self, di, fresh);
  self->send(s.coordinator, drafter_up_atom::value, d, std::move(fresh));
}

} // namespace

supervisor_actor spawn_supervisor(caf::actor_system& sys, supervisor_options opts) {
  auto behavior = [](self_ptr self, supervisor_options o) -> supervisor_actor::behavior_type {
    install_default_handler(self, supervisor_state::name);
    self->state.opts = std::move(o);
    auto meter = std::make_shared<vitals_meter>(self->system(), "supervisor", 0, false);
    meter->figures = [self] {
      double restarts = 0;
      for (const auto& f : self->state.failures)
        restarts += static_cast<double>(f.size());
      for (const auto& [role, slots] : self->state.workers)
        for (const auto& w : slots)
          restarts += static_cast<double>(w.failures.size());
      return std::vector<vitals_figure>{{"failures_in_window", restarts}};
    };
    self->set_down_handler([self](caf::down_msg& m) {
      auto& s = self->state;
      if (s.stopped)
        return;
      if (is_device_lost(m.reason)) {
        // Whoever it was: the process cannot go on (messages/coordinator.hpp).
        if (auto d = drafter_of(self, m.source); d >= 0) {
          s.drafters[static_cast<size_t>(d)] = drafter_actor{};
          s.drafter_addr[static_cast<size_t>(d)] = caf::actor_addr{};
        }
        s.others.erase(m.source);
        auto why = bad_input_text(m.reason, self->system().render(m.reason));
        spdlog::error("tandem.supervisor: {}", why);
        self->send(s.coordinator, device_lost_atom::value, std::move(why));
        return;
      }
      if (auto d = drafter_of(self, m.source); d >= 0) {
        // Its restart waits for the coordinator's rollback and request.
        const auto di = static_cast<size_t>(d);
        s.drafters[di] = drafter_actor{};
        s.drafter_addr[di] = caf::actor_addr{};
        auto why = self->system().render(m.reason);
        if (m.reason == caf::exit_reason::remote_link_unreachable)
          why = node_lost_prefix + why;
        if (is_bad_input(m.reason))
          s.bad_input[di] = bad_input_text(m.reason, why);
        self->send(s.coordinator, drafter_down_atom::value, d, std::move(why));
        return;
      }
      if (auto [role, i] = worker_of(self, m.source); i >= 0) {
        auto& w = s.workers[role][static_cast<size_t>(i)];
        w.addr = caf::actor_addr{};
        w.handle = caf::actor{};
        auto why = role + " " + std::to_string(i) + " ended: " + self->system().render(m.reason);
        if (is_bad_input(m.reason)) {
          // Its weights or data do not load: the same on every restart.
          w.given_up = true;
          why = bad_input_text(m.reason, why) + " (bad input is not retried: fix it and run again)";
          spdlog::error("tandem.supervisor: {}", why);
          self->send(s.coordinator, escalate_atom::value, bad_input_atom::value, std::move(why));
          return;
        }
        if (m.reason == caf::exit_reason::remote_link_unreachable)
          why = node_lost_prefix + why;
        spdlog::warn("tandem.supervisor: {}", why);
        self->send(s.coordinator, worker_down_atom::value, role, i, std::move(why));
        return;
      }
      auto it = s.others.find(m.source);
      if (it == s.others.end())
        return;  // an incarnation this supervisor replaced
      auto why = it->second + " ended: " + self->system().render(m.reason)
                 + " (checkpointers and the metrics actor are not restarted)";
      s.others.erase(it);
      spdlog::error("tandem.supervisor: {}", why);
      self->send(s.coordinator, escalate_atom::value, std::move(why));
    });
    return counted(meter, supervisor_actor::behavior_type{
      vitals_handler(self, meter),
      [self](supervise_atom, coordinator_actor& coordinator, coordinator_peers& peers) {
        auto& s = self->state;
        s.coordinator = std::move(coordinator);
        const auto n = peers.drafters.size();
        s.drafters.assign(n, drafter_actor{});
        s.drafter_addr.assign(n, caf::actor_addr{});
        s.given_up.assign(n, false);
        s.respawning.assign(n, false);
        s.waiting.assign(n, std::nullopt);
        s.bad_input.assign(n, std::string{});
        s.failures.assign(n, {});
        for (size_t d = 0; d < n; ++d)
          adopt(self, d, peers.drafters[d]);
        auto watch_workers = [&](const std::string& role, const auto& handles) {
          auto& slots = s.workers[role];
          slots.assign(handles.size(), worker_slot{});
          for (size_t i = 0; i < handles.size(); ++i)
            if (handles[i]) {
              self->monitor(handles[i]);
              slots[i].addr = handles[i].address();
              slots[i].handle = caf::actor_cast<caf::actor>(handles[i]);
            }
        };
        watch_workers(target_role, peers.targets);
        watch_workers(prefetch_role, peers.prefetch);
        watch(self, peers.checkpointer, std::string("the checkpointer"));
        watch(self, peers.host_checkpointer, std::string("the host checkpointer"));
        watch(self, peers.metrics, std::string("the metrics actor"));
      },
      [self](restart_atom, int32_t d, const std::string& why, const std::string& from) {
        return restart(self, d, why, from);
      },
      [self](respawn_atom, int32_t d, const std::string& from) { respawn(self, d, from); },
      [self](restart_atom, const std::string& role, int32_t i, const std::string& why) {
        return restart_worker(self, role, i, why);
      },
      [self](respawn_atom, const std::string& role, int32_t i) { respawn_worker(self, role, i); },
      [self](hurry_atom) {
        // The backoffs' own timers find their drafters up and do nothing.
        auto& s = self->state;
        for (size_t d = 0; d < s.waiting.size(); ++d)
          if (auto from = s.waiting[d])
            respawn(self, static_cast<int32_t>(d), *from);
      },
      [self](shutdown_atom) {
        auto& s = self->state;
        s.stopped = true;
        for (auto& d : s.drafters)
          if (d)
            self->send(d, shutdown_atom::value);
        // Restarted targets and prefetches are only known here.
        for (auto& [role, slots] : s.workers)
          for (auto& w : slots)
            if (w.handle)
              caf::anon_send(w.handle, shutdown_atom::value);
        self->quit();
      },
    });
  };
  return sys.spawn(behavior, std::move(opts));
}

} // namespace tandem
