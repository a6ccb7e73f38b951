#pragma once
/// The run configuration: the one TOML file `tandem run CONFIG.toml` reads
/// (DESIGN.md §2, §5), the command line's `--set SECTION.KEY=VALUE` and
/// `--fault SPEC` on top of it, and the placement of the actors on this
/// host's devices.  config/README.md has the schema; every field below
/// carries its default and its key.
///
///   load_run_config(file, overrides)  →  run_config       (validated)
///   check_paths(config, need_data)    →  throws unless model, data and tokenizer paths exist
///   resolve_placement(config, gpus)   →  placement_plan   (devices checked)
///   to_toml(config)                   →  TOML text        (every field; reloads to the same config)
///
/// Errors are config_error, one line per problem, located as a compiler
/// would locate them:
///
///   config/tiny.toml:12:1: unknown key 'train.learning_rate' (did you mean 'train.lr'?)
///   config/tiny.toml:7:11: 'data.seq_len' must be a positive integer, got -5
///   --set data.seq_len=abc: 'data.seq_len' must be a positive integer, got "abc"
///   --fault drafter=0,kind=oops,at_step=5: 'kind' must be one of "throw", "nan", "hang", "slow_snapshot", "throw_in_snapshot", got "oops"
///
/// Plain C++: no CAF, no LibTorch, and toml++ only inside run_config.cpp.
/// launch/plan.hpp turns a run_config into the options of every actor.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

/// Any problem with a run configuration or its placement.  what() is one
/// line per problem, each starting with where it is: "FILE:LINE:COLUMN: ",
/// "FILE: " (a missing key), "--set KEY=VALUE: " or "--fault SPEC: ".
class config_error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// One injected failure, for the fault-injection tests (DESIGN.md §7):
/// TOML `[[faults.inject]]`, or `--fault drafter=0,kind=nan,at_step=5`.
struct fault_spec {
  /// Which actor fails: "drafter", or "target"/"prefetch" (kinds "throw"
  /// and "abort" only; `at_step` then counts the batches that incarnation
  /// handled: it fails on its at_step-th).  `--fault target=0,...`.
  std::string role = "drafter";
  int64_t drafter = 0;  ///< its index (placement order within its role)
  std::string kind;     ///< "throw" (an exception), "nan" (a non-finite loss),
                        ///< "hang" (its step never ends; step_timeout_s catches it),
                        ///< "slow_snapshot" (the first snapshot taken at or after
                        ///< at_step copies slowly: the drafter is busy, not dead),
                        ///< "throw_in_snapshot", "cuda_error" (a real non-sticky CUDA
                        ///< error), "cuda_sticky" (an illegal address: the context is
                        ///< lost, the worker process restarts), "abort" (the worker
                        ///< process aborts)
  int64_t at_step = 0;  ///< the global optimizer step at which it fails

  /// The `--fault` form: "drafter=0,kind=nan,at_step=5".
  std::string to_string() const;
};

/// Everything a run needs to know, section by section as in the TOML file.
/// After load_run_config every path except checkpoint.dir and metrics.jsonl
/// is absolute (relative ones in the file are taken from the file's folder,
/// relative ones from the command line from the working directory);
/// checkpoint.dir and metrics.jsonl stay relative to run.output_dir (an
/// absolute one is used as it is).
struct run_config {
  /// [model]: the frozen target.
  struct model_section {
    std::filesystem::path target;    ///< target: a Hugging Face Qwen3 folder (required)
    std::vector<int64_t> tap_layers; ///< tap_layers: decoder-layer outputs to tap, strictly
                                     ///< increasing; [] = gpu::training_tap_ids(L) (DFLASH.md's 5 for L ≥ 8)
    std::string dtype = "auto";      ///< dtype: "auto" (bfloat16 on a GPU, float32 on the CPU),
                                     ///< "float32" or "bfloat16"
  } model;

