// The supervisor: owns the drafters' incarnations and restart budgets,
// monitors every worker, restarts failed drafters, escalates the rest
// (messages/supervisor.hpp).  Cooperative: its handlers count, kill, spawn
// and send; the rollback a failure needs is the coordinator's.
#include <algorithm>
#include <chrono>
#include <map>
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

struct supervisor_state {
  static inline const char* name = "tandem.supervisor";
  supervisor_options opts;
  coordinator_actor coordinator;
  bool stopped = false;
  std::vector<drafter_actor> drafters;        ///< the live incarnation of each (null: none)
  std::vector<caf::actor_addr> drafter_addr;  ///< its address (down messages carry only that)
  std::vector<bool> given_up;                 ///< budget spent: never restarted again
  std::vector<bool> respawning;               ///< asked a cluster member to spawn it, no answer yet
  /// Why drafter j's last incarnation ended with errc::bad_input ("" = it
  /// did not): a deterministic bad input (a truncated target file, a
  /// corrupt checkpoint) fails the same way on every restart, so the
  /// restart it leads to is refused at once with this reason.
  std::vector<std::string> bad_input;
  // Failures per drafter within window_s, on the actor clock (the
  // deterministic clock in protocol tests, like the backoff timer).
  std::vector<std::vector<std::pair<caf::actor_clock::time_point, std::string>>> failures;
  std::map<caf::actor_addr, std::string> others;  ///< watched workers that are not restarted
};

using self_ptr = supervisor_actor::stateful_pointer<supervisor_state>;

int32_t drafter_of(self_ptr self, const caf::actor_addr& a) {
  auto& v = self->state.drafter_addr;
  auto it = std::find(v.begin(), v.end(), a);
  return it == v.end() || !a ? -1 : static_cast<int32_t>(it - v.begin());
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
  const auto now = self->clock().now();
  auto& f = s.failures[di];
  f.emplace_back(now, why);
  f.erase(std::remove_if(f.begin(), f.end(),
                         [&](const auto& x) {
                           return std::chrono::duration<double>(now - x.first).count() > s.opts.window_s;
                         }),
          f.end());
  const auto n = static_cast<int64_t>(f.size());
  if (n > s.opts.restart_budget) {
    s.given_up[di] = true;
    std::string report = "drafter " + std::to_string(d) + " failed " + std::to_string(n)
                         + " times within " + std::to_string(static_cast<int64_t>(s.opts.window_s))
                         + " s (restart budget " + std::to_string(s.opts.restart_budget) + "):";
    for (auto& [t, w] : f)
      report += "\n  - " + w;
    return make_error(errc::device_failure, report);
  }
  const auto& b = s.opts.backoff_s;
  const double wait = b.empty() ? 0.0 : b[std::min(b.size(), static_cast<size_t>(n)) - 1];
  self->delayed_send(self, seconds_to<std::chrono::milliseconds>(wait), respawn_atom::value, d, from);
  return restart_plan{n, s.opts.restart_budget, wait};
}

void respawn(self_ptr self, int32_t d, const std::string& from) {
  auto& s = self->state;
  const auto di = static_cast<size_t>(d);
  if (s.stopped || s.drafters[di] || s.given_up[di])
    return;
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
          self->send(s.coordinator, escalate_atom::value, std::move(why));
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
      auto it = s.others.find(m.source);
      if (it == s.others.end())
        return;  // an incarnation this supervisor replaced
      auto why = it->second + " ended: " + self->system().render(m.reason)
                 + " (only drafters are restarted)";
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
        s.bad_input.assign(n, std::string{});
        s.failures.assign(n, {});
        for (size_t d = 0; d < n; ++d)
          adopt(self, d, peers.drafters[d]);
        for (size_t i = 0; i < peers.targets.size(); ++i)
          watch(self, peers.targets[i], "target " + std::to_string(i));
        for (size_t i = 0; i < peers.prefetch.size(); ++i)
          watch(self, peers.prefetch[i], "prefetch " + std::to_string(i));
        watch(self, peers.checkpointer, std::string("the checkpointer"));
        watch(self, peers.host_checkpointer, std::string("the host checkpointer"));
        watch(self, peers.metrics, std::string("the metrics actor"));
      },
      [self](restart_atom, int32_t d, const std::string& why, const std::string& from) {
        return restart(self, d, why, from);
      },
      [self](respawn_atom, int32_t d, const std::string& from) { respawn(self, d, from); },
      [self](shutdown_atom) {
        auto& s = self->state;
        s.stopped = true;
        for (auto& d : s.drafters)
          if (d)
            self->send(d, shutdown_atom::value);
        self->quit();
      },
    });
  };
  return sys.spawn(behavior, std::move(opts));
}

} // namespace tandem
