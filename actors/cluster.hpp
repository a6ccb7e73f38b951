#pragma once
/// The cluster's actors (messages/node.hpp): on the leader, the door that
/// members join through and the router that sends each drafter's snapshot to
/// the checkpointer on its node; on a member, the node agent that spawns the
/// actors the plan puts there.  Publishing the door and connecting to it
/// (CAF's middleman) is `tandem run --listen` and `tandem node --join`.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "messages/node.hpp"

namespace tandem {

/// The hex HMAC-SHA256 of `message` under `key` (OpenSSL; throws
/// std::runtime_error in a build without it).
std::string hmac_sha256_hex(const std::string& key, const std::string& message);

/// The hex HMAC-SHA256 of `name` under the cluster secret (the hex text of
/// `tandem certs`' cluster.secret): the node's join token.  Throws
/// std::runtime_error for a secret that is not hex.
std::string join_token(const std::string& secret_hex, const std::string& name);

/// Why a member's hello does not match the leader's ("" = it matches):
/// another protocol, Tandem version or commit, LibTorch, CUDA or NCCL — the
/// text names both sides' values.
std::string hello_mismatch(const std::vector<std::string>& leader, const std::vector<std::string>& member);

/// "cpu" → 0 GPUs, "cuda:N" → N (a hello's devices field); −1 if neither.
int32_t hello_gpus(const std::string& devices);

struct door_options {
  std::vector<std::string> hello;     ///< the leader's hello (messages/node.hpp, hello_fields)
  std::vector<std::string> expected;  ///< the member names the placement names
  std::string secret_hex;             ///< "" = join tokens not checked
  /// The placement puts actors on the leader's process: its host is the
  /// run's (else the first member's); a member on another host is refused.
  bool leader_holds_actors = false;
  /// Told `(node_up_atom, name, gpus, node_actor)` when a member's agent
  /// has joined, and `(node_up_atom, name, -1, node_actor{})` when it is
  /// lost (its agent ended or its connection dropped).
  caf::actor listener;
};

/// The leader's door: answers join requests (hello strings, refusals with
/// their reason) and registers each member's node agent.  Dynamically typed
/// on purpose: a member of another build must be able to ask and be told
/// why not, whatever its typed interfaces are.  Besides the hello, it takes
///   (setup_atom, node_setup, double rejoin_timeout_s) -> "ready"
///       from the leader once the plan is made: every member up gets the
///       plan's facts, and so does a member that joins again later;
///   (spawn_drafter_atom, node, index, from, coordinator) -> drafter_actor
///   (spawn_ckpt_atom, node, tier) -> checkpointer_actor
///   (spawn_target_atom, node, index, coordinator) -> target_actor
///   (spawn_prefetch_atom, node, index, coordinator) -> prefetch_actor
///       a spawn on `node`, at once when it is up, else when it joins
///       again (a lost node restarted with the same --name), or an error
///       after rejoin_timeout_s.
caf::actor spawn_door(caf::actor_system& sys, door_options opts);

/// A checkpointer on the leader that hands each snapshot to the checkpointer
/// of the node holding the drafter it came from (`by_drafter[snap.drafter]`;
/// snapshot bytes never leave that node) and answers with that one's answer.
/// One lost with its node is replaced through the door (`nodes[d]`, `tier`)
/// at the next snapshot.  Shutting it down shuts every one of them down.
checkpointer_actor spawn_checkpoint_router(caf::actor_system& sys, std::vector<checkpointer_actor> by_drafter,
                                           std::vector<std::string> nodes, int32_t tier, caf::actor door);

struct node_agent_options {
  std::string name;        ///< this member's node name
  int32_t gpus = 0;        ///< its CUDA devices (tandem node --devices)
  /// Called with the run's exit code when the leader says the run ended.
  std::function<void(int32_t)> on_shutdown;
};

/// A member's node agent (messages/node.hpp node_actor).
node_actor spawn_node_agent(caf::actor_system& sys, node_agent_options opts);

} // namespace tandem
