#pragma once
/// The drafter actor's engine: a DFlash drafter being trained next to a
/// frozen target (DFLASH.md), its optimizer, its private generator and its
/// checkpoints.  Torch-free facade (actors/ include it): tensors cross only
/// as transport handles.  Single owner: construct it and call it on one
/// thread (the actor's), which is also where its device work runs; only
/// write_checkpoint and read_checkpoint_extra are meant for another thread.
///
/// Precision: the trainable parameters live as fp32 master weights, which
/// the optimizer updates; the forward and backward run on a copy in `dtype`
/// refreshed after every update (on fp32 the copy is the masters themselves).

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpu/engine/checkpoint.hpp"
#include "gpu/transport/transport.hpp"

namespace tandem::gpu {

struct drafter_engine_options {
  std::filesystem::path target_dir;  ///< the target's config.json + weights (embedding and
                                     ///< lm-head are read from it, frozen; no layers)
  int32_t device = -1;               ///< CUDA ordinal; −1 = CPU
  std::string dtype = "auto";        ///< compute: auto (bf16 on CUDA, fp32 on the CPU), float32, bfloat16
  int64_t layers = 5;                ///< draft decoder layers (DFLASH.md: 5 for Qwen3-4B/8B)
  int64_t block_size = 16;           ///< Bs
  int64_t mask_token_id = -1;        ///< required: a row of the target's embedding (Qwen3: 151669)
  int64_t anchors = 512;             ///< N anchors per row
  int64_t chunk_rows = 2048;         ///< lm-head + cross-entropy rows per chunk
  std::vector<int64_t> tap_ids;      ///< empty: DFLASH.md's default for 5 taps
  uint64_t seed = 0;                 ///< initial weights and anchor draws (the rank is no
                                     ///< part of it; join_group makes ranks equal anyway)
  double lr = 6e-4;                  ///< peak learning rate
  double warmup_ratio = 0.04;        ///< linear warmup, fraction of total_steps
  double weight_decay = 0.0;
  double grad_clip = 1.0;            ///< max global gradient norm; ≤ 0: no clipping
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  int64_t total_steps = 0;           ///< cosine to 0 after warmup; ≤ 0: constant lr
  bool capture_graphs = true;        ///< CUDA: the whole step as one captured graph (the
                                     ///< first step runs eagerly as its warm-up); ignored on the CPU
  /// A warm start (config drafter.init_from): "" = weights from `seed`;
  /// else a Tandem checkpoint folder (its master weights) or a z-lab DFlash
  /// export (config.json + model.safetensors) whose shape must be this
  /// drafter's.  Only the weights are taken: the optimizer starts fresh at
  /// step 0.  A later restore() replaces them as usual.
  std::filesystem::path init_from;
  /// The restore point in device memory (DESIGN.md §3, restore tiers):
  /// masters, moments, update count and generator state on the same device,
  /// outliving this engine (a process-wide table, by `memory_slot`, the
  /// drafter's index), so that the next incarnation of a drafter that threw,
  /// went NaN or hung restores them in milliseconds (restore_memory) instead
  /// of reading the newest checkpoint.  0: none.  1: in place — the point is
  /// this engine's own state, valid between its updates (a failure in the
  /// middle of an update, a step hung on the device included, leaves none:
  /// the caller falls back to a checkpoint); no copy and no memory of its own (a
  /// snapshot then stages the state in 12 bytes a parameter of device
  /// memory, made with the point when prepare_snapshot_buffers is set, else
  /// at the first snapshot).  k ≥ 2: every k-th step
  /// keep_restore_point copies the state into buffers of its own (12 bytes
  /// a parameter; one device-to-device copy of as much per kept step, on a
  /// side stream), which also survive a failure in the middle of an update.
  int64_t memory_every = 0;
  int32_t memory_slot = 0;
  /// The run will snapshot this drafter (checkpoints, restore points in
  /// shared memory): a helper thread maps and touches the host memory of
  /// its first two snapshot buffer sets (12 bytes a parameter each) ahead
  /// of need, with no CUDA call; on CUDA the drafter's thread page-locks
  /// that memory piece by piece while its steps run on the device (the
  /// snapshot that first needs a set locks what is left), instead of
  /// allocating page-locked memory at that snapshot (seconds at 8B).
  bool prepare_snapshot_buffers = false;
  // The gradient layout follows the device and dtype, with no switch: on CUDA
  // with a bf16/fp16 model, masters, moments, model and gradients live in flat
  // buffers, the update is two kernels (gpu/kernels/adamw_flat.hpp) and the
  // weight gradients are written by their GEMMs (gpu/models/linear.hpp); on
  // the CPU (and for fp32 models) plain LibTorch tensors and the foreach
  // AdamW.  The A/B variants measured against it: gpu/dev/grad_layouts.patch.
};

struct drafter_info {
  int64_t vocab_size = 0, hidden_size = 0, layers = 0, block_size = 0;
  int64_t num_target_layers = 0, mask_token_id = 0;
  std::vector<int64_t> tap_ids;
  int64_t parameters = 0;            ///< trainable
  std::string dtype;                 ///< compute dtype
  int32_t device = -1;
  /// How its DFlash attention runs (dflash_attention_path): "cuda kernel",
  /// "cuda kernel (<form>)", or "sdpa dense mask (<why not>)".
  std::string attention;
};

/// What one training step did (read back after the step).
struct step_result {
  int64_t step = 0;           ///< updates applied so far (a skipped one does not count)
  double loss = 0;            ///< decay-weighted CE (DFLASH.md step 4)
  double accuracy = 0;        ///< argmax hits over scored tokens
  /// Simulated acceptance length: per block, 1 + the run of correct argmax
  /// predictions from position 1, averaged over blocks with a scored
  /// position (SpecForge's training-time estimate; not τ, which only real
  /// speculative decoding measures: gpu/decode/).
  double sim_accept = 0;
  double grad_norm = 0;       ///< global norm before clipping
  double lr = 0;              ///< the learning rate of this update
  int64_t scored_tokens = 0;  ///< Σ m
  bool finite = true;         ///< false: non-finite loss or grad norm; nothing was updated
  double compute_ms = 0;      ///< wall time of the step, results read back
  double tflop = 0;           ///< its useful work (gpu/models/flops.hpp; Σ anchor_j at its expectation)
};

/// Failures to inject (tests of the supervision paths).
enum class fault {
  nan_loss,       ///< the next step's loss (and so its gradients) becomes NaN
  throw_in_step,  ///< the next step throws gpu::error(errc::device_failure) after backward
  cuda_error,     ///< after backward, a real non-sticky CUDA error (a launch of too many threads
                  ///< a block): device_failure, the context stays usable (CUDA only)
  cuda_sticky,    ///< after backward, a kernel stores to an unmapped address: the read-back
                  ///< fails with cudaErrorIllegalAddress and the context is lost for the
                  ///< process (gpu::context_error says so; CUDA only)
  throw_after_update,  ///< (engine tests) the next step throws gpu::error(errc::device_failure)
                       ///< once its update is queued (on the CPU: done), before its results
                       ///< are read back: a failure in the middle of an update
};

class drafter_engine {
public:
  /// Reads the target's config, embedding and lm-head, builds the drafter
  /// config and initialises the weights from `seed` (normal std 0.02 for the
  /// linear weights, 1 for the norms; drawn on the CPU, so the same on every
  /// device), all on the calling thread.  Throws gpu::error: bad_input (an
  /// option or the target's files; the message names which),
  /// device_unavailable.
  explicit drafter_engine(const drafter_engine_options& opts);
  ~drafter_engine();
  drafter_engine(drafter_engine&&) noexcept;
  drafter_engine& operator=(drafter_engine&&) noexcept;

