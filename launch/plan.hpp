#pragma once
/// From a run config to the system that runs it (DESIGN.md §2–§3): which
/// actor goes on which device, and every option struct each actor and
/// engine is built from.  `tandem run` spawns what the plan says and nothing
/// else decides a setting; the unit tests (tests/unit/plan_test.cpp) check
/// that every config key reaches the plan or a named observable of the run.
///
///   inventory   the devices a run may use: this host's (this_host), and the
///               cluster members' that joined
///   data_facts  what the prepared data set holds (samples, tokens): the
///               ledger's size and the learning-rate schedule's length
///   resume_point the checkpoint a `--resume` continues from, if any
///
///   make_plan(config, inventory, data, resume)  →  launch_plan
///
/// Plain C++: no CAF, no LibTorch.  Errors are config_error naming the
/// config file and the field.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpu/decode/eval.hpp"
#include "gpu/engine/drafter_engine.hpp"
#include "gpu/engine/prefetch_engine.hpp"
#include "gpu/engine/target_engine.hpp"
#include "launch/options.hpp"
#include "launch/run_config.hpp"

namespace tandem {

/// The devices a run may be placed on: nodes[0] is the process `tandem run`
/// starts (the leader), the rest are the cluster's members as they joined.
struct inventory {
  struct node {
    std::string name = "local";  ///< "local" for the host the run starts on
    int32_t gpus = 0;            ///< CUDA devices cuda:0 … cuda:gpus−1 (the CPU is always there)
  };
  std::vector<node> nodes;

  /// This host alone, with `gpus` CUDA devices.
  static inventory this_host(int32_t gpus) { return inventory{{node{"local", gpus}}}; }
};

/// What the data set holds (gpu::data::dataset after `tandem prepare`).
struct data_facts {
  int64_t num_samples = 0;
  int64_t num_tokens = 0;
  /// Optimizer steps of data.epochs as the packer deals them
  /// (gpu::data::count_steps); 0: estimated from num_tokens at 90% fill.
  int64_t steps = 0;
  std::string content_hash;  ///< the manifest's ("" = none)
};

/// A checkpoint to continue from (`tandem run --resume`).
struct resume_point {
  std::string checkpoint;  ///< its folder
  int64_t step = 0;        ///< the drafters' update count in it
  std::string ledger;      ///< the ledger saved with it (JSON text)
  std::vector<std::pair<int64_t, double>> lr_scale;  ///< its learning-rate multiplier's changes
  /// A checkpoint on disk (false: a restore point in shared memory, which
  /// the run removes once it ends with everything on disk).
  bool on_disk = true;
};

/// checkpoint.host_dir when set (relative: to run.output_dir), else
/// /dev/shm/tandem-<uid>/<run.name>-<8 hex digits of run.output_dir's
/// absolute path>: one folder per run and user, found again by the next
/// worker process and by `--resume`.
std::filesystem::path host_restore_dir(const run_config& c);

/// Every setting of every actor of one run.
struct launch_plan {
  std::string run_name;               ///< run.name (default: the config file's stem)
  std::filesystem::path output_dir;   ///< run.output_dir
  placement_plan placement;           ///< device per actor, on inventory.nodes[0]
  /// Optimizer steps the learning-rate schedule spans: the epochs' worth of
  /// packed batches at ~90% fill (max_steps only stops earlier, so a run
  /// stopped at step k and resumed follows the same schedule).
  int64_t schedule_steps = 0;
  coordinator_settings coordinator;
  supervisor_settings supervisor;
  metrics_options metrics;
  checkpointer_options checkpointer;
  /// The restore points in shared memory (checkpoint.host_every > 0): a
  /// second checkpointer writing into host_restore_dir, keeping the newest
  /// one; coordinator.host_every says how often.  keep = 1.
  checkpointer_options host_checkpointer;
  double gpu_memory_fraction = 1.0;   ///< runtime.gpu_memory_fraction, for every GPU of the run
  int64_t worker_restarts = 3;        ///< supervision.worker_restarts (tandem run's parent process)
  std::vector<gpu::prefetch_engine_options> prefetch;  ///< [i] serves targets[i]
  std::vector<gpu::target_engine_options> targets;
  std::vector<gpu::drafter_engine_options> drafters;   ///< [i] for drafter i, every incarnation
  std::vector<fault_spec> faults;     ///< injected faults (tests and demonstrations)
  std::string faults_fired_file;      ///< faults fired by earlier worker processes (tandem run
                                      ///< sets it; actors/spawn.hpp, fault_plan)
  double hang_s = 0;                  ///< how long an injected "hang" blocks
  double slow_snapshot_s = 0;         ///< how long an injected "slow_snapshot" copies (past
                                      ///< two heartbeat deadlines)
  std::string restore_from;           ///< the drafters' first checkpoint ("" = fresh or init_from)
  /// The eval actor's engine ([eval] with eval.prompts; none: no eval
  /// actor).  Its prompts stay empty in the plan: `tandem run` renders
  /// eval_prompts (eval_prompt_arguments) and fills them in.
  std::optional<gpu::eval_engine_options> eval;
  std::filesystem::path eval_prompts;  ///< eval.prompts (conversations, not yet rendered)
  int64_t eval_count = 0;              ///< eval.count
  bool checkpoint_on_signal = true;   ///< checkpoint.on_signal
  /// The control endpoint ([control] listen; none: ""): `tandem run` adds
  /// the effective config and binds it.
  std::optional<control_options> control;
  /// [cluster]: the leader's address and the liveness of its connections
  /// (none: cluster.listen is "", one process).
  struct cluster_settings {
    std::string host;          ///< cluster.listen's host
    uint16_t port = 0;         ///< and port
    std::string name;          ///< cluster.name, the leader's node name
    std::vector<std::string> members;  ///< the nodes the placement names
    double join_timeout_s = 0, heartbeat_s = 0, timeout_s = 0;
    std::string secret;        ///< cluster.secret ("" = join tokens not checked)
    std::string certs;         ///< cluster.certs ("" = plain TCP)
    /// cluster.transport = "nccl": payloads between any two processes over
    /// NCCL links (gpu/transport/link.hpp force_links), also on one host.
    bool force_links = false;
    double link_timeout_s = 0;  ///< each link's join and transfer deadline
  };
  std::optional<cluster_settings> cluster;
};

/// The plan for `config` on `devices`.  Checks the placement against the
/// inventory (as resolve_placement does).  Every node of a cluster computes
/// the same plan from the same config, inventory, data facts and resume
/// point, and spawns the actors placed on it.  Throws config_error.
launch_plan make_plan(const run_config& config, const inventory& devices, const data_facts& data,
                      const std::optional<resume_point>& resume = std::nullopt);

/// The arguments of `tandem prepare` that render eval.prompts (the first
/// eval.count conversations, each up to its first assistant turn) with the
/// data's tokenizer into `out` (a tandem.prompts.v1 file); empty without
/// eval.prompts.
std::vector<std::string> eval_prompt_arguments(const run_config& config, const std::filesystem::path& out);

/// Every field of `plan` as pretty-printed JSON text (for logs and tests).
std::string to_json(const launch_plan& plan);

/// The arguments of `tandem prepare` that turn data.sources into data.path
/// (reusing what an earlier run prepared from the same files, tokenizer and
/// options); empty when data.sources is empty.
std::vector<std::string> prepare_arguments(const run_config& config);

} // namespace tandem