  /// [drafter]: the DFlash drafter being trained.
  struct drafter_section {
    int64_t layers = 1;          ///< layers: Qwen3 decoder layers (5 for Qwen3-4B/8B)
    int64_t block_size = 16;     ///< block_size: Bs, tokens per draft block (≥ 2)
    int64_t mask_token_id = -1;  ///< mask_token_id: a row of the target's embedding (required,
                                 ///< ≥ 0; Qwen3: 151669); -1 only before loading
    uint64_t seed = 0;           ///< seed: weight initialisation
    std::filesystem::path init_from;  ///< init_from: "" (fresh weights) or a Tandem checkpoint
                                      ///< or z-lab export folder to start from
  } drafter;

  /// [data]: the prepared token shards and how they are packed.
  struct data_section {
    std::filesystem::path path;  ///< path: a `tandem prepare` output folder (required
                                 ///< unless sources is given; then run.output_dir/data)
    std::vector<std::filesystem::path> sources;  ///< sources: chat JSONL that `tandem run`
                                                 ///< prepares into path first ([] = none)
    std::filesystem::path tokenizer;  ///< tokenizer: for sources; "" = model.target
    int64_t seq_len = 3072;      ///< seq_len: S, tokens per packed row (≥ block_size)
    int64_t rows = 1;            ///< rows: B, rows per batch
    int64_t anchors = 512;       ///< anchors: N, draft blocks per row
    int64_t max_docs = 16;       ///< max_docs: documents packed into one row at most
    int64_t lookahead = 16;      ///< lookahead: pending samples first-fit packing picks from
    uint64_t seed = 0;           ///< seed: epoch shuffle and anchor sampling
    int64_t epochs = 1;          ///< epochs: passes over the data (DFLASH.md recipe: 6)
  } data;

  /// [train]: the optimizer (AdamW, cosine schedule with linear warm-up).
  struct train_section {
    double lr = 6e-4;             ///< lr: peak learning rate
    double warmup_ratio = 0.04;   ///< warmup_ratio: fraction of the steps warming up, in [0, 1]
    double weight_decay = 0.0;    ///< weight_decay: AdamW decoupled weight decay
    double grad_clip = 1.0;       ///< grad_clip: global gradient-norm clip; 0 = off
    double beta1 = 0.9;           ///< beta1: in [0, 1)
    double beta2 = 0.95;          ///< beta2: in [0, 1)
    double eps = 1e-8;            ///< eps: AdamW denominator epsilon, > 0
    int64_t max_steps = 0;        ///< max_steps: stop after this many steps; 0 = run the epochs
    int64_t chunk_rows = 2048;    ///< chunk_rows: lm-head rows per chunk of the cross-entropy
    int64_t log_every = 10;       ///< log_every: steps between metric records
  } train;

  /// [placement]: which device each actor owns.  A device string is "cpu",
  /// "cuda:N", or "auto" alone (the GPUs in order if any, else the CPU);
  /// "NODE:cpu" or "NODE:cuda:N" places it on a cluster member (`tandem node
  /// --name NODE`; [cluster]).  One actor per entry; several actors may
  /// share a device.
  struct placement_section {
    std::vector<std::string> targets{"auto"};   ///< targets: one target actor per entry
    std::vector<std::string> drafters{"auto"};  ///< drafters: one drafter per entry (replicas)
    std::string prefetch = "per_target";        ///< prefetch: "per_target" (one per target, on its device)
    /// spares: member devices ("NODE:cuda:N", "NODE:cpu") held in reserve:
    /// a drafter whose node is lost is started again on the first free one
    /// whose node is up, instead of waiting for its node to join again.
    std::vector<std::string> spares;
  } placement;

  /// [runtime]: flow control and liveness.
  struct runtime_section {
    int64_t credits = 4;          ///< credits: batches in flight per target
    double heartbeat_s = 10.0;    ///< heartbeat_s: an idle drafter must answer a heartbeat within this
    double step_timeout_s = 120.0;  ///< step_timeout_s: a step slower than this is a failure
    double group_timeout_s = 30.0;  ///< group_timeout_s: data-parallel drafters' group forming and collectives
    bool capture_graphs = true;   ///< capture_graphs: CUDA graphs (ignored on the CPU)
    double gpu_memory_fraction = 1.0;  ///< gpu_memory_fraction: the caching allocator's cap per GPU, (0, 1]
  } runtime;

