#pragma once
/// Node protocol (issue 18, DESIGN.md §2–§3): a run spread over processes.
/// The process `tandem run` starts is the leader (supervisor, coordinator,
/// checkpoint ledger, metrics, control endpoint); each `tandem node` is a
/// member whose node agent spawns the actors the placement puts on it.
///
///   member (tandem node)                 leader (tandem run --listen)
///     | connects to the published door (CAF middleman, retried with backoff)
///     | -- (join_atom, hello strings) --> |  checks version, build, name, token
///     | <-------- hello strings / error - |  (plain strings only: a member of
///     |                                   |   another version gets a refusal that
///     |                                   |   names both, never a decoding error)
///     | -- (node_up_atom, name, agent) -> |  monitors the agent
///     | <------------ int32 node number - |
///     | <-- (setup_atom, node_setup) ---- |  once every member has joined: the
///     | ---------------------- "ready" -> |  node computes the run's plan itself
///     | <-- (spawn_*_atom, index, ...) -- |  and spawns what is placed on it
///     | ---------------- typed handle --> |
///     |      ... the run, actor to actor, as in one process ...
///     | <-- (shutdown_atom, code) ------- |  the run ended: the agent ends its
///     | ------------------------ "bye" -> |  actors; the member exits with `code`
///     |                                   |  once the leader closes the connection
///
/// The hello strings, in order (hello_fields): "tandem-node-hello/1", the
/// Tandem version, its git commit, the LibTorch, CUDA and NCCL versions, the
/// node's name, its join token (hex; "" without one), its devices ("cpu" or
/// "cuda:N": N GPUs, cuda:0..N-1), its process id, its host ("HOSTNAME boot
/// BOOT_ID": processes of one machine share it).  The leader answers with
/// the same fields, its name and no token.  A refusal is an error whose text
/// says why (another version, a wrong token, a name already joined or not
/// placed, another host than the run's actors: payloads cross processes
/// through shared memory and CUDA IPC, which need one host).
///
/// The agent answers every spawn with the handle, or an error (the plan has
/// no such slot on this node, or the engine could not be built); the leader
/// asks with a finite timeout.  Payloads between nodes on one host go
/// through shared memory (gpu/transport/transport.hpp, share_with_host);
/// snapshots never leave the node: each node with drafters has its own
/// checkpointers, and the leader's routes a drafter's snapshot to them.

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "messages/atoms.hpp"
#include "messages/checkpointer.hpp"
#include "messages/coordinator.hpp"
#include "messages/drafter.hpp"
#include "messages/prefetch.hpp"
#include "messages/target.hpp"
#include "messages/vitals.hpp"

namespace tandem {

using join_atom = caf::atom_constant<caf::atom("join")>;
using node_up_atom = caf::atom_constant<caf::atom("node_up")>;
using setup_atom = caf::atom_constant<caf::atom("setup")>;
using spawn_prefetch_atom = caf::atom_constant<caf::atom("spawn_pf")>;
using spawn_target_atom = caf::atom_constant<caf::atom("spawn_tg")>;
using spawn_drafter_atom = caf::atom_constant<caf::atom("spawn_dr")>;
using spawn_ckpt_atom = caf::atom_constant<caf::atom("spawn_ck")>;
/// A drafter whose node is lost, started on a spare device of this node
/// (placement.spares): its index, the device, its restore point.
using spawn_spare_atom = caf::atom_constant<caf::atom("spawn_sp")>;
/// The door: which node holds drafter i now (its own, or the spare it moved to).
using drafter_node_atom = caf::atom_constant<caf::atom("dr_node")>;

/// The hello strings' positions.
namespace hello_fields {
constexpr size_t protocol = 0, version = 1, commit = 2, torch = 3, cuda = 4, nccl = 5, name = 6, token = 7,
                 devices = 8, pid = 9, host = 10, count = 11;
constexpr const char* protocol_name = "tandem-node-hello/2";
} // namespace hello_fields

/// What a member needs to compute the run's plan (launch/plan.hpp make_plan)
/// exactly as the leader did: the effective config, the inventory and the
/// data and resume facts.
struct node_setup {
  std::string leader;                  ///< the leader's node name
  std::string config_toml;             ///< the effective config (to_toml: paths absolute)
  std::vector<std::string> node_names; ///< the inventory: [0] the leader, then the members
  std::vector<int32_t> node_gpus;      ///< their CUDA device counts
  int64_t num_samples = 0, num_tokens = 0;  ///< the data set's facts
  int64_t schedule_steps = 0;          ///< data_facts::steps as the leader counted them
  std::string resume_checkpoint;       ///< "" = a fresh start
  int64_t resume_step = 0;
  std::string resume_ledger;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_setup& x) {
  return f(caf::meta::type_name("tandem.node_setup"), x.leader, x.config_toml, x.node_names, x.node_gpus,
           x.num_samples, x.num_tokens, x.schedule_steps, x.resume_checkpoint, x.resume_step, x.resume_ledger);
}

/// A member's node agent.  Spawn requests carry the slot's index within its
/// role (placement order); a drafter's also the checkpoint it restores from
/// ("" = fresh or init_from); a checkpointer's the tier (0: checkpoint.dir,
/// 1: the restore points in shared memory).
using node_actor = caf::typed_actor<
  caf::replies_to<setup_atom, node_setup>::with<std::string>,
  caf::replies_to<spawn_prefetch_atom, int32_t, coordinator_actor>::with<prefetch_actor>,
  caf::replies_to<spawn_target_atom, int32_t, coordinator_actor>::with<target_actor>,
  caf::replies_to<spawn_drafter_atom, int32_t, std::string, coordinator_actor>::with<drafter_actor>,
  caf::replies_to<spawn_ckpt_atom, int32_t>::with<checkpointer_actor>,
  caf::replies_to<spawn_spare_atom, int32_t, int32_t, std::string, coordinator_actor>::with<drafter_actor>,
  caf::replies_to<shutdown_atom, int32_t>::with<std::string>,
  vitals_protocol>;

} // namespace tandem
