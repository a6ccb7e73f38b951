// The cluster's actors (actors/cluster.hpp, messages/node.hpp): the leader's
// door and checkpoint router, and a member's node agent.
#include "actors/cluster.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#ifdef TANDEM_HAVE_TLS
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#endif

#include "actors/control_http.hpp"  // same_token
#include "actors/default_handler.hpp"
#include "actors/spawn.hpp"
#include "actors/system.hpp"
#include "actors/vitals.hpp"
#include "gpu/transport/link.hpp"
#include "launch/plan.hpp"
#include "messages/errors.hpp"
#include "messages/supervisor.hpp"

namespace tandem {

namespace {

std::string to_hex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out.push_back(digits[p[i] >> 4]);
    out.push_back(digits[p[i] & 0xf]);
  }
  return out;
}

std::vector<unsigned char> from_hex(const std::string& text) {
  std::string t;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c)))
      t.push_back(c);
  if (t.empty() || t.size() % 2 != 0 || t.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
    throw std::runtime_error("the cluster secret is not hex text (tandem certs writes one)");
  std::vector<unsigned char> out;
  for (size_t i = 0; i < t.size(); i += 2)
    out.push_back(static_cast<unsigned char>(std::stoi(t.substr(i, 2), nullptr, 16)));
  return out;
}

} // namespace

std::string hmac_sha256_hex(const std::string& key, const std::string& message) {
#ifdef TANDEM_HAVE_TLS
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &len))
    throw std::runtime_error("HMAC-SHA256 failed");
  return to_hex(mac, len);
#else
  (void)key;
  (void)message;
  throw std::runtime_error("join tokens need OpenSSL (libssl-dev), which this build lacks");
#endif
}

std::string join_token(const std::string& secret_hex, const std::string& name) {
  const auto key = from_hex(secret_hex);
  return hmac_sha256_hex(std::string(key.begin(), key.end()), name);
}

std::string hello_mismatch(const std::vector<std::string>& leader, const std::vector<std::string>& member) {
  using namespace hello_fields;
  if (member.size() < count || member[protocol] != leader[protocol])
    return "its hello is not " + std::string(protocol_name) + " (" + std::to_string(member.size())
           + " fields; a Tandem older or newer than the leader's " + leader[version] + ")";
  const std::pair<size_t, const char*> checked[] = {
    {version, "Tandem"}, {commit, "commit"}, {torch, "LibTorch"}, {cuda, "CUDA"}, {nccl, "NCCL"}};
  std::string why;
  for (const auto& [i, what] : checked)
    if (member[i] != leader[i])
      why += std::string(why.empty() ? "" : ", ") + what + " " + (member[i].empty() ? "(none)" : member[i])
             + " (the leader has " + (leader[i].empty() ? "(none)" : leader[i]) + ")";
  return why.empty() ? "" : "it runs another build: " + why + "; every node needs the same build";
}

int32_t hello_gpus(const std::string& devices) {
  if (devices == "cpu")
    return 0;
  if (devices.rfind("cuda:", 0) == 0 && devices.size() > 5
      && devices.find_first_not_of("0123456789", 5) == std::string::npos && devices.size() < 12)
    return static_cast<int32_t>(std::stol(devices.substr(5)));
  return -1;
}

// ------------------------------------------------------------------ door --