  const drafter_info& info() const;

  /// The trainable parameters a drafter built from `opts` has (info().
  /// parameters), from the target's config.json alone: nothing is loaded.
  /// For the disk-space check before a run.  Throws gpu::error(bad_input)
  /// for an unreadable config.
  static int64_t parameter_count(const drafter_engine_options& opts);

  /// Updates applied so far.
  int64_t step() const;

  /// The device's memory as its caching allocator counts it (bytes; all 0
  /// on the CPU): allocated now, reserved now, the most ever allocated.
  /// Every engine on the device shares these.  Cheap (no device sync).
  struct memory_figures {
    int64_t allocated = 0, reserved = 0, peak = 0;
  };
  memory_figures device_memory() const;
  /// The captured graphs of this engine (0 or 1: the whole step) and the
  /// bytes of their private memory pools.
  std::pair<int32_t, int64_t> graph_pools() const;
  /// Updates the weights hold, read from the device after its work has
  /// drained: after a step that threw because its group's collective failed
  /// (a peer died), the update was either skipped (the collective was cut
  /// short: weights, moments and count unchanged) or applied in full (it had
  /// completed); step() follows it from then on.
  int64_t sync_step();

  /// One step on `batch` {tokens, loss_mask, doc_lengths} and `features`
  /// {taps [B, S, n·D]}: anchors from the engine's generator, block layout,
  /// objective, backward, clip, AdamW.  Neither handle is released.  A
  /// non-finite loss or gradient norm applies nothing (finite = false); the
  /// caller decides what follows.  Throws gpu::error(bad_input) for payloads
  /// that do not fit the drafter, gpu::error(device_failure) when the
  /// computation fails.
  /// `contribute` false (a data-parallel rank without a batch of its own
  /// this step): the loss is scaled by 0, so the rank joins the group's
  /// all-reduce with a zero gradient; its metrics are reported as usual.
  /// `lr_scale`: the learning-rate multiplier of this step (the scheduled
  /// lr times it; > 0, finite; set at run time through the control endpoint).
  step_result train_step(transport::handle batch, transport::handle features,
                         bool contribute = true, double lr_scale = 1.0);