  /// [checkpoint]: snapshots.
  struct checkpoint_section {
    std::filesystem::path dir = "checkpoints";  ///< dir: relative to run.output_dir
    int64_t every_steps = 100;  ///< every_steps: steps between snapshots; 0 = none periodic
    int64_t keep = 3;           ///< keep: newest snapshots kept (≥ 1)
    bool on_signal = true;      ///< on_signal: snapshot on SIGINT/SIGTERM before exiting
    int64_t memory_every = 1;   ///< memory_every: steps between restore points in device memory
                                ///< (a single drafter; 0 = none)
    int64_t host_every = 25;    ///< host_every: steps between restore points in shared memory
                                ///< (they outlive the worker process; 0 = none)
    std::filesystem::path host_dir;  ///< host_dir: their folder; "" = under /dev/shm (plan.hpp)
  } checkpoint;

  /// [supervision]: restarting failed drafters.
  struct supervision_section {
    int64_t restart_budget = 3;              ///< restart_budget: restarts per drafter within window_s
    std::vector<double> backoff_s{1, 2, 4};  ///< backoff_s: wait before restart k (the last repeats)
    double window_s = 600.0;                 ///< window_s: failures older than this do not count
    int64_t worker_restarts = 3;             ///< worker_restarts: new worker processes after deaths
  } supervision;

  /// [eval]: real τ during training (an eval actor with its own copy of the
  /// target decodes held-out prompts speculatively with snapshots of the drafter).
  struct eval_section {
    std::filesystem::path prompts;  ///< prompts: held-out conversations (JSONL, the formats
                                    ///< `tandem prepare` reads); "" = no evaluation
    int64_t count = 8;              ///< count: the first N prompts
    int64_t max_new_tokens = 128;   ///< max_new_tokens: per prompt
    int64_t every_steps = 0;        ///< every_steps: steps between evaluations; 0 = only at the end
    bool at_end = true;             ///< at_end: evaluate the final weights too
    double temperature = 0.0;       ///< temperature: 0 = greedy
    std::string device = "auto";    ///< device: "auto", "cpu" or "cuda:N"
  } eval;

  /// [control]: the control endpoint (actors/control.cpp): the inspection
  /// shell's, the dashboard's and Prometheus' way in.
  struct control_section {
    std::string listen = "127.0.0.1:0";  ///< listen: "HOST:PORT" (port 0: any free one); "" = none
    std::filesystem::path tls_cert;      ///< tls_cert: PEM chain (with tls_key: HTTPS; needed off loopback)
    std::filesystem::path tls_key;       ///< tls_key: its PEM private key
  } control;

  /// [cluster]: a run spread over member nodes (`tandem node`), which the
  /// placement names.  The process `tandem run` starts is the leader.
  struct cluster_section {
    std::string listen;            ///< listen: the leader's "HOST:PORT" for members; "" = no cluster
    std::string name = "leader";   ///< name: the leader's node name (a placement may name it too)
    double join_timeout_s = 300;   ///< join_timeout_s: how long the leader waits for the placement's nodes
    double heartbeat_s = 2;        ///< heartbeat_s: CAF middleman heartbeats between nodes
    double timeout_s = 10;         ///< timeout_s: a connection silent this long is dead (> heartbeat_s)
    std::filesystem::path secret;  ///< secret: the cluster secret (tandem certs DIR/cluster.secret);
                                   ///< members prove their name with its HMAC (join.token)
    std::filesystem::path certs;   ///< certs: the leader's folder of `tandem certs` (cert.pem, key.pem,
                                   ///< ca.pem): TLS between nodes; "" = plain TCP (loopback only)
    std::string transport = "auto";  ///< transport: "auto" (shared memory / CUDA IPC on one host, NCCL
                                     ///< between hosts) or "nccl" (NCCL between any two processes)
    /// The deadline of joining an NCCL link and of each transfer on it:
    /// max(30 s, 3 × timeout_s).
    double link_timeout_s() const { return std::max(30.0, 3 * timeout_s); }
  } cluster;