namespace {

using expire_atom = caf::atom_constant<caf::atom("expire")>;

/// A spawn asked of a node that is not up: answered when it (re)joins and
/// has taken the run's plan, or with an error at its deadline.
struct pending_spawn {
  uint64_t id = 0;
  std::string node;
  caf::response_promise promise;
  std::function<void(caf::response_promise&, const node_actor&)> forward;
  caf::actor_clock::time_point deadline;
};

struct door_state {
  static inline const char* name = "tandem.door";
  std::set<std::string> joined;                  ///< hello accepted, agent not yet up
  std::map<std::string, node_actor> up;          ///< agent up
  std::set<std::string> ready;                   ///< agent up and holding the run's plan
  std::map<caf::actor_addr, std::string> by_addr;
  std::map<std::string, int32_t> gpus;
  /// Where every node that holds actors runs ("the leader", "node 'x'" →
  /// its host, and whether it offers only the CPU): CPU payloads do not
  /// cross hosts (shared memory), GPU payloads do (NCCL links).
  struct host_entry {
    std::string host;
    bool cpu = false;
  };
  std::map<std::string, host_entry> hosts;
  std::optional<node_setup> setup;               ///< the run's plan's facts, once the leader has them
  std::vector<pending_spawn> pending;
  uint64_t next_pending = 1;
  double rejoin_timeout_s = 300;
  /// placement.spares, and the drafter each one holds now (−1: free).
  struct spare_slot {
    std::string node;
    int32_t device = -1;
    int32_t drafter = -1;
  };
  std::vector<spare_slot> spares;
  std::vector<std::string> drafter_nodes;  ///< the plan's node of each drafter
  std::map<int32_t, std::string> moved;    ///< drafter → the spare's node it runs on now
};

using door_ptr = caf::stateful_actor<door_state>*;

/// Sends `node`'s agent the run's plan; when it has it, the spawns waiting
/// for the node go to it, and `then` runs with "" or the failure.
void set_up(door_ptr self, const std::string& node, std::function<void(const std::string&)> then) {
  auto& s = self->state;
  auto agent = s.up.at(node);
  self->request(agent, std::chrono::seconds(60), setup_atom::value, *s.setup)
    .then(
      [self, node, agent, then](const std::string&) {
        auto& s = self->state;
        if (!s.up.count(node) || s.up[node] != agent)
          return;  // lost again meanwhile
        s.ready.insert(node);
        std::vector<pending_spawn> keep;
        for (auto& p : s.pending) {
          if (p.node == node)
            p.forward(p.promise, agent);
          else
            keep.push_back(std::move(p));
        }
        s.pending = std::move(keep);
        if (then)
          then("");
      },
      [self, node, then](caf::error& e) {
        const auto why = "node '" + node + "' could not take the run's plan: " + self->system().render(e);
        spdlog::error("cluster: {}", why);
        if (then)
          then(why);
      });
}

/// Forwards a spawn to `node` now, or keeps it (answering `rp`) until the
/// node is up again.
template <class... Ts>
void spawn_into(door_ptr self, caf::response_promise rp, const std::string& node, Ts... xs) {
  auto& s = self->state;
  auto forward = [xs...](caf::response_promise& p, const node_actor& agent) { p.delegate(agent, xs...); };
  if (s.ready.count(node)) {
    forward(rp, s.up[node]);
    return;
  }
  pending_spawn p;
  p.id = s.next_pending++;
  p.node = node;
  p.promise = rp;
  p.forward = forward;
  const auto wait = std::chrono::milliseconds(static_cast<int64_t>(s.rejoin_timeout_s * 1000));
  p.deadline = self->clock().now() + wait;
  spdlog::warn("cluster: waiting up to {:.0f} s for node '{}' to join again", s.rejoin_timeout_s, node);
  self->delayed_send(self, wait, expire_atom::value, p.id);
  s.pending.push_back(std::move(p));
}

template <class... Ts>
caf::response_promise spawn_via(door_ptr self, const std::string& node, Ts... xs) {
  auto rp = self->make_response_promise();
  spawn_into(self, rp, node, xs...);
  return rp;
}

/// Drafter `index` of `node`, which is not up: on the first free spare whose
/// node is (placement.spares), else when `node` joins again.  A spare that
/// cannot take it (its node cannot read the restore point) is left free.
caf::response_promise spawn_drafter_somewhere(door_ptr self, const std::string& node, int32_t index,
                                              const std::string& from, const coordinator_actor& c) {
  auto& s = self->state;
  // A new incarnation: the spare its last one held is free, and tried first
  // (its restore point in memory may be there).
  std::vector<size_t> order;
  for (size_t k = 0; k < s.spares.size(); ++k)
    if (s.spares[k].drafter == index) {
      s.spares[k].drafter = -1;
      order.insert(order.begin(), k);
    } else {
      order.push_back(k);
    }
  s.moved.erase(index);
  auto rp = self->make_response_promise();
  if (!s.ready.count(node)) {
    for (auto k : order) {
      auto& sp = s.spares[k];
      if (sp.drafter >= 0 || sp.node == node || !s.ready.count(sp.node))
        continue;
      sp.drafter = index;
      const auto where = sp.node + ":" + (sp.device < 0 ? std::string("cpu") : "cuda:" + std::to_string(sp.device));
      spdlog::warn("cluster: drafter {} of node '{}' starts on the spare {}", index, node, where);
      self->request(s.up[sp.node], std::chrono::seconds(60), spawn_spare_atom::value, index, sp.device, from, c)
        .then(
          [self, rp, index, k](drafter_actor& d) mutable {
            self->state.moved[index] = self->state.spares[k].node;
            rp.deliver(d);
          },
          [self, rp, index, k, node, from, c, where](caf::error& e) mutable {
            spdlog::warn("cluster: the spare {} cannot take drafter {}: {}; waiting for node '{}'", where, index,
                         self->system().render(e), node);
            self->state.spares[k].drafter = -1;
            spawn_into(self, rp, node, spawn_drafter_atom::value, index, from, c);
          });
      return rp;
    }
  }
  spawn_into(self, rp, node, spawn_drafter_atom::value, index, from, c);
  return rp;
}

caf::behavior door_behavior(door_ptr self, door_options o) {
  install_default_handler(self, door_state::name);
  auto opts = std::make_shared<const door_options>(std::move(o));
  self->set_down_handler([self, opts](caf::down_msg& m) {
    auto& s = self->state;
    auto it = s.by_addr.find(m.source);
    if (it == s.by_addr.end())
      return;
    const auto name = it->second;
    s.by_addr.erase(it);
    s.up.erase(name);
    s.ready.erase(name);
    s.joined.erase(name);
    spdlog::warn("cluster: node '{}' is lost: {}", name, self->system().render(m.reason));
    if (opts->listener)
      self->send(opts->listener, node_up_atom::value, name, int32_t{-1}, node_actor{});
  });
  return {
    [self, opts](join_atom, const std::vector<std::string>& hello) -> caf::result<std::vector<std::string>> {
      using namespace hello_fields;
      auto& s = self->state;
      if (auto why = hello_mismatch(opts->hello, hello); !why.empty()) {
        const auto who = hello.size() > name ? "node '" + hello[name] + "'" : std::string("a node");
        spdlog::warn("cluster: {} refused: {}", who, why);
        return make_error(errc::bad_input, who + " refused: " + why);
      }
      const auto& n = hello[name];
      const auto& expected = opts->expected;
      if (std::find(expected.begin(), expected.end(), n) == expected.end()) {
        std::string list;
        for (const auto& e : expected)
          list += (list.empty() ? "" : ", ") + e;
        spdlog::warn("cluster: node '{}' refused: the placement does not name it", n);
        return make_error(errc::bad_input, "node '" + n + "' refused: the placement names no such node (it names: "
                                             + (list.empty() ? std::string("none") : list) + ")");
      }
      if (!opts->secret_hex.empty()) {
        std::string want;
        try {
          want = join_token(opts->secret_hex, n);
        } catch (const std::exception& e) {
          return make_error(errc::bad_input, std::string("the leader cannot check join tokens: ") + e.what());
        }
        if (hello[token].empty() || !same_token(want, hello[token])) {
          spdlog::warn("cluster: node '{}' refused: {} join token", n, hello[token].empty() ? "no" : "a wrong");
          return make_error(errc::bad_input,
                            "node '" + n + "' refused: " + (hello[token].empty() ? "no" : "a wrong")
                              + " join token (the leader checks cluster.secret; give the node its "
                                "NODE/join.token from `tandem certs` with --token-file)");
        }
      }
      if (s.up.count(n)) {
        spdlog::warn("cluster: node '{}' refused: a node of that name is up", n);
        return make_error(errc::bad_input, "node '" + n + "' refused: a node of that name has joined already");
      }
      const auto g = hello_gpus(hello[devices]);
      if (g < 0)
        return make_error(errc::bad_input, "node '" + n + "' refused: devices '" + hello[devices]
                                             + "' is neither \"cpu\" nor \"cuda:N\"");
      if (s.setup) {
        // A node joining a run in progress must offer what the plan gave it.
        const auto& names = s.setup->node_names;
        const auto at = std::find(names.begin(), names.end(), n) - names.begin();
        if (static_cast<size_t>(at) < names.size() && g < s.setup->node_gpus[static_cast<size_t>(at)])
          return make_error(errc::bad_input, "node '" + n + "' refused: it offers " + hello[devices]
                                               + " but the run's plan placed actors on "
                                               + std::to_string(s.setup->node_gpus[static_cast<size_t>(at)])
                                               + " GPU(s) of it");
      }
      if (opts->leader_holds_actors && !s.hosts.count("the leader"))
        s.hosts["the leader"] = {opts->hello[host], hello_gpus(opts->hello[devices]) == 0};
      const auto who = "node '" + n + "'";
      for (const auto& [other, h] : s.hosts) {
        if (other == who || h.host == hello[host] || (!h.cpu && g > 0))
          continue;
        // CPU payloads cross processes through shared memory: one host only.
        const auto why = who + " refused: it runs on host '" + hello[host] + "' but " + other + " runs on '"
                         + h.host + "', and " + (g == 0 ? who : other)
                         + " offers only the CPU: CPU processes exchange batches and features through shared "
                           "memory, which needs one host (the CPU path is for tests and demos); between hosts "
                           "they travel over NCCL, which needs GPUs at both ends";
        spdlog::warn("cluster: {}", why);
        return make_error(errc::bad_input, why);
      }
      s.hosts[who] = {hello[host], g == 0};
      s.joined.insert(n);
      s.gpus[n] = g;
      spdlog::info("cluster: node '{}' (pid {}, {}) said hello", n, hello[pid],
                   g == 0 ? std::string("CPU") : std::to_string(g) + " GPU" + (g > 1 ? "s" : ""));
      auto mine = opts->hello;
      return mine;
    },
    [self, opts](node_up_atom, const std::string& n, const node_actor& agent) -> caf::result<int32_t> {
      auto& s = self->state;
      if (!s.joined.count(n) || s.up.count(n) || !agent)
        return make_error(errc::bad_input, "node '" + n + "': node_up without an accepted hello");
      const auto addr = caf::actor_cast<caf::actor_addr>(agent);
      self->monitor(agent);
      s.up[n] = agent;
      s.by_addr[addr] = n;
      const auto& e = opts->expected;
      const auto number = static_cast<int32_t>(std::find(e.begin(), e.end(), n) - e.begin()) + 1;
      if (opts->listener)
        self->send(opts->listener, node_up_atom::value, n, s.gpus[n], agent);
      if (s.setup) {
        spdlog::info("cluster: node '{}' joined the run again", n);
        set_up(self, n, nullptr);
      }
      return number;
    },
    [self](setup_atom, const node_setup& setup, double rejoin_timeout_s, const std::vector<std::string>& spares,
           const std::vector<std::string>& drafter_nodes) -> caf::result<std::string> {
      // The run's plan is made: every member up gets it; a node that joins
      // later (again) gets it when it does.  Spares: "NODE:cpu", "NODE:cuda:N".
      auto& s = self->state;
      s.setup = setup;
      s.rejoin_timeout_s = rejoin_timeout_s;
      s.drafter_nodes = drafter_nodes;
      s.spares.clear();
      for (const auto& text : spares) {
        const auto colon = text.find(':');
        door_state::spare_slot sp;
        sp.node = text.substr(0, colon);
        const auto device = colon == std::string::npos ? std::string("cpu") : text.substr(colon + 1);
        sp.device = device.rfind("cuda:", 0) == 0 ? static_cast<int32_t>(std::stoi(device.substr(5))) : -1;
        s.spares.push_back(sp);
      }
      auto rp = self->make_response_promise<std::string>();
      if (s.up.empty()) {
        rp.deliver(std::string("ready"));
        return rp;
      }
      auto left = std::make_shared<size_t>(s.up.size());
      auto failed = std::make_shared<std::string>();
      std::vector<std::string> names;
      for (const auto& [n, agent] : s.up)
        names.push_back(n);
      for (const auto& n : names)
        set_up(self, n, [rp, left, failed](const std::string& why) mutable {
          if (!why.empty() && failed->empty())
            *failed = why;
          if (--*left == 0) {
            if (failed->empty())
              rp.deliver(std::string("ready"));
            else
              rp.deliver(make_error(errc::bad_input, *failed));
          }
        });
      return rp;
    },
    [self](spawn_drafter_atom, const std::string& node, int32_t index, const std::string& from,
           const coordinator_actor& c) {
      return spawn_drafter_somewhere(self, node, index, from, c);
    },
    [self](drafter_node_atom, int32_t index) -> caf::result<std::string> {
      auto& s = self->state;
      if (auto it = s.moved.find(index); it != s.moved.end())
        return it->second;
      if (index < 0 || static_cast<size_t>(index) >= s.drafter_nodes.size())
        return make_error(errc::bad_input, "no drafter " + std::to_string(index) + " in the plan");
      return s.drafter_nodes[static_cast<size_t>(index)];
    },
    [self](spawn_ckpt_atom, const std::string& node, int32_t tier) {
      return spawn_via(self, node, spawn_ckpt_atom::value, tier);
    },
    [self](spawn_target_atom, const std::string& node, int32_t index, const coordinator_actor& c) {
      return spawn_via(self, node, spawn_target_atom::value, index, c);
    },
    [self](spawn_prefetch_atom, const std::string& node, int32_t index, const coordinator_actor& c) {
      return spawn_via(self, node, spawn_prefetch_atom::value, index, c);
    },
    [self](expire_atom, uint64_t id) {
      auto& s = self->state;
      auto it = std::find_if(s.pending.begin(), s.pending.end(), [&](const pending_spawn& p) { return p.id == id; });
      if (it == s.pending.end())
        return;
      const auto why = "node '" + it->node + "' did not join again within "
                       + std::to_string(static_cast<int64_t>(s.rejoin_timeout_s))
                       + " s (cluster.join_timeout_s): start it again with tandem node --name " + it->node;
      spdlog::error("cluster: {}", why);
      it->promise.deliver(make_error(errc::device_failure, why));
      s.pending.erase(it);
    },
    [self](shutdown_atom, int32_t code) -> caf::result<std::string> {
      // The run ended: every member up (a rejoined one too) is told its exit
      // code; the answer waits for their goodbyes (5 s each at most), so the
      // leader does not close the connections under them.
      auto& s = self->state;
      for (auto& p : s.pending)
        p.promise.deliver(make_error(errc::device_failure, "the run is ending"));
      s.pending.clear();
      auto rp = self->make_response_promise<std::string>();
      if (s.up.empty()) {
        rp.deliver(std::string("bye"));
        self->quit();
        return rp;
      }
      auto left = std::make_shared<size_t>(s.up.size());
      auto done = [self, rp, left]() mutable {
        if (--*left == 0) {
          rp.deliver(std::string("bye"));
          self->quit();
        }
      };
      for (const auto& [n, agent] : s.up)
        self->request(agent, std::chrono::seconds(5), shutdown_atom::value, code)
          .then([done](const std::string&) mutable { done(); }, [done](caf::error&) mutable { done(); });
      return rp;
    },
  };
}

// ---------------------------------------------------- checkpoint router --

struct router_state {
  static inline const char* name = "tandem.checkpoint_router";
  std::vector<checkpointer_actor> by_drafter;
  std::vector<std::string> nodes;   ///< drafter i's node ("" = this process)
  int32_t tier = 0;
  caf::actor door;
  int64_t routed = 0;
  /// Writes asked of each node's checkpointer, not yet answered: a node lost
  /// mid-write never answers (CAF 0.17), so its down message fails them.
  std::map<caf::actor_addr, std::map<uint64_t, caf::typed_response_promise<std::string>>> pending;
  uint64_t next_write = 1;
};

/// Asks checkpointer `c` to write `snap` and answers `rp` with its answer,
/// or with a node-lost error when `c` goes down first.
void route_write(checkpointer_actor::stateful_pointer<router_state> self, const checkpointer_actor& c,
                 caf::typed_response_promise<std::string> rp, const snapshot_desc& snap, const std::string& extra) {
  auto& s = self->state;
  const auto id = s.next_write++;
  const auto addr = c.address();
  s.pending[addr].emplace(id, rp);
  auto settle = [self, addr, id]() -> std::optional<caf::typed_response_promise<std::string>> {
    auto& p = self->state.pending;
    auto it = p.find(addr);
    if (it == p.end() || !it->second.count(id))
      return std::nullopt;  // already failed by the down message
    auto out = std::move(it->second.at(id));
    it->second.erase(id);
    return out;
  };
  self->request(c, std::chrono::minutes(30), snap, extra)
    .then(
      [settle](const std::string& dir) mutable {
        if (auto rp = settle())
          rp->deliver(dir);
      },
      [settle](caf::error& e) mutable {
        if (auto rp = settle())
          rp->deliver(std::move(e));
      });
}

checkpointer_actor::behavior_type router_behavior(checkpointer_actor::stateful_pointer<router_state> self,
                                                  std::vector<checkpointer_actor> by_drafter,
                                                  std::vector<std::string> nodes, int32_t tier, caf::actor door) {
  install_default_handler(self, router_state::name);
  auto& st = self->state;
  st.by_drafter = std::move(by_drafter);
  st.nodes = std::move(nodes);
  st.tier = tier;
  st.door = std::move(door);
  for (const auto& c : st.by_drafter)
    if (c)
      self->monitor(c);
  // A checkpointer lost with its node: the next snapshot of its drafters
  // asks the door for a new one on that node (once it is back).
  self->set_down_handler([self](caf::down_msg& m) {
    auto& s = self->state;
    std::string node;
    for (size_t i = 0; i < s.by_drafter.size(); ++i)
      if (s.by_drafter[i] && s.by_drafter[i].address() == m.source) {
        s.by_drafter[i] = checkpointer_actor{};
        if (i < s.nodes.size())
          node = s.nodes[i];
      }
    // Its writes in progress never finish: say so, as a lost node (the
    // coordinator drops such a checkpoint and goes on).
    if (auto it = s.pending.find(m.source); it != s.pending.end()) {
      for (auto& [id, rp] : it->second)
        rp.deliver(make_error(errc::device_failure,
                              std::string(node_lost_prefix) + "the checkpointer of node '" + node
                                + "' ended while writing: " + self->system().render(m.reason)));
      s.pending.erase(it);
    }
  });
  auto meter = std::make_shared<vitals_meter>(self->system(), "checkpoint_router", tier, false);
  meter->figures = [self] {
    return std::vector<vitals_figure>{{"routed", static_cast<double>(self->state.routed)}};
  };
  return counted(meter, checkpointer_actor::behavior_type{
    vitals_handler(self, meter),
    [self](const snapshot_desc& snap, const std::string& extra) -> caf::result<std::string> {
      auto& s = self->state;
      const auto d = static_cast<size_t>(snap.drafter);
      if (snap.drafter < 0 || d >= s.by_drafter.size())
        return make_error(errc::bad_input, "checkpoint: no checkpointer for drafter " + std::to_string(snap.drafter));
      ++s.routed;
      if (!s.by_drafter[d] && (d >= s.nodes.size() || s.nodes[d].empty() || !s.door))
        return make_error(errc::bad_input, "checkpoint: drafter " + std::to_string(snap.drafter)
                                             + "'s checkpointer is gone");
      // (A response promise takes the answer over: made only once one is coming.)
      auto rp = self->make_response_promise<std::string>();
      if (d >= s.nodes.size() || s.nodes[d].empty() || !s.door) {
        route_write(self, s.by_drafter[d], rp, snap, extra);  // the leader's own drafter
        return rp;
      }
      // A member's drafter: where it is now (its node, or a spare it moved
      // to), then a checkpointer there — its own, one a drafter beside it
      // has, else a new one.  Errors on the way are a lost node's: the
      // coordinator drops that checkpoint and goes on.
      auto lost = [self](const std::string& what, const caf::error& e) {
        return make_error(errc::device_failure, std::string(node_lost_prefix) + what + ": "
                                                  + self->system().render(e));
      };
      self->request(s.door, std::chrono::seconds(30), drafter_node_atom::value, snap.drafter)
        .then(
          [self, rp, d, snap, extra, lost](std::string& node) mutable {
            auto& s = self->state;
            if (s.nodes[d] == node && s.by_drafter[d]) {
              route_write(self, s.by_drafter[d], rp, snap, extra);
              return;
            }
            s.nodes[d] = node;  // by_drafter[d] is always on nodes[d]
            s.by_drafter[d] = checkpointer_actor{};
            for (size_t i = 0; i < s.by_drafter.size() && i < s.nodes.size(); ++i)
              if (i != d && s.nodes[i] == node && s.by_drafter[i]) {
                s.by_drafter[d] = s.by_drafter[i];
                route_write(self, s.by_drafter[d], rp, snap, extra);
                return;
              }
            self->request(s.door, std::chrono::seconds(120), spawn_ckpt_atom::value, node, s.tier)
              .then(
                [self, rp, d, node, snap, extra](checkpointer_actor& c) mutable {
                  auto& s = self->state;
                  self->monitor(c);
                  if (s.nodes[d] == node)
                    s.by_drafter[d] = c;
                  route_write(self, c, rp, snap, extra);
                },
                [rp, node, lost](caf::error& e) mutable {
                  rp.deliver(lost("no checkpointer on node '" + node + "'", e));
                });
          },
          [rp, lost](caf::error& e) mutable { rp.deliver(lost("where the drafter is", e)); });
      return rp;
    },
    [self](shutdown_atom) {
      std::set<caf::actor_addr> done;
      for (const auto& c : self->state.by_drafter)
        if (c && done.insert(c.address()).second)
          self->send(c, shutdown_atom::value);
      self->quit();
    },
  });
}

// ------------------------------------------------------------ node agent --

struct agent_state {
  static inline const char* name = "tandem.node_agent";
  std::optional<launch_plan> plan;
  std::shared_ptr<fault_plan> faults;
  std::vector<caf::actor> spawned;
  int64_t spawns = 0;
};

template <class Slot>
caf::error not_here(const std::string& me, const char* role, int32_t i, const std::vector<Slot>& slots) {
  if (i < 0 || static_cast<size_t>(i) >= slots.size())
    return make_error(errc::bad_input, std::string("node '") + me + "': the plan has no " + role + " "
                                         + std::to_string(i));
  return make_error(errc::bad_input, std::string("node '") + me + "': " + role + " " + std::to_string(i)
                                       + " is placed on " + (slots[i].node.empty() ? "the leader" : "node '" + slots[i].node + "'")
                                       + ", not here");
}

node_actor::behavior_type agent_behavior(node_actor::stateful_pointer<agent_state> self, node_agent_options o) {
  install_default_handler(self, agent_state::name);
  auto opts = std::make_shared<const node_agent_options>(std::move(o));
  auto meter = std::make_shared<vitals_meter>(self->system(), "node", 0, false);
  meter->figures = [self] {
    return std::vector<vitals_figure>{{"spawned", static_cast<double>(self->state.spawns)}};
  };
  auto mine = [self, opts](const auto& slots, int32_t i) {
    return self->state.plan && i >= 0 && static_cast<size_t>(i) < slots.size()
           && slots[static_cast<size_t>(i)].node == opts->name;
  };
  auto keep = [self](auto handle) {
    self->state.spawned.push_back(caf::actor_cast<caf::actor>(handle));
    ++self->state.spawns;
    return handle;
  };
  return counted(meter, node_actor::behavior_type{
    vitals_handler(self, meter),
    [self, opts](setup_atom, const node_setup& setup) -> caf::result<std::string> {
      try {
        const auto cfg = parse_run_config(setup.config_toml, std::filesystem::path("/leader") / "config.toml");
        inventory inv;
        for (size_t i = 0; i < setup.node_names.size() && i < setup.node_gpus.size(); ++i)
          inv.nodes.push_back({setup.node_names[i], setup.node_gpus[i]});
        std::optional<resume_point> resume;
        if (!setup.resume_checkpoint.empty())
          resume = resume_point{setup.resume_checkpoint, setup.resume_step, setup.resume_ledger, {}};
        auto plan = make_plan(cfg, inv, {setup.num_samples, setup.num_tokens, setup.schedule_steps}, resume);
        // Injected faults fire once per run: this node's are recorded beside
        // the run's outputs, so a restarted member (same name) does not fire
        // them again (the leader removes these files on a fresh start).
        if (!plan.faults.empty())
          plan.faults_fired_file = (cfg.run.output_dir / ("faults-fired-" + opts->name)).string();
        if (plan.cluster) {
          gpu::transport::force_links(plan.cluster->force_links);
          gpu::transport::name_nccl_host(opts->name, plan.cluster->force_links);
          gpu::transport::set_link_timeout(
            std::chrono::milliseconds(static_cast<int64_t>(plan.cluster->link_timeout_s * 1000)));
        }
        self->state.faults = make_fault_plan(plan);
        self->state.plan = std::move(plan);
      } catch (const std::exception& e) {
        return make_error(errc::bad_input, "node '" + opts->name + "': the leader's config: " + e.what());
      }
      spdlog::info("node '{}': the run's plan from leader '{}':\n{}", opts->name, setup.leader,
                   self->state.plan->placement.describe());
      return std::string("ready");
    },
    [self, opts, mine, keep](spawn_prefetch_atom, int32_t i, const coordinator_actor& c) -> caf::result<prefetch_actor> {
      auto& p = *self->state.plan;
      if (!mine(p.placement.prefetch, i))
        return not_here(opts->name, "prefetch", i, p.placement.prefetch);
      return keep(spawn_prefetch(self->system(), p.placement.prefetch[static_cast<size_t>(i)].index,
                                 p.prefetch[static_cast<size_t>(i)], c, self->state.faults));
    },
    [self, opts, mine, keep](spawn_target_atom, int32_t i, const coordinator_actor& c) -> caf::result<target_actor> {
      auto& p = *self->state.plan;
      if (!mine(p.placement.targets, i))
        return not_here(opts->name, "target", i, p.placement.targets);
      return keep(spawn_target(self->system(), p.placement.targets[static_cast<size_t>(i)].index,
                               p.targets[static_cast<size_t>(i)], c, self->state.faults));
    },
    [self, opts, mine, keep](spawn_drafter_atom, int32_t i, const std::string& from,
                             const coordinator_actor& c) -> caf::result<drafter_actor> {
      auto& p = *self->state.plan;
      if (!mine(p.placement.drafters, i))
        return not_here(opts->name, "drafter", i, p.placement.drafters);
      return keep(spawn_drafter(self->system(), p.placement.drafters[static_cast<size_t>(i)].index,
                                p.drafters[static_cast<size_t>(i)], from, c, self->state.faults));
    },
    [self, opts, keep](spawn_spare_atom, int32_t i, int32_t device, const std::string& from,
                       const coordinator_actor& c) -> caf::result<drafter_actor> {
      if (!self->state.plan)
        return make_error(errc::bad_input, "node '" + opts->name + "': a spare asked for before the setup");
      auto& p = *self->state.plan;
      if (i < 0 || static_cast<size_t>(i) >= p.drafters.size())
        return make_error(errc::bad_input, "node '" + opts->name + "': no drafter " + std::to_string(i));
      // Its restore point must be readable here: a checkpoint on a file
      // system both nodes share (a restore point in another process's memory
      // never is).
      // A restore point in memory is judged by the drafter itself: held in
      // this process (its last incarnation ran on this spare) it is used,
      // else its start fails and the coordinator falls back to the checkpoint.
      std::error_code ec;
      if (!from.empty() && from.rfind(memory_restore_prefix, 0) != 0 && !std::filesystem::is_directory(from, ec))
        return make_error(errc::bad_input, "node '" + opts->name + "' cannot read drafter " + std::to_string(i)
                                             + "'s restore point " + from
                                             + " (a spare restores from a checkpoint.dir the nodes share)");
      auto o = p.drafters[static_cast<size_t>(i)];
      o.device = device;
      spdlog::warn("node '{}': drafter {} starts here, on the spare {}", opts->name, i,
                   device < 0 ? std::string("cpu") : "cuda:" + std::to_string(device));
      return keep(spawn_drafter(self->system(), p.placement.drafters[static_cast<size_t>(i)].index, o, from, c,
                                self->state.faults));
    },
    [self, opts, keep](spawn_ckpt_atom, int32_t tier) -> caf::result<checkpointer_actor> {
      if (!self->state.plan)
        return make_error(errc::bad_input, "node '" + opts->name + "': a checkpointer asked for before the setup");
      const auto& p = *self->state.plan;
      if (tier == 0)
        return keep(spawn_checkpointer(self->system(), p.checkpointer.dir, p.checkpointer.keep));
      if (tier == 1 && p.coordinator.host_every > 0)
        return keep(spawn_checkpointer(self->system(), p.host_checkpointer.dir, p.host_checkpointer.keep, {}, false));
      return make_error(errc::bad_input, "node '" + opts->name + "': no checkpointer tier " + std::to_string(tier));
    },
    [self, opts](shutdown_atom, int32_t code) -> caf::result<std::string> {
      for (const auto& a : self->state.spawned)
        caf::anon_send(a, shutdown_atom::value);
      self->state.spawned.clear();
      if (opts->on_shutdown)
        opts->on_shutdown(code);
      auto rp = self->make_response_promise<std::string>();
      rp.deliver(std::string("bye"));
      self->quit();
      return rp;
    },
  });
}

} // namespace

caf::actor spawn_door(caf::actor_system& sys, door_options opts) {
  return sys.spawn(door_behavior, std::move(opts));
}

checkpointer_actor spawn_checkpoint_router(caf::actor_system& sys, std::vector<checkpointer_actor> by_drafter,
                                           std::vector<std::string> nodes, int32_t tier, caf::actor door) {
  return sys.spawn(router_behavior, std::move(by_drafter), std::move(nodes), tier, std::move(door));
}

node_actor spawn_node_agent(caf::actor_system& sys, node_agent_options opts) {
  return sys.spawn(agent_behavior, std::move(opts));
}

} // namespace tandem