  /// Joins a data-parallel group of drafters (DESIGN.md §3, §4) as `rank`
  /// of `world`: every rank calls it, each on its own thread and GPU, with
  /// the same `nccl_unique_id` (nccl::new_unique_id's bytes, made once and
  /// sent to every rank in a message).  Blocks until all ranks have joined,
  /// within `timeout`.  Then:
  ///  - every rank takes rank 0's master weights, optimizer moments and
  ///    update count (one broadcast), so ranks may be built with different
  ///    seeds (run.cpp adds the drafter index) and still start as replicas;
  ///    the anchor generators stay each rank's own;
  ///  - the fp32 gradients the optimizer reads live in one flat bucket, and
  ///    every step all-reduces it with ncclAvg after backward and before
  ///    clipping, on the step's stream, so it is captured in the step's graph
  ///    like the rest; every rank clips the same averaged gradient and applies
  ///    the same update (weights stay bit-identical); loss, accuracy and
  ///    scored tokens in step_result stay local, grad_norm is the averaged one;
  ///  - every rank must call train_step the same number of times, together
  ///    (a step is a collective); a captured graph is dropped on joining and
  ///    the next step runs eagerly, which is the eager use of the all-reduce
  ///    NCCL needs before it is captured;
  ///  - after each step the host waits for the collective within `timeout`:
  ///    a rank that never arrives makes train_step throw gpu::error(timeout)
  ///    (the communicator is aborted; leave_group, then join a new group);
  ///    so does an abort from another thread (nccl::abort_group: a peer is
  ///    known dead).  A one-element all-reduce after the gradient's tells the
  ///    step whether the collective completed on this rank: if not, the
  ///    update is skipped on the device, so the rank's state is still the
  ///    previous step's (sync_step says which).
  /// `world` 1 is a no-op.  restore() acts on this rank alone: restore every
  /// rank from the same checkpoint, or restore one and re-join.  Throws
  /// gpu::error: bad_input (a CPU drafter, already in a group, a bad rank or
  /// timeout), device_unavailable (built without NCCL), timeout and
  /// device_failure (from NCCL, the message naming rank, world and device).
  void join_group(const std::vector<uint8_t>& nccl_unique_id, int rank, int world,
                  std::chrono::milliseconds timeout);

  /// Leaves the group: waits for the stream, frees the graph that captured
  /// the all-reduce, then closes the communicator within `timeout` (call it
  /// on all ranks together; past the timeout it aborts).  True when it
  /// closed cleanly (or there was no group).  The destructor does the same
  /// with the join timeout.
  bool leave_group(std::chrono::milliseconds timeout);

  /// In a group whose communicator has failed (a collective timed out or
  /// was aborted, or NCCL reported an error): leave_group, read sync_step
  /// (the state is that of the step before or, when the collective had
  /// completed, after), and join a new group.
  bool group_broken() const;