  /// [faults]: `[[faults.inject]]` tables, then any `--fault` the caller appends.
  std::vector<fault_spec> faults;

  /// [metrics]
  struct metrics_section {
    std::filesystem::path jsonl = "metrics.jsonl";  ///< jsonl: JSON-lines log, relative to
                                                    ///< run.output_dir; "" = none
    bool progress = true;  ///< progress: a progress line on the terminal
    double every_s = 1.0;  ///< every_s: seconds between progress updates
    std::filesystem::path tensorboard = "tb";  ///< tensorboard: event files' folder, relative
                                               ///< to run.output_dir; "" = none
  } metrics;

  /// [run]
  struct run_section {
    std::filesystem::path output_dir;  ///< output_dir: default "runs/<config file stem>" in the
                                       ///< working directory
    std::string name;                  ///< name: default the config file's stem
  } run;

  /// The file this was loaded from (or the name given to parse_run_config).
  std::filesystem::path source;
  /// Field ("placement.targets") → where its value was set: "FILE:LINE:COLUMN"
  /// or the "--set KEY=VALUE" that set it; a field left at its default is absent.
  std::map<std::string, std::string> origin;
  /// "WHERE: " for an error about `field`: its origin, else the file.
  std::string at(const std::string& field) const {
    auto o = origin.find(field);
    return (o != origin.end() ? o->second : source.string()) + ": ";
  }

  /// run.output_dir / checkpoint.dir.
  std::filesystem::path checkpoint_dir() const { return run.output_dir / checkpoint.dir; }
  /// run.output_dir / metrics.tensorboard, or empty when it is "".
  std::filesystem::path tensorboard_dir() const {
    return metrics.tensorboard.empty() ? std::filesystem::path{} : run.output_dir / metrics.tensorboard;
  }
  /// run.output_dir / metrics.jsonl, or empty when metrics.jsonl is "".
  std::filesystem::path metrics_file() const {
    return metrics.jsonl.empty() ? std::filesystem::path{} : run.output_dir / metrics.jsonl;
  }
  /// The learning-rate multiplier's schedule as last set through the
  /// control endpoint (written by the metrics actor; read on a resume, so a
  /// change made after the newest checkpoint survives a worker restart).
  std::filesystem::path lr_schedule_file() const { return run.output_dir / "lr_schedule.json"; }
};

/// A control.listen address split: `host` (an IPv4 literal, "localhost" or
/// "::1"), `port` (0: any free one).  nullopt when it is not "HOST:PORT".
struct listen_address {
  std::string host;
  uint16_t port = 0;
  bool loopback() const;
};
std::optional<listen_address> parse_listen(const std::string& text);
/// An address to connect to (tandem node --join, tandem shell HOST:PORT):
/// what parse_listen takes, or a host name ("leader-0", "gpu-3.example")
/// resolved when connecting.  A name other than localhost is not loopback.
std::optional<listen_address> parse_connect(const std::string& text);

/// Reads `toml_file`, applies `overrides` ("section.key=value", in order,
/// after the file; the value is TOML typed like the field, where a bare word
/// is taken as a string and "a,b" as an array), fills the defaults and
/// validates.  Unknown sections and keys are errors.  Throws config_error.
/// "--listen=X" and "--name=X" (tandem run's flags) are "cluster.listen=X"
/// and "cluster.name=X" whose errors name the flag.
run_config load_run_config(const std::filesystem::path& toml_file,
                           const std::vector<std::string>& overrides = {});

/// Same, from TOML text; `source` names it in errors and is where relative
/// paths are taken from (its folder) and output_dir's default (its stem).
run_config parse_run_config(std::string_view toml_text, const std::filesystem::path& source,
                            const std::vector<std::string>& overrides = {});

/// A `--fault` argument: "drafter=N,kind=throw|nan|hang|slow_snapshot,at_step=S" (all
/// three, any order; "target=N" or "prefetch=N" instead of "drafter=N" for
/// those actors, kinds throw and abort).  Throws config_error.
fault_spec parse_fault(const std::string& spec);

/// The kinds of fault_spec (--fault, [[faults.inject]], POST /v1/fault).
const std::vector<std::string>& fault_kinds();

/// The complete TOML of `c`: every field, with a comment each.  Written into
/// a run's output folder as the effective config; load_run_config of it gives
/// `c` back (paths are absolute, so it reloads from anywhere).
std::string to_toml(const run_config& c);

/// Every key the schema knows, "section.key", in file order (faults as
/// "faults.inject.drafter" …).
std::vector<std::string> run_config_keys();

/// -1 → "cpu", N → "cuda:N".
std::string device_string(int32_t device);

/// Which device each actor gets.
struct placement_plan {
  struct slot {
    std::string role;  ///< "target", "drafter" or "prefetch"
    int index;         ///< within its role, in placement order
    int32_t device;    ///< -1 = CPU, else the CUDA ordinal
    std::string node;  ///< the cluster member holding it; "" = the process `tandem run` starts
  };
  std::vector<slot> targets, drafters, prefetch;  ///< prefetch[i] serves targets[i]
  /// placement.spares: member devices a drafter whose node is lost may be
  /// started on (role "spare"); nothing runs there until then.
  std::vector<slot> spares;
  /// The eval actor ([eval], when eval.prompts is set): at most one.
  /// eval.device "auto": a GPU no other actor uses, else the first
  /// drafter's device (a second copy of the target beside it), else the CPU.
  std::vector<slot> eval;

  /// One line per device in use, e.g. "cuda:0: target 0, prefetch 0"
  /// ("gpu-b:cuda:0: drafter 0" on a member).
  std::string describe() const;
  /// The members it names, in order of first appearance (none: one process).
  std::vector<std::string> nodes() const;
};

/// The cluster members [placement] names ("NODE:..." entries), in order of
/// first appearance, without the leader (cluster.name).
std::vector<std::string> placement_nodes(const run_config& c);

/// Whether [placement] puts a target or drafter on the leader's own process
/// (an entry without a node, or naming cluster.name).
bool placement_uses_leader(const run_config& c);

/// A cluster member's devices, as it reported them when it joined.
struct member_devices {
  std::string name;
  int32_t gpus = 0;
};

/// Checks that the paths the run reads exist and look right before anything
/// is spawned: model.target holds config.json and *.safetensors; every
/// data.sources file exists and data.tokenizer holds tokenizer.json (when
/// sources are given); drafter.init_from exists; with `need_data`,
/// data.path holds manifest.json.  Also reads the target's config.json:
/// drafter.mask_token_id must be below its vocab_size and every
/// model.tap_layers entry below its num_hidden_layers.  Throws config_error
/// naming the config file, the field and the path.
void check_paths(const run_config& c, bool need_data);

/// Expands "auto" for a host with `gpus_available` GPUs and checks every
/// "cuda:N" against it; puts one prefetch actor per target on the target's
/// device; checks that each fault names an existing drafter.  Throws
/// config_error naming the field and the number of GPUs.
placement_plan resolve_placement(const run_config& c, int32_t gpus_available);

/// The same with cluster members: an entry "NODE:cuda:N" is checked against
/// that member's GPUs ("NODE" = cluster.name is this process); a node not in
/// `members` is an error naming the ones that are.
placement_plan resolve_placement(const run_config& c, int32_t gpus_available,
                                 const std::vector<member_devices>& members);

/// A node name (tandem node --name, cluster.name, placement "NODE:"):
/// lowercase letters, digits and '-', starting with a letter or digit, at
/// most 63 characters, and not "cpu", "cuda" or "auto".
bool valid_node_name(const std::string& name);

} // namespace tandem