  /// The group's size: 1 when not in a group.
  int group_world() const;

  /// Arms a fault for the next train_step.
  void inject(fault f);

  /// Fault injection (kind "slow_snapshot"): the next snapshot() keeps
  /// copying the weights to the host, on the calling thread, until `seconds`
  /// have passed — a real copy that is slow, as a large drafter's is on a
  /// host whose pinned memory grows slowly, not a sleep beside it.
  void slow_next_snapshot(double seconds);

  /// Publishes CPU fp32 copies of the master weights and the optimizer
  /// state plus the engine's state (step, generator, options), for
  /// write_checkpoint on another thread.  The caller owns the handle.  The
  /// copies are complete when this returns.
  transport::handle snapshot() const;

  /// The same without blocking the caller for the copy: starts it (the
  /// state as of now: step, generator, masters, moments) into page-locked
  /// host buffers allocated once and reused (a second set while the first is
  /// still held by a write: double-buffered), on a side stream; the next
  /// step waits for it on the device, not on the host — unless the restore
  /// point in device memory holds this very step: then the copy reads it
  /// instead of the masters, the next step does not wait, and
  /// keep_restore_point skips steps until the copy has landed; or unless the
  /// restore point is in place (memory_every 1, CUDA): then the state is
  /// first copied on the device into staging buffers, the next step waits
  /// for that device copy (not for the host's), and the host copy reads the
  /// staging.  poll_snapshot()
  /// returns the handle once the copy has landed (at once on the CPU, where
  /// the copy is done here).  One at a time: begin_snapshot throws
  /// gpu::error(bad_input) while one is in flight.  An injected
  /// slow_snapshot copies here, on the calling thread, as snapshot() does.
  void begin_snapshot();
  /// The snapshot begun last, once complete (then the caller owns the
  /// handle); std::nullopt while its copy runs.  Throws gpu::error
  /// (device_failure) when the copy failed, (bad_input) when none was begun.
  std::optional<transport::handle> poll_snapshot();

  /// After a step: every options.memory_every steps, copies the state into
  /// the restore point in device memory (asynchronously, on a side stream;
  /// the next step waits for it); in place (memory_every 1) makes the
  /// engine's own state the point, once, and copies nothing.  Returns the
  /// step the restore point holds once that copy lands (−1: none).  A newer
  /// engine of the same slot owns it: an older one (a hung incarnation that
  /// woke up) never overwrites it, nor marks an in-place one.
  int64_t keep_restore_point();

  /// Restores the restore point in device memory of options.memory_slot,
  /// which must hold update `step` (written whole: a copy cut short, or an
  /// in-place point whose drafter failed mid-update, is refused) and fit
  /// this drafter; this engine owns it from then on (in place: its own
  /// state becomes the point, and the copy out of the old engine's state
  /// has landed on return).
  /// Throws gpu::error(device_failure) naming what is wrong (none there, another
  /// step, another shape or device, a device error reading it); the engine
  /// is unchanged then, and the caller falls back to a checkpoint.
  void restore_memory(int64_t step);

  /// Drops every restore point in device memory of this process (tests).
  static void drop_restore_points();

  /// Loads a checkpoint written by write_checkpoint: weights, optimizer
  /// moments, step and generator, bit-exactly (a run restored from step k
  /// continues exactly as the run that wrote it).  The checkpoint must be of
  /// a drafter of the same shape.  Throws gpu::error(bad_input) naming the
  /// file and field at fault; the engine is unchanged then.
  void restore(const std::filesystem::path& dir);

  /// Replaces the master weights (and the model copy) by those in `dir`: a
  /// Tandem checkpoint (weights.safetensors) or a z-lab DFlash export
  /// (config.json with dflash_config + model.safetensors).  Step, optimizer
  /// moments and generator are left as they are.  The construction calls it
  /// for options.init_from.  Throws gpu::error(bad_input) naming the file
  /// and the field or tensor that does not fit; the engine is unchanged then.
  void warm_start(const std::filesystem::path& dir);

  /// Writes the z-lab DFlash layout (config.json + model.safetensors) of the
  /// current master weights in `dtype` ("bfloat16", "float16", "float32").
  void export_zlab(const std::filesystem::path& dir, const std::string& dtype = "bfloat16") const;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace tandem::gpu
