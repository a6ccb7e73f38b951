#include "gpu/engine/drafter_engine.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <future>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <type_traits>
#include <utility>

#include <sys/mman.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "gpu/models/dflash_objective.hpp"
#include "gpu/engine/adamw.hpp"
#include "gpu/engine/checkpoint_io.hpp"
#include "gpu/engine/engine_common.hpp"
#include "gpu/engine/graph.hpp"
#include "gpu/device/env.hpp"
#include "gpu/device/error.hpp"
#include "gpu/io/hf_config.hpp"
#include "gpu/models/dflash.hpp"
#include "gpu/models/dflash_attention.hpp"
#include "gpu/models/linear.hpp"
#include "gpu/models/qwen3.hpp"
#include "gpu/nccl/communicator.hpp"
#include "gpu/models/flops.hpp"
#include "gpu/nccl/flat_bucket.hpp"
#include "gpu/pch.hpp"
#include "gpu/io/safetensors.hpp"
#include "gpu/transport/tensors.hpp"
#include "gpu/device/shape_text.hpp"

#ifdef TANDEM_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "gpu/kernels/fault.hpp"
#endif

namespace tandem::gpu {

namespace {

using json = nlohmann::json;

const std::string who = "drafter engine";

void require(bool ok, const std::string& what) {
  if (!ok)
    throw error(errc::bad_input, who + ": " + what);
}

void require_positive_scale(double lr_scale) {
  require(lr_scale > 0 && std::isfinite(lr_scale),
          "the learning-rate multiplier must be positive and finite, got " + std::to_string(lr_scale));
}

/// The fields of the drafter's shape that a checkpoint must agree with.
json shape_json(const dflash_config& c) {
  return {{"vocab_size", c.layer.vocab_size},
          {"hidden_size", c.layer.hidden_size},
          {"intermediate_size", c.layer.intermediate_size},
          {"num_hidden_layers", c.layer.num_hidden_layers},
          {"num_attention_heads", c.layer.num_attention_heads},
          {"num_key_value_heads", c.layer.num_key_value_heads},
          {"head_dim", c.layer.head_dim},
          {"block_size", c.block_size},
          {"num_target_layers", c.num_target_layers},
          {"mask_token_id", c.mask_token_id},
          {"target_layer_ids", c.target_layer_ids}};
}

json options_json(const drafter_engine_options& o) {
  return {{"target_dir", o.target_dir.string()}, {"device", o.device},
          {"dtype", o.dtype},                    {"layers", o.layers},
          {"block_size", o.block_size},          {"mask_token_id", o.mask_token_id},
          {"anchors", o.anchors},                {"chunk_rows", o.chunk_rows},
          {"tap_ids", o.tap_ids},                {"seed", o.seed},
          {"lr", o.lr},                          {"warmup_ratio", o.warmup_ratio},
          {"weight_decay", o.weight_decay},      {"grad_clip", o.grad_clip},
          {"beta1", o.beta1},                    {"beta2", o.beta2},
          {"eps", o.eps},                        {"total_steps", o.total_steps}};
}

/// The step's metrics, one slot each (field order is slot order): packed by
/// the step into one [step_metric_count] float32 tensor on the device (the
/// captured step's output when graphed) and read back once after it as
/// doubles.  `T` is at::Tensor (each [], any float dtype) when packing,
/// double when reading back.
template <class T>
struct step_metric_slots {
  T loss;       ///< this rank's loss (× poison: 0 when not contributing, NaN on an injected fault)
  T accuracy;   ///< this rank's accuracy over its scored positions
  T sim_accept; ///< this rank's simulated acceptance length (objective_output::sim_accept)
  T grad_norm;  ///< the global gradient norm before clipping (averaged over the group)
  T lr;         ///< the learning rate the update used
  T scored;     ///< scored positions (Σ loss mask)
  T skipped;    ///< 1: non-finite loss or norm, the update was skipped; 0: applied
  T step;       ///< the optimizer's update count after this step
};
constexpr int64_t step_metric_count = 8;
static_assert(sizeof(step_metric_slots<double>) == step_metric_count * sizeof(double)
                && std::is_standard_layout_v<step_metric_slots<double>>
                && std::is_trivially_copyable_v<step_metric_slots<double>>,
              "step_metric_slots: one slot per field, no padding (the read-back is copied in)");

/// The slots as one [step_metric_count] float32 tensor, in field order.
at::Tensor pack(const step_metric_slots<at::Tensor>& m) {
  return at::stack({m.loss.to(at::kFloat), m.accuracy.to(at::kFloat), m.sim_accept.to(at::kFloat),
                    m.grad_norm.to(at::kFloat),
                    m.lr.to(at::kFloat), m.scored.to(at::kFloat), m.skipped.to(at::kFloat),
                    m.step.to(at::kFloat)});
}

/// `host`: the packed slots read back as [step_metric_count] doubles on the CPU.
step_metric_slots<double> unpack(const at::Tensor& host) {
  TORCH_CHECK(host.device().is_cpu() && host.scalar_type() == at::kDouble && host.dim() == 1
                && host.size(0) == step_metric_count && host.is_contiguous(),
              "step metrics read-back: expected a contiguous CPU double tensor [", step_metric_count,
              "], got ", host.sizes(), " ", host.scalar_type());
  step_metric_slots<double> m;
  std::memcpy(&m, host.data_ptr<double>(), sizeof m);
  return m;
}

} // namespace

namespace {

#ifdef TANDEM_HAVE_CUDA
/// A CUDA event (no timing) whose destruction never throws: at::cuda::
/// CUDAEvent's destructor sets the device first, which throws once the
/// runtime is shutting down (an engine or restore point freed at exit).
class copy_event {
public:
  copy_event() {
    if (cudaEventCreateWithFlags(&e_, cudaEventDisableTiming) != cudaSuccess)
      throw error(errc::device_failure, std::string("cudaEventCreate: ") + cudaGetErrorString(cudaGetLastError()));
  }
  ~copy_event() { (void)cudaEventDestroy(e_); }
  copy_event(const copy_event&) = delete;
  copy_event& operator=(const copy_event&) = delete;
  void record(cudaStream_t s) { check(cudaEventRecord(e_, s), "cudaEventRecord"); }
  void block(cudaStream_t s) { check(cudaStreamWaitEvent(s, e_, 0), "cudaStreamWaitEvent"); }
  void synchronize() { check(cudaEventSynchronize(e_), "cudaEventSynchronize"); }
  bool query() {
    const auto rc = cudaEventQuery(e_);
    if (rc == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    check(rc, "cudaEventQuery");
    return true;
  }

private:
  static void check(cudaError_t rc, const char* what) {
    if (rc != cudaSuccess)
      throw error(errc::device_failure, std::string(what) + ": " + cudaGetErrorString(rc));
  }
  cudaEvent_t e_ = nullptr;
};
#endif

/// A drafter's restore point in device memory (drafter_engine_options::
/// memory_every): its fp32 masters and moments on its device, the update
/// count they hold and the generator's state then.  Lives in a process-wide
/// table by slot, so it outlives the engine that wrote it.
///
/// Two kinds.  A copy (memory_every ≥ 2): buffers of its own, written on a
/// side stream after every memory_every-th step.  In place (memory_every
/// 1): views of the owning engine's own masters and moments (they keep that
/// memory alive after the engine is gone), valid between its updates — the
/// engine sets `held` to −1 under memory_mutex before it queues an update
/// and back to the update count once the step's results are read back, so
/// a failure in the middle of an update (also a step that hangs on the
/// device: its update is queued) leaves a point that is refused, and one
/// before it (a throw, a hang of the drafter's thread before its step, a
/// non-finite loss, whose update is skipped) a point that holds the last
/// step.  No copy at all.
struct memory_restore_point {
  at::Device device{at::kCPU};
  std::vector<at::Tensor> masters, exp_avg, exp_avg_sq;  ///< fp32, shapes of the engine's
  at::Tensor marker;       ///< copy: [] int64 on `device`: the update count held; −1 while a copy runs
  bool in_place = false;   ///< views of the owner's live state (then `held`, not `marker`)
  int64_t held = -1;       ///< in place: the update count the owner's state holds; −1 mid-update
  std::string generator;   ///< the anchor generator's state at that count (hex)
  uint64_t owner = 0;      ///< the incarnation number of the engine that writes it
#ifdef TANDEM_HAVE_CUDA
  std::optional<copy_event> copied;  ///< recorded after the last copy
#endif
};

std::mutex memory_mutex;
/// Never destroyed: its device tensors and events must not be freed by the
/// static destructors at exit, after the CUDA runtime has shut down.
auto& memory_table = *new std::map<int32_t, std::shared_ptr<memory_restore_point>>();
std::atomic<uint64_t> incarnations{0};

/// A snapshot's host buffers: the masters and both moments (fp32, shapes of
/// the masters) and the step, as views of one block — page-locked on CUDA,
/// allocated at its exact size in one call (PyTorch's caching host
/// allocator rounds every tensor up to a power of two: ≈ 16 GB pinned for
/// the 8B drafter's 12.6 GB, in ≈ 170 calls).  Reused once every tensor of
/// the set is ours alone again (the writer released the handle).
struct host_set {
  std::vector<at::Tensor> weights, exp_avg, exp_avg_sq;
  at::Tensor step;  ///< [] fp32
  bool free() const {
    auto alone = [](const at::Tensor& t) { return t.use_count() == 1 && t.storage().use_count() == 1; };
    if (!alone(step))
      return false;
    for (const auto* list : {&weights, &exp_avg, &exp_avg_sq})
      for (const auto& t : *list)
        if (!alone(t))
          return false;
    return true;
  }
  bool pinned = false;  ///< page-locked (made for a CUDA engine)
  /// Whether its tensors have these shapes and it is page-locked as `pin` asks.
  bool fits(const std::vector<at::Tensor>& masters, bool pin) const {
    if (weights.size() != masters.size() || pinned != pin)
      return false;
    for (size_t i = 0; i < masters.size(); ++i)
      if (weights[i].sizes() != masters[i].sizes())
        return false;
    return true;
  }
};

/// Host sets that drafters left when they ended, by memory slot, for the
/// next incarnation of that drafter (pinning 12.6 GB costs seconds on its
/// thread), and the newest incarnation of each slot: an older one that
/// ends later (hung, then woke) leaves nothing.  Never destroyed
/// (page-locked memory is not freed by the static destructors after the
/// CUDA runtime has shut down).
struct host_pool_slot {
  uint64_t newest = 0;
  std::vector<host_set> sets;  ///< at most two
};
std::mutex host_pool_mutex;
auto& host_pool = *new std::map<int32_t, host_pool_slot>();

/// The error for a snapshot's host memory that cannot be had.
error no_host_memory(size_t bytes, bool pin, const std::string& why) {
  return error(errc::bad_input, who + ": cannot allocate " + std::to_string(bytes >> 20) + " MiB of "
                                  + (pin ? "page-locked " : "") + "host memory for a snapshot (" + why
                                  + "): the host lacks memory for this drafter's checkpoints and restore points "
                                    "(checkpoint.every_steps, checkpoint.host_every)");
}

/// Host memory mapped and every page touched: plain system calls and
/// stores, no CUDA, so any thread may make it (the drafter's thread then
/// only page-locks it, which costs a fraction of allocating page-locked
/// memory: the pages are already there).  Empty when the mapping fails.
struct mapped_block {
  void* p = nullptr;
  size_t bytes = 0;
};

mapped_block map_and_touch(size_t bytes, const std::atomic<bool>& cancel) {
  constexpr size_t huge = size_t{2} << 20;
  bytes = (bytes + huge - 1) / huge * huge;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return {};
  (void)madvise(p, bytes, MADV_HUGEPAGE);  // fewer, larger pages to fault in and to pin
  auto* c = static_cast<volatile char*>(p);
  for (size_t at = 0; at < bytes; at += 4096) {
    if ((at & (huge - 1)) == 0 && cancel.load(std::memory_order_relaxed)) {
      munmap(p, bytes);
      return {};
    }
    c[at] = 0;
  }
  return {p, bytes};
}

constexpr size_t host_align = 256;  ///< each tensor of a host set on its own 256-byte boundary

/// `n` rounded up to a multiple of `m`.
size_t round_up(size_t n, size_t m) {
  return (n + m - 1) / m * m;
}

/// A page-locked piece's alignment: the host's page (locking is by page;
/// two pieces must never share one).
size_t host_page() {
  static const size_t page = std::max<size_t>(4096, static_cast<size_t>(std::max(0L, sysconf(_SC_PAGESIZE))));
  return page;
}

/// Where a host set's tensors lie in its block: the masters', then the
/// first moments', the second moments' (fp32, in the masters' order), the
/// step's last.  The block is page-locked in pieces of whole tensors, each
/// starting on a page of its own, so that the drafter's thread can lock
/// them a few at a time while its steps run (drafter_engine::impl::pin_some)
/// and every tensor's copy lands in one page-locked range.  A piece closes
/// once it holds a sixteenth of the set or 64 MiB, whichever is less, so
/// it is that or one tensor, whichever is larger (at 8B: 64 MiB to 335 MB,
/// ≈ 1.3–7 ms to lock).
struct host_layout {
  std::vector<size_t> offsets;                    ///< by tensor, in the order above
  std::vector<std::pair<size_t, size_t>> pieces;  ///< [begin, end) byte ranges, page-aligned, in order
  size_t bytes = 0;
};

host_layout layout_of(const std::vector<at::Tensor>& masters) {
  auto padded = [](int64_t numel) { return round_up(static_cast<size_t>(numel) * sizeof(float), host_align); };
  size_t raw = padded(1);
  for (const auto& m : masters)
    raw += 3 * padded(m.numel());
  const size_t page = host_page();
  const size_t piece = std::clamp(raw / 16, page, size_t{64} << 20);
  host_layout l;
  size_t piece_start = 0;
  auto place = [&](int64_t numel) {
    if (l.bytes - piece_start >= piece) {  // the next piece starts at this tensor, on a page of its own
      l.bytes = round_up(l.bytes, page);
      l.pieces.emplace_back(piece_start, l.bytes);
      piece_start = l.bytes;
    }
    l.offsets.push_back(l.bytes);
    l.bytes += padded(numel);
  };
  for (int role = 0; role < 3; ++role)
    for (const auto& m : masters)
      place(m.numel());
  place(1);
  l.bytes = round_up(l.bytes, page);
  l.pieces.emplace_back(piece_start, l.bytes);
  return l;
}

/// A prepared block (mapped_block) being page-locked piece by piece
/// (host_layout::pieces); `locked` pieces are, from the first.
struct pinning_block {
  mapped_block block;
  std::vector<std::pair<size_t, size_t>> pieces;
  size_t locked = 0;
  bool failed = false;  ///< a piece could not be locked: the set is allocated page-locked instead

  /// Pieces are left to lock (none failed).
  bool pending() const { return !failed && locked < pieces.size(); }
  /// Locks the next piece; false when none is left or locking failed.
  bool lock_next() {
#ifdef TANDEM_HAVE_CUDA
    if (!pending())
      return false;
    const auto [b, e] = pieces[locked];
    if (cudaHostRegister(static_cast<char*>(block.p) + b, e - b, cudaHostRegisterPortable) != cudaSuccess) {
      (void)cudaGetLastError();
      failed = true;
      return false;
    }
    ++locked;
    return true;
#else
    return false;
#endif
  }
  /// Unlocks what was locked and unmaps the block.
  void release() {
#ifdef TANDEM_HAVE_CUDA
    for (size_t i = 0; i < locked; ++i)
      (void)cudaHostUnregister(static_cast<char*>(block.p) + pieces[i].first);
#endif
    locked = 0;
    if (block.p)
      munmap(block.p, block.bytes);
    block = {};
  }
};

/// `bytes` of host memory, page-locked when `pin` (portable: a pinned
/// buffer for any device's copies), freed when the last holder lets go:
/// `ready`'s block (mapped and touched, at least `bytes`) — on CUDA every
/// piece of it page-locked (the rest locked here) — or else allocated
/// page-locked.
std::shared_ptr<void> host_block(size_t bytes, bool pin, pinning_block ready = {}) {
  if (ready.block.p && ready.block.bytes >= bytes) {
    if (!pin)
      return {ready.block.p, [n = ready.block.bytes](void* q) { munmap(q, n); }};
    while (ready.lock_next()) {
    }
    if (!ready.failed)  // every piece locked
      return {ready.block.p, [r = ready](void*) mutable { r.release(); }};
  }
  ready.release();  // allocated page-locked below instead
#ifdef TANDEM_HAVE_CUDA
  if (pin) {
    void* p = nullptr;
    const auto rc = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      throw no_host_memory(bytes, pin, cudaGetErrorString(rc));
    }
    return {p, [](void* q) { (void)cudaFreeHost(q); }};
  }
#endif
  void* p = std::aligned_alloc(host_page(), round_up(bytes, host_page()));
  if (!p)
    throw no_host_memory(bytes, pin, "aligned_alloc failed");
  return {p, [](void* q) { std::free(q); }};
}

/// A host set for `masters` laid out as `layout`, its tensors views of one
/// host_block (page-locked when `pin`; made of `ready` when it holds the memory).
host_set make_host_set(const std::vector<at::Tensor>& masters, const host_layout& layout, bool pin,
                       pinning_block ready) {
  auto block = host_block(layout.bytes, pin, std::move(ready));
  auto* base = static_cast<char*>(block.get());
  size_t next = 0;
  auto view = [&](at::IntArrayRef sizes) {
    return at::from_blob(base + layout.offsets[next++], sizes, [block](void*) {},
                         at::TensorOptions().dtype(at::kFloat));
  };
  host_set h;
  h.pinned = pin;
  for (const auto& m : masters)
    h.weights.push_back(view(m.sizes()));
  for (const auto& m : masters)
    h.exp_avg.push_back(view(m.sizes()));
  for (const auto& m : masters)
    h.exp_avg_sq.push_back(view(m.sizes()));
  h.step = view({});
  return h;
}

} // namespace

struct drafter_engine::impl {
  drafter_engine_options opts;
  at::Device device{at::kCPU};
  at::ScalarType dtype = at::kFloat;
  dflash_config cfg;
  objective_options objective;
  at::Tensor embed;                  ///< [V, D] target's, frozen, dtype
  at::Tensor lm_head;                ///< [V, D] target's, frozen, dtype (= embed when tied)
  dflash_weights master;             ///< fp32, what the optimizer updates
  dflash_weights model;              ///< dtype, what forward/backward use (= master on fp32)
  std::vector<std::string> names;    ///< z-lab names, dflash_parameters order (P of them)
  std::vector<at::Tensor> masters;   ///< P fp32 tensors, master's in that order (shapes: dflash.hpp)
  std::vector<at::Tensor> params;    ///< P dtype tensors, model's in that order
  std::vector<at::Tensor> fp32_grads;  ///< P fp32, like masters: the optimizer's gradients (= params'
                                       ///< grads on fp32; unused when flat)
  /// Flat mode (CUDA, bf16/fp16 model): every parameter is a view of one
  /// buffer per role, at the same offsets (each slot padded to 8 elements),
  /// and the optimizer's update is one pass over them (adamw::step_flat).
  struct flat_buffers {
    at::Tensor master;  ///< [N] fp32: masters[i] are views (N = Σ numel rounded up to 8)
    at::Tensor model;   ///< [N] dtype: params[i] are views (leaves)
    at::Tensor grad;    ///< [N] dtype: params[i].grad() are views (autograd accumulates in place)
    at::Tensor reduced; ///< [N] fp32: in a group, the averaged gradient (grad copied, all-reduced)
    std::vector<int64_t> offsets;  ///< parameter i's slot, in elements
    std::vector<at::Tensor> vector_grads;  ///< the 1-D parameters' gradients (zeroed each step)
    size_t matrices = 0;           ///< 2-D parameters: fused_linear writes their gradients
    grad_writes writes;            ///< which of them this step has written
  } flat;
  std::unique_ptr<adamw> optimizer;
  at::Generator gen;                 ///< anchors; private, on the device
  drafter_info info;
  int64_t applied = 0;               ///< host mirror of the optimizer's update count
  int64_t steps_here = 0;            ///< steps this engine completed (the first two, eager and
                                     ///< captured, allocate what later ones reuse)
  bool nan_armed = false;
  /// An injected fault that fails the step after backward, before the
  /// update (the step then runs eagerly, also when graphed).
  enum class armed_failure : uint8_t { none, throw_in_step, cuda_error, cuda_sticky };
  armed_failure failure_armed = armed_failure::none;
  bool throw_after_update_armed = false;  ///< fault::throw_after_update
  mutable double slow_snapshot_s = 0;  ///< > 0: the next snapshot copies for this long (a fault)
  at::Tensor poison;                 ///< [] float32 on the device: the loss's factor — 1, NaN (an
                                     ///< injected nan fault), 0 (a rank that does not contribute)
  /// Data-parallel group (join_group, world > 1).  Once joined, fp32_grads
  /// are views of `bucket` (kept after leave_group: harmless without a group).
  nccl::flat_bucket bucket;
  std::unique_ptr<nccl::communicator> comm;  ///< null: no group
  std::chrono::milliseconds group_timeout{0};
  /// Asynchronous snapshots (begin_snapshot): sets of page-locked host
  /// buffers (host_set), at most two, and the snapshot in flight.
  std::vector<host_set> host_sets;
  std::future<mapped_block> preparing;  ///< the next set's memory, being mapped and touched
  pinning_block pinning;  ///< the next set's memory, prepared, being page-locked (pin_some); none: null block
  std::optional<host_layout> layout;  ///< of a host set of this engine's masters (made at first use)
  std::shared_ptr<std::atomic<bool>> cancel_prepare = std::make_shared<std::atomic<bool>>(false);
  std::optional<snapshot_parts> pending_snapshot;
  std::optional<transport::handle> pending_handle;  ///< a snapshot taken synchronously (slow_snapshot)
#ifdef TANDEM_HAVE_CUDA
  std::optional<copy_event> snapshot_copied;  ///< recorded after the copy in flight
#endif
  /// The snapshot in flight copies from the restore point in device memory
  /// (it held this very step) or from the staging buffers (in place), not
  /// from the masters: the next update need not wait for it (for a copied
  /// restore point, keep_restore_point skips steps until it has landed).
  bool snapshot_reads_memory = false;
  const uint64_t incarnation = ++incarnations;  ///< newer engines own the restore point
  std::shared_ptr<memory_restore_point> memory;  ///< the restore point this engine writes (null: none)
  int64_t memory_held = -1;                      ///< the update count it holds once its copy lands
  bool capturing = false;  ///< step_body runs inside a graph capture (nothing is executed)
#ifdef TANDEM_HAVE_CUDA
  /// In place (memory_every 1), on CUDA: a snapshot copies the state here
  /// first, device to device (the next step waits for that copy, not the host's),
  /// and to the host from here beside training.  12 bytes a parameter
  /// (what a copied restore point takes), made with the restore point when
  /// the run snapshots this drafter (prepare_snapshot_buffers), else at the
  /// first snapshot.
  std::vector<at::Tensor> staged_w, staged_m, staged_v;
  std::optional<copy_event> staged;  ///< recorded after the copy into them
#endif
  at::Tensor guard;    ///< [1] fp32: the step's completion check (guarded_loss)
  at::Tensor aborted;  ///< [1] int32 view of the communicator's abort flag (guarded_loss)

  bool mixed() const { return dtype != at::kFloat; }

  explicit impl(const drafter_engine_options& o) : opts(o) {
    device = detail::engine_device(o.device, who);
    dtype = detail::engine_dtype(o.dtype, device, who);
    detail::device_scope scope(device);
    check_options();
    build_config();
    load_frozen();
    init_weights();
    optimizer = flat.master.defined()
                  ? std::make_unique<adamw>(masters, optimizer_options(), flat.master)
                  : std::make_unique<adamw>(masters, optimizer_options());
    gen = detail::private_generator(device, detail::mix_seed(o.seed, 1));
    poison = at::ones({}, at::TensorOptions().dtype(at::kFloat).device(device));
    fill_info();
    if (!o.init_from.empty())
      warm_start(o.init_from);
    claim_host_sets();
    prepare_host_set();
  }

  ~impl() {
    try {
      leave_group(group_timeout);
    } catch (...) {
    }
    if (preparing.valid()) {  // stopped at its next 2 MiB, and unmapped
      cancel_prepare->store(true);
      if (auto m = preparing.get(); m.p)
        munmap(m.p, m.bytes);
    }
    pinning.release();
#ifdef TANDEM_HAVE_CUDA
    // The side stream's copies read the masters and moments (a restore
    // point in device memory, a snapshot): they end before those are
    // freed, or a new allocation could take their memory mid-copy.  A
    // restore point taken over by a newer engine (this one hung, then
    // woke) holds that one's copy, which reads none of this engine's.
    try {
      if (memory) {
        std::lock_guard<std::mutex> hold(memory_mutex);
        if (memory->owner == incarnation && memory->copied)
          memory->copied->synchronize();
      }
      if (snapshot_copied)
        snapshot_copied->synchronize();
      leave_host_sets();  // a set's copy has landed: reusable (one still held is not free)
    } catch (...) {
      // A copy may still be writing into a set (the device failed): its
      // memory is left mapped rather than unmapped under it.
      static_cast<void>(new std::vector<host_set>(std::move(host_sets)));
    }
#else
    leave_host_sets();
#endif
  }

  void check_options() const {
    require(opts.layers >= 1, "layers must be at least 1, got " + std::to_string(opts.layers));
    require(opts.block_size >= 2, "block_size must be at least 2, got " + std::to_string(opts.block_size));
    require(opts.anchors >= 1, "anchors must be at least 1, got " + std::to_string(opts.anchors));
    require(opts.chunk_rows >= 1, "chunk_rows must be at least 1, got " + std::to_string(opts.chunk_rows));
    require(opts.lr > 0 && std::isfinite(opts.lr), "lr must be positive");
    require(opts.warmup_ratio >= 0 && opts.warmup_ratio <= 1, "warmup_ratio must be in [0, 1]");
    require(opts.weight_decay >= 0, "weight_decay must be non-negative");
    require(opts.beta1 >= 0 && opts.beta1 < 1, "beta1 must be in [0, 1)");
    require(opts.beta2 >= 0 && opts.beta2 < 1, "beta2 must be in [0, 1)");
    require(opts.eps > 0, "eps must be positive");
  }

  void build_config() {
    auto tc = load_qwen3_config(opts.target_dir);
    auto taps = opts.tap_ids.empty() ? training_tap_ids(tc.num_hidden_layers) : opts.tap_ids;
    for (auto id : taps)
      require(id >= 0 && id < tc.num_hidden_layers,
              "tap layer " + std::to_string(id) + " outside the target's "
                + std::to_string(tc.num_hidden_layers) + " layers");
    require(opts.mask_token_id >= 0 && opts.mask_token_id < tc.vocab_size,
            "mask_token_id " + std::to_string(opts.mask_token_id)
              + " is not a row of the target's embedding (vocab_size "
              + std::to_string(tc.vocab_size) + "; Qwen3 uses 151669)");
    cfg.layer = tc;
    cfg.layer.num_hidden_layers = opts.layers;
    cfg.block_size = opts.block_size;
    cfg.num_target_layers = tc.num_hidden_layers;
    cfg.mask_token_id = opts.mask_token_id;
    cfg.target_layer_ids = taps;
    objective.block_size = opts.block_size;
    objective.mask_token_id = opts.mask_token_id;
    objective.gamma = default_gamma(opts.block_size);
    objective.chunk_rows = opts.chunk_rows;
  }

  void load_frozen() {
    // Embedding and head only (keep_layers = 0): no decoder layer is read.
    auto tensors = load_safetensors(opts.target_dir);
    auto w = qwen3_weights_from(tensors, cfg.layer, dtype, opts.target_dir.string(), 0);
    const bool tied = w.lm_head.is_same(w.embed);
    embed = w.embed.to(device);
    lm_head = tied ? embed : w.lm_head.to(device);
  }

  void init_weights() {
    // Drawn on the CPU with a private generator: the same weights on any device.
    auto g = detail::private_generator(at::Device(at::kCPU), detail::mix_seed(opts.seed, 0));
    const auto d = cfg.layer.hidden_size;
    const auto taps = static_cast<int64_t>(cfg.target_layer_ids.size());
    auto f32 = at::TensorOptions().dtype(at::kFloat);
    master.fc = at::empty({d, taps * d}, f32).normal_(0.0, 0.02, g);
    master.hidden_norm = at::ones({d}, f32);
    const layer_dims dims{d, cfg.layer.intermediate_size, cfg.layer.num_attention_heads,
                          cfg.layer.num_key_value_heads, cfg.layer.head_dim, cfg.layer.rms_norm_eps};
    for (int64_t i = 0; i < cfg.layer.num_hidden_layers; ++i)
      master.layers.push_back(random_decoder_layer(dims, at::kFloat, at::kCPU, g, 0.02));
    master.norm = at::ones({d}, f32);
    for (auto& [name, p] : dflash_parameters(master)) {
      *p = p->to(device).contiguous();
      names.push_back(name);
      masters.push_back(*p);
    }
    if (mixed() && device.is_cuda()) {
      make_flat();
      return;
    }
    if (!mixed()) {
      model = master;
      for (auto& p : masters)
        p.requires_grad_(true);
      params = masters;
    } else {
      model = master;
      for (auto& [name, p] : dflash_parameters(model)) {
        *p = p->to(dtype).detach().requires_grad_(true);
        params.push_back(*p);
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = at::zeros_like(params[i]);
      fp32_grads.push_back(mixed() ? at::zeros_like(masters[i]) : params[i].grad());
    }
  }

  /// Flat mode: masters, the model copy and the gradients become views of
  /// one buffer each, slots padded to multiples of 8 elements (16 bytes of
  /// bf16), which the flat optimizer kernels need.
  void make_flat() {
    at::NoGradGuard no_grad;
    auto& offsets = flat.offsets;
    int64_t n = 0;
    for (const auto& m : masters) {
      offsets.push_back(n);
      n += (m.numel() + 7) / 8 * 8;
    }
    flat.master = at::zeros({n}, masters.front().options());
    auto view = [&](const at::Tensor& buf, size_t i) {
      return buf.narrow(0, offsets[i], masters[i].numel()).view(masters[i].sizes());
    };
    for (size_t i = 0; i < masters.size(); ++i)
      view(flat.master, i).copy_(masters[i]);
    flat.model = flat.master.to(dtype);
    flat.grad = at::zeros({n}, flat.model.options());
    model = master;
    auto m = dflash_parameters(master);
    auto p = dflash_parameters(model);
    for (size_t i = 0; i < masters.size(); ++i) {
      masters[i] = view(flat.master, i);
      *m[i].second = masters[i];
      params.push_back(view(flat.model, i).detach().requires_grad_(true));
      *p[i].second = params.back();
      params.back().mutable_grad() = view(flat.grad, i);
      if (masters[i].dim() == 2)
        ++flat.matrices;
      else
        flat.vector_grads.push_back(params.back().grad());
    }
  }

  adamw_options optimizer_options() const {
    adamw_options a;
    a.lr = opts.lr;
    a.beta1 = opts.beta1;
    a.beta2 = opts.beta2;
    a.eps = opts.eps;
    a.weight_decay = opts.weight_decay;
    a.grad_clip = opts.grad_clip;
    a.warmup_ratio = opts.warmup_ratio;
    a.total_steps = opts.total_steps;
    return a;
  }

  void fill_info() {
    info.vocab_size = cfg.layer.vocab_size;
    info.hidden_size = cfg.layer.hidden_size;
    info.layers = cfg.layer.num_hidden_layers;
    info.block_size = cfg.block_size;
    info.num_target_layers = cfg.num_target_layers;
    info.mask_token_id = cfg.mask_token_id;
    info.tap_ids = cfg.target_layer_ids;
    info.parameters = 0;
    for (const auto& p : masters)
      info.parameters += p.numel();
    info.dtype = detail::dtype_name(dtype);
    info.device = device.is_cuda() ? device.index() : -1;
    info.attention = dflash_attention_path(at::TensorOptions().dtype(dtype).device(device),
                                           cfg.layer.num_attention_heads, cfg.layer.num_key_value_heads,
                                           cfg.layer.head_dim, cfg.block_size);
  }

  /// The model copy follows the masters (after an update or a restore).
  void refresh_model() {
    if (!mixed())
      return;
    at::NoGradGuard no_grad;
    if (flat.model.defined()) {
      flat.model.copy_(flat.master);
      return;
    }
    for (size_t i = 0; i < params.size(); ++i)
      params[i].copy_(masters[i]);
  }

  /// Whether steps run as a captured graph (CUDA and capture_graphs).
  bool graphed() const {
#ifdef TANDEM_HAVE_CUDA
    return device.is_cuda() && opts.capture_graphs;
#else
    return false;
#endif
  }

  /// In a group, after the gradient's all-reduce: the loss that the
  /// optimizer's skip rule sees, NaN when the all-reduce may have been cut
  /// short, so that the update is skipped and the weights, moments and
  /// update count stay as they were: a survivor of a dead peer still holds
  /// a consistent state (DESIGN.md §3; sync_step).  Cut short means the
  /// communicator's abort flag was raised before this check ran (an abort
  /// is the only way an all-reduce ends early, and the flag is raised
  /// before it starts), or a one-element all-reduce of 1 from every rank,
  /// run after the gradient's, does not sum to the world size.
  at::Tensor guarded_loss(const at::Tensor& loss) {
    at::NoGradGuard no_grad;
    guard.fill_(1.0);
    nccl::all_reduce(*comm, guard, nccl::reduce_op::sum);
    const auto cut_short = (guard.ne(static_cast<double>(comm->world())) | aborted.ne(0)).squeeze(0);
    return loss.detach().masked_fill(cut_short, std::numeric_limits<double>::quiet_NaN());
  }

  /// The whole training step on device tensors, without a host
  /// synchronisation (so it can be captured): zero grads, anchors, block
  /// layout, objective, backward, all-reduce of the gradient bucket (in a
  /// group), clip, AdamW, model refresh.  Returns
  /// the step_metric_slots (loss, accuracy, sim_accept, grad_norm, lr,
  /// scored, skipped, step) as float32 on the device.
  ///
  /// `fail_after_backward` (an injected fault; eager only) fails the step
  /// between backward and the update, so the update never runs: a throw, a
  /// real non-sticky CUDA error (a launch of too many threads a block) or a real
  /// sticky one (a kernel storing to an unmapped address: the read-back
  /// after it fails, and the context is lost for the process).
  at::Tensor step_body(const at::Tensor& tokens, const at::Tensor& loss_mask,
                       const at::Tensor& doc_lengths, const at::Tensor& taps,
                       armed_failure fail_after_backward = armed_failure::none) {
    const auto s = tokens.size(1);
    if (flat.grad.defined())
      at::_foreach_zero_(flat.vector_grads);  // the matrices' are written by their GEMMs
    else
      for (auto& p : params)
        p.mutable_grad().zero_();
    auto docs = make_doc_layout(doc_lengths, s);
    auto anchors = sample_anchors(loss_mask, docs, opts.anchors, opts.block_size, gen);
    auto blocks = make_block_batch(tokens, loss_mask, docs, taps.to(dtype), anchors, embed,
                                   opts.block_size, opts.mask_token_id, objective.gamma,
                                   /*dense_mask=*/false);
    // Flat mode: the projections' weight gradients are written into the
    // flat gradient buffer by their GEMMs (gpu/models/linear.hpp): no zeroing
    // of the matrices, no separate add.
    std::optional<weight_grad_accumulation> in_place;
    const bool in_place_grads = flat.grad.defined();
    if (in_place_grads)
      in_place.emplace(flat.writes);
    auto out = dflash_objective(model, cfg, blocks, lm_head, objective);
    in_place.reset();
    auto loss = out.loss * poison;  // poison: 1, or NaN when a nan fault is armed
    loss.backward();
    if (in_place_grads && flat.writes.count() != flat.matrices)
      throw error(errc::device_failure,
                  who + ": " + std::to_string(flat.writes.count()) + " of the "
                    + std::to_string(flat.matrices)
                    + " weight matrices got their gradient from fused_linear this step (a "
                      "projection that bypasses it would keep a stale gradient)");
    switch (fail_after_backward) {
      case armed_failure::none: break;
      case armed_failure::throw_in_step:
        throw error(errc::device_failure, who + ": injected fault (throw_in_step)");
#ifdef TANDEM_HAVE_CUDA
      case armed_failure::cuda_error: {
        const auto rc = kernels::launch_invalid_configuration(c10::cuda::getCurrentCUDAStream(device.index()).stream());
        throw error(errc::device_failure, who + ": CUDA error: " + cudaGetErrorString(rc)
                                            + " (injected fault cuda_error)");
      }
      case armed_failure::cuda_sticky:
        kernels::launch_illegal_store(c10::cuda::getCurrentCUDAStream(device.index()).stream());
        break;  // the step's read-back fails
#else
      case armed_failure::cuda_error:
      case armed_failure::cuda_sticky:
        throw error(errc::bad_input, who + ": the CUDA fault kinds need a CUDA drafter");
#endif
    }
    if (!capturing)  // (the replay marks; and capture_mutex is held there)
      mark_update_begins();
    if (flat.grad.defined())
      return flat_update(loss, out);
    if (mixed()) {
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i)
        fp32_grads[i].copy_(params[i].grad());
    } else if (!bucket.empty()) {
      // The params' grads are the bucket's views (autograd accumulates in
      // place); should autograd ever have replaced one, copy it back in.
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i)
        if (!params[i].grad().is_same(fp32_grads[i]))
          fp32_grads[i].copy_(params[i].grad());
    } else {
      for (size_t i = 0; i < params.size(); ++i)
        fp32_grads[i] = params[i].grad();  // the same buffers; autograd accumulates in place
    }
    // Data-parallel: every rank's gradient → their average, on the current
    // stream (the graph's when graphed, so it is captured with the step),
    // before clipping, so every rank clips the same gradient and applies the
    // same update.  Loss and accuracy stay local.
    auto skip_loss = loss;
    if (comm) {
      nccl::all_reduce(*comm, bucket.flat(), nccl::reduce_op::avg);
      skip_loss = guarded_loss(loss);
    }
    auto st = optimizer->step(fp32_grads, skip_loss);
    refresh_model();
    return step_metrics(loss, out, st);
  }

  at::Tensor step_metrics(const at::Tensor& loss, const objective_output& out, const adamw::stats& st) {
    at::NoGradGuard no_grad;
    step_metric_slots<at::Tensor> m;
    m.loss = loss.detach();
    m.accuracy = out.accuracy;
    m.sim_accept = out.sim_accept;
    m.grad_norm = st.grad_norm;
    m.lr = st.lr;
    m.scored = out.scored;
    m.skipped = st.skipped;
    m.step = optimizer->step_count();
    return pack(m);
  }

  /// Flat mode's update: the gradient (averaged over the group, in fp32,
  /// when there is one) → clip + AdamW + the model copy, in two kernels.
  at::Tensor flat_update(const at::Tensor& loss, const objective_output& out) {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      // Autograd accumulates into the views; should it ever have replaced
      // one, copy it back and restore the view.
      auto g = params[i].grad();
      if (!g.defined() || !g.is_alias_of(flat.grad)) {
        auto v = flat.grad.narrow(0, flat.offsets[i], masters[i].numel()).view(masters[i].sizes());
        if (g.defined())
          v.copy_(g);
        else
          v.zero_();
        params[i].mutable_grad() = v;
      }
    }
    auto grad = flat.grad;
    auto skip_loss = loss;
    if (comm) {
      flat.reduced.copy_(flat.grad);
      nccl::all_reduce(*comm, flat.reduced, nccl::reduce_op::avg);
      grad = flat.reduced;
      skip_loss = guarded_loss(loss);
    }
    auto st = optimizer->step_flat(grad, flat.model, skip_loss);
    return step_metrics(loss, out, st);
  }

#ifdef TANDEM_HAVE_CUDA
  /// The captured step and its static inputs and output (graphed() only).
  /// Its static tensors: the inputs, refilled (copy_) before every replay,
  /// and the output the replay writes.  Everything else the graph touches
  /// is this impl's and keeps its address for the engine's life: `flat`
  /// (or masters / params / fp32_grads), `bucket` and `guard` / `aborted`
  /// in a group, `poison`, `embed`, `lm_head`, the optimizer's state
  /// (adamw.hpp) and `gen`.  B rows, S tokens, K documents a row at most,
  /// n taps of width D.  A shape change means a new capture.
  struct step_graph {
    std::unique_ptr<captured_step> graph;
    at::Tensor tokens;       ///< [B, S] the batch's integer dtype (int32 from the packer)
    at::Tensor loss_mask;    ///< [B, S] uint8
    at::Tensor doc_lengths;  ///< [B, K] int64, each row's documents, then zeros
    at::Tensor taps;         ///< [B, S, n*D] the features' dtype: the target's fused taps
    at::Tensor out;          ///< [step_metric_count] float32: step_body's step_metric_slots
    bool warmed = false;  ///< one eager step has run on the graph's stream
  } sg;

  c10::cuda::CUDAStream graph_stream() {
    if (!sg.graph)
      sg.graph = std::make_unique<captured_step>(device);
    return sg.graph->stream();
  }

  /// Replays the captured step on `batch` and `taps` (capturing it first,
  /// or again when the shapes changed); the first call runs eagerly instead,
  /// as the warm-up the capture needs.  Returns the step's metrics tensor.
  at::Tensor graphed_step(const std::vector<at::Tensor>& batch, const at::Tensor& taps) {
    if (!sg.warmed) {
      sg.warmed = true;
      return step_body(batch[0], batch[1], batch[2], taps);
    }
    auto same = [](const at::Tensor& a, const at::Tensor& b) {
      return a.defined() && a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type();
    };
    if (!sg.graph->captured() || !same(sg.tokens, batch[0]) || !same(sg.loss_mask, batch[1])
        || !same(sg.doc_lengths, batch[2]) || !same(sg.taps, taps)) {
      sg.graph->reset();
      sg.tokens = batch[0].clone();
      sg.loss_mask = batch[1].clone();
      sg.doc_lengths = batch[2].clone();
      sg.taps = taps.clone();
      capturing = true;
      struct done_capturing {
        bool& flag;
        ~done_capturing() { flag = false; }
      } done{capturing};
      sg.graph->capture([this] { sg.out = step_body(sg.tokens, sg.loss_mask, sg.doc_lengths, sg.taps); },
                       {gen});
    } else {
      sg.tokens.copy_(batch[0], /*non_blocking=*/true);
      sg.loss_mask.copy_(batch[1], true);
      sg.doc_lengths.copy_(batch[2], true);
      sg.taps.copy_(taps, true);
    }
    mark_update_begins();
    // A turn: a target on this GPU runs its forward before or after the step, not beside it.
    if (comm)  // never a replay on a communicator aborted meanwhile (abort_group)
      comm->enqueue([this] { sg.graph->replay(/*take_turn=*/true, "drafter"); },
                    "drafter step " + std::to_string(applied + 1) + " (graph replay)");
    else
      sg.graph->replay(/*take_turn=*/true, "drafter");
    return sg.out;
  }
#endif

  step_result train_step(transport::handle batch_h, transport::handle features_h, bool contribute,
                         double lr_scale) {
    const auto t0 = std::chrono::steady_clock::now();
    detail::device_scope scope(device);
#ifdef TANDEM_HAVE_CUDA
    // Graphed: everything of the step, the payloads' waits included, runs
    // on the graph's side stream.
    std::optional<c10::cuda::CUDAStreamGuard> on_graph_stream;
    if (graphed())
      on_graph_stream.emplace(graph_stream());
#endif
    wait_memory_copy();  // the update below writes what the copy reads
    auto batch = transport::acquire(batch_h, device);
    detail::check_batch_payload(batch, batch_h, who);
    auto features = transport::acquire(features_h, device);
    const auto b = batch[0].size(0), s = batch[0].size(1);
    const auto width = static_cast<int64_t>(cfg.target_layer_ids.size()) * cfg.layer.hidden_size;
    require(features.size() == 1, "features payload " + std::to_string(features_h) + " has "
                                    + std::to_string(features.size()) + " tensors, expected {taps}");
    const auto& taps = features[0];
    require(taps.dim() == 3 && taps.size(0) == b && taps.size(1) == s && taps.size(2) == width
              && at::isFloatingType(taps.scalar_type()),
            "features payload " + std::to_string(features_h) + " has shape "
              + shape_text(taps.sizes()) + ", expected [" + std::to_string(b) + ", "
              + std::to_string(s) + ", " + std::to_string(width) + "] (the batch's rows and length, "
              + std::to_string(cfg.target_layer_ids.size()) + " taps of "
              + std::to_string(cfg.layer.hidden_size) + ")");
    const bool inject_nan = std::exchange(nan_armed, false);
    const auto inject_failure = std::exchange(failure_armed, armed_failure::none);
    const bool inject_throw = inject_failure != armed_failure::none;

    at::Tensor readback;
    try {
      // Set every step (a failed step must not leave it at NaN or 0).
      poison.fill_(inject_nan ? std::numeric_limits<double>::quiet_NaN() : contribute ? 1.0 : 0.0);
      optimizer->set_lr_scale(lr_scale);
      at::Tensor metrics;
#ifdef TANDEM_HAVE_CUDA
      if (graphed() && !inject_throw)
        metrics = graphed_step(batch, taps);
      else
#endif
        // An injected throw runs the step eagerly (also when graphed) so that
        // it fails where a real fault would: after backward, before the update.
        metrics = step_body(batch[0], batch[1], batch[2], taps, inject_failure);
      if (std::exchange(throw_after_update_armed, false))
        throw error(errc::device_failure, who + ": injected fault (throw_after_update)");
#ifdef TANDEM_HAVE_CUDA
      if (device.is_cuda() && (preparing.valid() || pinning.pending())) {
        copy_event queued;
        queued.record(c10::cuda::getCurrentCUDAStream(device.index()).stream());
        pin_some(queued);
      }
      // In a group the step holds a collective: bound it on the host (a
      // rank that never arrives ends in gpu::error(timeout), the
      // communicator aborted) instead of blocking in the read-back forever.
      if (comm)
        comm->wait(c10::cuda::getCurrentCUDAStream(device.index()).stream(), group_timeout,
                   "drafter step " + std::to_string(applied + 1) + (graphed() && sg.graph->captured()
                                                                        ? " (graph replay)" : " (eager)"));
#endif
      // One read-back for every reported value: the only host sync, after the step.
      readback = metrics.to(at::kCPU, at::kDouble);
    } catch (const c10::OutOfMemoryError& e) {
      // The first step of an engine allocates what every later one reuses
      // (activations, the graph's pool): running out there is the shapes',
      // and no restart helps.
      throw error(steps_here < 2 ? errc::bad_input : errc::device_failure,
                  who + ": step " + std::to_string(applied + 1) + " ran out of device memory: "
                    + detail::out_of_memory_text(e) + "; " + detail::out_of_memory_hint);
    } catch (const c10::Error& e) {  // the CPU's allocator: as the device's above
      detail::throw_engine_error(e, who + ": step " + std::to_string(applied + 1),
                                 steps_here < 2 ? errc::bad_input : errc::device_failure);
    }
    ++steps_here;
    const auto m = unpack(readback);
    step_result r;
    r.loss = m.loss;
    r.accuracy = m.accuracy;
    r.sim_accept = m.sim_accept;
    r.grad_norm = m.grad_norm;
    r.lr = m.lr;
    r.scored_tokens = static_cast<int64_t>(m.scored);
    r.finite = m.skipped == 0.0;
    r.step = static_cast<int64_t>(m.step);
    applied = r.step;
    mark_state_holds(/*generator=*/r.finite);  // a skipped update changed nothing
    r.compute_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    r.tflop = expected_drafter_step_flops(dims_of(cfg.layer), opts.layers,
                                          static_cast<int64_t>(cfg.target_layer_ids.size()),
                                          static_cast<double>(b), static_cast<double>(s),
                                          static_cast<double>(opts.anchors),
                                          static_cast<double>(opts.block_size))
              / 1e12;
    return r;
  }

  void join_group(const std::vector<uint8_t>& id, int rank, int world,
                  std::chrono::milliseconds timeout) {
    require(device.is_cuda(), "a data-parallel group needs a CUDA device; this drafter is on the CPU");
    require(!comm, "already " + (comm ? comm->describe() : std::string()) + "; leave_group first");
    require(world >= 1 && rank >= 0 && rank < world,
            "rank " + std::to_string(rank) + " of " + std::to_string(world) + " is not a group position");
    require(timeout.count() > 0, "the group timeout must be positive");
    if (world == 1)
      return;  // alone: nothing to average
#ifdef TANDEM_HAVE_CUDA
    detail::device_scope scope(device);
    nccl::communicator_options co;
    co.timeout = timeout;
    co.name = "drafters";
    auto c = std::make_unique<nccl::communicator>(id, rank, world, static_cast<int>(device.index()), co);
    // The step changes (it gains the all-reduce): drop a captured graph; the
    // next step runs eagerly again, which is also the eager use of the
    // all-reduce NCCL needs before it is captured.
    std::optional<c10::cuda::CUDAStreamGuard> on_graph_stream;
    if (graphed()) {
      on_graph_stream.emplace(graph_stream());
      sg.graph->reset();
      sg.graph->stream().synchronize();
      sg.warmed = false;
    }
    make_bucket();
    guard = at::ones({1}, at::TensorOptions().dtype(at::kFloat).device(device));
    broadcast_state(*c, timeout);
    comm = std::move(c);
    aborted = at::for_blob(const_cast<int32_t*>(comm->abort_flag()), {1})
                .options(at::TensorOptions().dtype(at::kInt).device(device))
                .target_device(device)  // mapped host memory: no device lookup
                .make_tensor();
    group_timeout = timeout;
#else
    (void)id;
    throw error(errc::device_unavailable, who + ": built without CUDA, no data-parallel groups");
#endif
  }

  /// fp32_grads become views of one flat bucket (their values kept).
  void make_bucket() {
    if (flat.master.defined()) {
      if (!flat.reduced.defined())
        flat.reduced = at::zeros_like(flat.master);
      return;
    }
    if (!bucket.empty())
      return;
    if (mixed()) {
      bucket = nccl::flat_bucket(fp32_grads);
    } else {
      bucket = nccl::flat_bucket::of_param_grads(params);
      fp32_grads = bucket.views();
    }
  }

  /// Every rank takes rank 0's master weights, optimizer moments and update
  /// count (one broadcast of one flat fp32 buffer, waited), so the replicas
  /// start identical whatever seed each was built with.
  void broadcast_state(nccl::communicator& c, std::chrono::milliseconds timeout) {
    wait_memory_copy();
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> parts;
    for (const auto& m : masters)
      parts.push_back(m.detach().reshape({-1}));
    for (const auto& m : optimizer->exp_avg())
      parts.push_back(m.reshape({-1}));
    for (const auto& v : optimizer->exp_avg_sq())
      parts.push_back(v.reshape({-1}));
    parts.push_back(optimizer->step_count().reshape({-1}));
    auto flat = at::cat(parts).contiguous();
    nccl::collective_options o;
    o.timeout = timeout;
    o.wait = true;
    mark_update_begins();
    nccl::broadcast(c, flat, 0, o);
    int64_t off = 0;
    auto take = [&](const at::Tensor& like) {
      auto v = flat.narrow(0, off, like.numel()).view(like.sizes());
      off += like.numel();
      return v;
    };
    for (auto& m : masters)
      m.copy_(take(m));
    std::vector<at::Tensor> ea, eas;
    for (const auto& m : optimizer->exp_avg())
      ea.push_back(take(m));
    for (const auto& v : optimizer->exp_avg_sq())
      eas.push_back(take(v));
    const auto step = static_cast<int64_t>(std::llround(take(optimizer->step_count()).item<double>()));
    optimizer->load_state(ea, eas, step);
    refresh_model();
    applied = step;
    state_landed();
  }

  /// DESIGN.md §4 order: wait for the stream, free the graph that captured
  /// the collective, then close the communicator (all ranks together).
  bool leave_group(std::chrono::milliseconds timeout) {
    if (!comm)
      return true;
#ifdef TANDEM_HAVE_CUDA
    detail::device_scope scope(device);
    if (sg.graph) {
      sg.graph->stream().synchronize();
      sg.graph->reset();
      sg.warmed = false;
    }
#endif
    const bool clean = comm->close(timeout.count() > 0 ? timeout : std::chrono::milliseconds(1));
    aborted = at::Tensor();  // a view of the communicator's memory
    comm.reset();
    return clean;
  }

  /// The update count the weights hold, read from the device once its work
  /// has drained (after a step whose collective failed: the update was
  /// skipped, or applied when the collective had completed); the engine
  /// counts from it.
  int64_t sync_step() {
    detail::device_scope scope(device);
#ifdef TANDEM_HAVE_CUDA
    if (sg.graph)
      sg.graph->stream().synchronize();
    if (device.is_cuda())
      c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
#endif
    applied = static_cast<int64_t>(std::llround(optimizer->step_count().item<double>()));
    return applied;
  }

  /// The current stream waits for the restore point's copy in flight, if any.
  void wait_memory_copy() {
#ifdef TANDEM_HAVE_CUDA
    if (device.is_cuda()) {
      cudaStream_t current = c10::cuda::getCurrentCUDAStream(device.index()).stream();
      if (memory && memory->copied)
        memory->copied->block(current);
      if (snapshot_copied && !snapshot_reads_memory)  // a snapshot's copy reads what the update writes
        snapshot_copied->block(current);
      if (staged)  // so does the copy into the staging buffers
        staged->block(current);
    }
#endif
  }

  /// A drafter the run snapshots takes its staging buffers with its
  /// in-place restore point, before its step is captured, rather than at
  /// the first snapshot in the middle of the run (outside memory_mutex).
  void reserve_staging() {
#ifdef TANDEM_HAVE_CUDA
    if (opts.prepare_snapshot_buffers && device.is_cuda() && memory_in_place())
      (void)have_staging();
#endif
  }

#ifdef TANDEM_HAVE_CUDA
  /// The staging buffers of an in-place restore point's snapshots, made
  /// when first needed; false when the device has no room for them (the
  /// snapshot then copies from the state, and the next update waits for it).
  bool have_staging() {
    if (!staged_w.empty())
      return true;
    try {
      for (auto* list : {&staged_w, &staged_m, &staged_v})
        for (const auto& m : masters)
          list->push_back(at::empty_like(m));
    } catch (const c10::OutOfMemoryError&) {
      staged_w.clear(), staged_m.clear(), staged_v.clear();
      return false;
    }
    return true;
  }
#endif

  /// A set of host buffers nobody else holds, allocated when none is
  /// (page-locked on CUDA).  At most two are kept.
  host_set& free_host_set() {
    for (auto& h : host_sets)
      if (h.free())
        return h;
    // A third set (both kept ones still being written) is a one-off:
    // begin_snapshot drops sets beyond two once they are free.
    auto ready = take_prepared(/*wait=*/true);  // made meanwhile (waits for the rest if it is not done)
    host_sets.push_back(make_host_set(masters, host_set_layout(), device.is_cuda(), std::move(ready)));
    prepare_host_set();  // the second set's memory, while the first is in use
    return host_sets.back();
  }

  const host_layout& host_set_layout() {
    if (!layout)
      layout = layout_of(masters);
    return *layout;
  }

  /// The prepared memory of the next host set (prepare_host_set), with the
  /// pieces pin_some locked; a null block when there is none, or when it is
  /// still being made and `wait` is false.
  pinning_block take_prepared(bool wait) {
    if (pinning.block.p)
      return std::exchange(pinning, pinning_block{});
    if (!preparing.valid() || (!wait && preparing.wait_for(std::chrono::seconds(0)) != std::future_status::ready))
      return {};
    pinning_block p;
    p.pieces = host_set_layout().pieces;  // first: nothing to leak if it throws
    p.block = preparing.get();
    return p;
  }

#ifdef TANDEM_HAVE_CUDA
  /// While the step just queued runs (`queued` recorded after it): locks
  /// pieces of the next host set's prepared memory until the device has
  /// done that work, so the snapshot that takes the set finds it
  /// page-locked (locking 12.6 GB there held training ≈ 0.26 s at 8B).
  /// Overruns the step by one piece at most (host_layout: ≈ 1.3–7 ms at
  /// 8B), which matters only where nothing else is queued on the device.
  void pin_some(copy_event& queued) {
    if (!pinning.block.p)
      pinning = take_prepared(/*wait=*/false);
    if (!pinning.block.p)
      return;
    while (!queued.query() && pinning.lock_next()) {
    }
  }
#endif

  /// With opts.prepare_snapshot_buffers and fewer than two sets held: a
  /// helper thread maps and touches the next set's memory (no CUDA there);
  /// on CUDA this thread then page-locks it piece by piece while steps run
  /// (pin_some), and the snapshot that needs it locks what is left (on the
  /// CPU: takes it as it is).  TANDEM_SNAPSHOT_PREPARE=0 turns it off
  /// (docs/environment.md).
  void prepare_host_set() {
    if (!opts.prepare_snapshot_buffers || preparing.valid() || pinning.block.p || host_sets.size() >= 2)
      return;
    static const bool off = env_choice("TANDEM_SNAPSHOT_PREPARE", {"1", "0"}) == "0";
    if (off)
      return;
    try {
      preparing = std::async(std::launch::async, [bytes = host_set_layout().bytes, cancel = cancel_prepare] {
        return map_and_touch(bytes, *cancel);
      });
    } catch (const std::system_error&) {
      // no thread to be had: the set is allocated when needed instead
    }
  }

  /// Takes the host sets an earlier incarnation of this drafter left (of
  /// this drafter's shapes) and makes this the slot's newest incarnation.
  void claim_host_sets() {
    std::lock_guard<std::mutex> lock(host_pool_mutex);
    auto& slot = host_pool[opts.memory_slot];
    slot.newest = std::max(slot.newest, incarnation);
    for (auto& h : slot.sets)
      if (h.fits(masters, device.is_cuda()) && h.free())
        host_sets.push_back(std::move(h));
    slot.sets.clear();
  }

  /// Leaves this engine's free host sets to the slot's next incarnation,
  /// unless a newer one already runs.
  void leave_host_sets() {
    std::lock_guard<std::mutex> lock(host_pool_mutex);
    auto& slot = host_pool[opts.memory_slot];
    if (slot.newest != incarnation)
      return;
    for (auto& h : host_sets)
      if (h.free() && slot.sets.size() < 2)
        slot.sets.push_back(std::move(h));
  }

  /// Copies the masters and both moments into `w`, `m`, `v` (tensors of
  /// the masters' shapes) on the current stream, asynchronously where the
  /// devices allow.
  void copy_state_to(std::vector<at::Tensor>& w, std::vector<at::Tensor>& m, std::vector<at::Tensor>& v) const {
    copy_state(masters, optimizer->exp_avg(), optimizer->exp_avg_sq(), w, m, v);
  }

  /// Copies masters and moments `fw`, `fm`, `fv` into `w`, `m`, `v` (same
  /// shapes) on the current stream, asynchronously where the devices allow.
  static void copy_state(const std::vector<at::Tensor>& fw, const std::vector<at::Tensor>& fm,
                         const std::vector<at::Tensor>& fv, std::vector<at::Tensor>& w, std::vector<at::Tensor>& m,
                         std::vector<at::Tensor>& v) {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < fw.size(); ++i) {
      w[i].copy_(fw[i], /*non_blocking=*/true);
      m[i].copy_(fm[i], true);
      v[i].copy_(fv[i], true);
    }
  }

  void begin_snapshot() {
    require(!pending_snapshot, "a snapshot is already being taken");
    if (slow_snapshot_s > 0) {  // the injected fault copies on this thread (snapshot())
      pending_handle = snapshot();
      pending_snapshot.emplace();
      return;
    }
    detail::device_scope scope(device);
    at::NoGradGuard no_grad;
    auto& h = free_host_set();
    snapshot_parts parts;
    parts.state = state_json().dump();
    snapshot_reads_memory = false;
    auto copy_all = [&] {
      copy_state_to(h.weights, h.exp_avg, h.exp_avg_sq);
      h.step.copy_(optimizer->step_count(), true);
    };
#ifdef TANDEM_HAVE_CUDA
    if (device.is_cuda()) {
      auto side = c10::cuda::getStreamFromPool(false, device.index());
      auto after_the_step = [&] {  // the side stream waits for the last step (the graph's stream when graphed)
        copy_event stepped, graphed_step;
        stepped.record(c10::cuda::getCurrentCUDAStream(device.index()).stream());
        stepped.block(side.stream());
        if (sg.graph) {
          graphed_step.record(sg.graph->stream().stream());
          graphed_step.block(side.stream());
        }
      };
      if (memory && memory_held == applied && memory->copied) {
        // The restore point in device memory holds this step: copy from it,
        // after its own copy, and let training go on meanwhile.
        memory->copied->block(side.stream());
        snapshot_reads_memory = true;
        c10::cuda::CUDAStreamGuard on_side(side);
        copy_state(memory->masters, memory->exp_avg, memory->exp_avg_sq, h.weights, h.exp_avg, h.exp_avg_sq);
        h.step.fill_(static_cast<double>(applied));
      } else if (memory_in_place() && have_staging()) {
        // The restore point is the state itself: copy it on the device
        // first (the next step waits for that copy — 25 GB of traffic at 8B,
        // ≈ 9 ms on an H100 by its bandwidth, not measured apart — and not
        // for the host's: wait_memory_copy), then to the host from there
        // while training goes on.
        after_the_step();
        snapshot_reads_memory = true;
        c10::cuda::CUDAStreamGuard on_side(side);
        copy_state_to(staged_w, staged_m, staged_v);
        staged.emplace();
        staged->record(side.stream());
        copy_state(staged_w, staged_m, staged_v, h.weights, h.exp_avg, h.exp_avg_sq);
        h.step.fill_(static_cast<double>(applied));
      } else {
        after_the_step();
        c10::cuda::CUDAStreamGuard on_side(side);
        copy_all();
      }
      snapshot_copied.emplace();
      snapshot_copied->record(side.stream());
    } else
#endif
      copy_all();
    parts.weights = h.weights;
    parts.exp_avg = h.exp_avg;
    parts.exp_avg_sq = h.exp_avg_sq;
    parts.step = h.step;
    pending_snapshot = std::move(parts);
    // Sets beyond the two kept go once free.
    while (host_sets.size() > 2 && host_sets.front().free())
      host_sets.erase(host_sets.begin());
  }

  std::optional<transport::handle> poll_snapshot() {
    require(pending_snapshot.has_value(), "no snapshot was begun");
    if (pending_handle) {  // taken synchronously
      auto h = *pending_handle;
      pending_handle.reset();
      pending_snapshot.reset();
      return h;
    }
#ifdef TANDEM_HAVE_CUDA
    if (snapshot_copied) {
      bool done = false;
      try {
        done = snapshot_copied->query();
      } catch (const std::exception& e) {
        pending_snapshot.reset();
        throw error(errc::device_failure, who + ": snapshot copy failed: " + e.what());
      }
      if (!done)
        return std::nullopt;
    }
#endif
    auto h = publish_snapshot(*pending_snapshot);
    pending_snapshot.reset();
    return h;
  }

  bool memory_fits(const memory_restore_point& p) const {
    if (p.device != device || p.masters.size() != masters.size())
      return false;
    for (size_t i = 0; i < masters.size(); ++i)
      if (p.masters[i].sizes() != masters[i].sizes())
        return false;
    return true;
  }

  /// memory_every 1: the restore point is this engine's own state, in place.
  bool memory_in_place() const { return opts.memory_every == 1; }

  /// A new in-place restore point: views of this engine's state.
  std::shared_ptr<memory_restore_point> in_place_point() const {
    auto p = std::make_shared<memory_restore_point>();
    p->device = device;
    p->in_place = true;
    p->masters = masters;
    p->exp_avg = optimizer->exp_avg();
    p->exp_avg_sq = optimizer->exp_avg_sq();
    p->owner = incarnation;
    return p;
  }

  /// The in-place restore point this engine still owns, or null (caller
  /// holds memory_mutex).  A newer incarnation that restored from it took it.
  memory_restore_point* own_in_place() const {
    return memory && memory->in_place && memory->owner == incarnation ? memory.get() : nullptr;
  }

  /// Before an update is queued (the graph replay, or the eager update):
  /// the in-place restore point no longer holds a known step.
  void mark_update_begins() {
    if (!memory || !memory->in_place)
      return;
    std::lock_guard<std::mutex> lock(memory_mutex);
    if (auto* p = own_in_place())
      p->held = -1;
  }

  /// The state holds `applied` updates again (a step read back; a restore):
  /// the in-place restore point says so.  `generator`: the generator's
  /// state goes with it (false after a skipped update: the point keeps the
  /// last step's, which a restore to that step must draw from).
  void mark_state_holds(bool generator) {
    if (!memory || !memory->in_place)
      return;
    std::lock_guard<std::mutex> lock(memory_mutex);
    if (auto* p = own_in_place()) {
      p->held = applied;
      if (generator) {
        auto g = gen;
        p->generator = detail::generator_state_hex(g);
      }
    }
  }

  /// After a write of the whole state outside a step (a restore, a
  /// broadcast): once the device has done it, the in-place restore point
  /// holds `applied` again.
  void state_landed() {
    if (!memory || !memory->in_place)
      return;
#ifdef TANDEM_HAVE_CUDA
    if (device.is_cuda())
      c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
#endif
    mark_state_holds(true);
  }

  int64_t keep_restore_point() {
    if (opts.memory_every <= 0)
      return -1;
    if (memory_in_place()) {
      // No copy: the point is this engine's state, marked around every
      // update (mark_update_begins, mark_state_holds).  Made at the first
      // step; a newer incarnation's is never taken back.
      {
        std::lock_guard<std::mutex> lock(memory_mutex);
        auto& slot = memory_table[opts.memory_slot];
        if (slot && slot->owner > incarnation)
          return -1;
        if (!slot || slot != memory || !slot->in_place) {
          slot.reset();  // a copy's buffers go first
          memory = in_place_point();
          memory->held = applied;
          auto g = gen;
          memory->generator = detail::generator_state_hex(g);
          slot = memory;
        }
        memory_held = memory->held;
      }
      reserve_staging();
      return memory_held;
    }
    if (applied % opts.memory_every != 0)
      return memory_held;
#ifdef TANDEM_HAVE_CUDA
    if (snapshot_reads_memory && snapshot_copied && !snapshot_copied->query())
      return memory_held;  // a snapshot still reads it: kept at its step until that copy lands
#endif
    detail::device_scope scope(device);
    // Held until the copy is issued (on the CPU: done): restore_memory takes
    // the slot for a newer incarnation under the same lock, so an older one
    // (hung, waking up, or still draining its mailbox) either finishes its
    // copy first — the marker then names its step, which the restore
    // refuses — or sees the new owner and writes nothing.
    std::lock_guard<std::mutex> lock(memory_mutex);
    {
      auto& slot = memory_table[opts.memory_slot];
      if (slot && slot->owner > incarnation)
        return -1;  // a newer incarnation of this drafter owns it
      if (!slot || !memory_fits(*slot) || slot->in_place) {
        slot.reset();  // freed first: never two copies' worth at once (an in-place one is a drafter's state)
        auto p = std::make_shared<memory_restore_point>();
        p->device = device;
        for (const auto& m : masters)
          p->masters.push_back(at::empty_like(m));
        for (const auto& m : masters) {
          p->exp_avg.push_back(at::empty_like(m));
          p->exp_avg_sq.push_back(at::empty_like(m));
        }
        p->marker = at::full({}, int64_t{-1}, at::TensorOptions().dtype(at::kLong).device(device));
        slot = p;
      }
      slot->owner = incarnation;
      memory = slot;
    }
    auto g = gen;
    memory->generator = detail::generator_state_hex(g);
    at::NoGradGuard no_grad;
    auto copy_all = [&] {
      memory->marker.fill_(int64_t{-1});
      copy_state_to(memory->masters, memory->exp_avg, memory->exp_avg_sq);
      memory->marker.fill_(applied);
    };
#ifdef TANDEM_HAVE_CUDA
    if (device.is_cuda()) {
      // The step's work is done (its metrics were read back), so the copy
      // needs no wait; the next writer waits for it (wait_memory_copy).
      auto side = c10::cuda::getStreamFromPool(false, device.index());
      copy_event stepped;
      stepped.record(c10::cuda::getCurrentCUDAStream(device.index()).stream());
      stepped.block(side.stream());
      {
        c10::cuda::CUDAStreamGuard on_side(side);
        copy_all();
      }
      memory->copied.emplace();
      memory->copied->record(side.stream());
      memory_held = applied;
      return memory_held;
    }
#endif
    copy_all();
    memory_held = applied;
    return memory_held;
  }

  void restore_memory(int64_t step) {
    detail::device_scope scope(device);
    wait_memory_copy();  // a snapshot of this engine may still read what the restore writes
    restore_memory_locked(step);
    reserve_staging();
  }

  void restore_memory_locked(int64_t step) {
    std::shared_ptr<memory_restore_point> p;
    // Held from taking the slot to the end of the copy out of it (see keep_restore_point).
    std::lock_guard<std::mutex> lock(memory_mutex);
    {
      auto it = memory_table.find(opts.memory_slot);
      if (it != memory_table.end())
        p = it->second;
    }
    auto refuse = [&](const std::string& why) {
      throw error(errc::device_failure, who + ": the restore point in device memory (drafter "
                                          + std::to_string(opts.memory_slot) + ") " + why);
    };
    if (!p)
      refuse("does not exist");
    if (!memory_fits(*p))
      refuse("is of another device or shape");
    if (p->owner > incarnation)
      refuse("belongs to a newer incarnation of this drafter");
    auto refuse_held = [&](int64_t held) {
      refuse(held >= 0 ? "holds update " + std::to_string(held) + ", not " + std::to_string(step)
             : p->in_place ? "was being updated when its drafter failed"
                           : "was cut short while being written");
    };
    int64_t held = p->held;
    if (p->in_place) {
      // Checked before it is taken: refused, it stays its engine's, whose
      // marker keeps telling the truth.  Taken, that engine (hung, waking
      // up) no longer marks it.
      if (held != step)
        refuse_held(held);
      p->owner = incarnation;
    } else {
      // Taken now: an older incarnation (hung, waking up) no longer writes it.
      p->owner = incarnation;
      try {
#ifdef TANDEM_HAVE_CUDA
        if (p->copied)
          p->copied->synchronize();
#endif
        held = p->marker.item<int64_t>();
      } catch (const c10::Error& e) {
        refuse(std::string("cannot be read: ") + e.what_without_backtrace());
      } catch (const error& e) {
        refuse(std::string("cannot be read: ") + e.what());
      }
      if (held != step)
        refuse_held(held);
    }
    auto next_gen = gen.clone();
    detail::set_generator_state(next_gen, p->generator, "the restore point's generator state");
    apply_state(p->masters, p->exp_avg, p->exp_avg_sq, step, next_gen);
#ifdef TANDEM_HAVE_CUDA
    // Out of another engine's state: the copy lands before the lock is
    // released, so that engine (hung, waking up) may write its own state
    // again and its memory may go.
    if (p->in_place && device.is_cuda())
      c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
#endif
    if (memory_in_place()) {
      // From now on the point is this engine's own state.
      auto own = in_place_point();
      own->held = step;
      own->generator = p->generator;
      memory_table[opts.memory_slot] = own;
      memory = std::move(own);
    } else if (p->in_place) {
      memory_table.erase(opts.memory_slot);  // the next keep_restore_point copies into buffers of its own
      memory.reset();
    } else {
      memory = p;
    }
    memory_held = step;
  }

  json state_json() const {
    json j;
    j["format"] = checkpoint_format;
    j["version"] = checkpoint_version;
    j["step"] = applied;
    auto g = gen;
    j["generator"] = {{"device", device.is_cuda() ? "cuda" : "cpu"},
                      {"state", detail::generator_state_hex(g)}};
    j["parameters"] = names;
    j["drafter"] = shape_json(cfg);
    j["options"] = options_json(opts);
    return j;
  }

  transport::handle snapshot() const {
    detail::device_scope scope(device);
#ifdef TANDEM_HAVE_CUDA
    if (sg.graph)
      sg.graph->stream().synchronize();
#endif
    at::NoGradGuard no_grad;
    auto cpu = [](const at::Tensor& t) {
      return t.detach().to(at::TensorOptions().device(at::kCPU).dtype(at::kFloat),
                           /*non_blocking=*/false, /*copy=*/true);
    };
    snapshot_parts parts;
    parts.state = state_json().dump();
    for (const auto& p : masters)
      parts.weights.push_back(cpu(p));
    for (const auto& m : optimizer->exp_avg())
      parts.exp_avg.push_back(cpu(m));
    for (const auto& v : optimizer->exp_avg_sq())
      parts.exp_avg_sq.push_back(cpu(v));
    parts.step = cpu(optimizer->step_count());
    if (slow_snapshot_s > 0) {  // an injected slow_snapshot: copy again until the time is up
      const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(slow_snapshot_s);
      slow_snapshot_s = 0;
      while (std::chrono::steady_clock::now() < until)
        for (size_t i = 0; i < masters.size(); ++i)
          parts.weights[i] = cpu(masters[i]);
    }
    return publish_snapshot(parts);
  }

  /// Checks that checkpoint `ck` (read from `dir`) holds a drafter of this
  /// engine's shape: the drafter fields, the parameter names, each shape.
  void check_fits(const checkpoint_contents& ck, const std::filesystem::path& dir) const {
    const auto state_file = (dir / "state.json").string();
    auto field = [&](const std::string& f) { return state_file + ": field '" + f + "'"; };
    const auto want = shape_json(cfg);
    const auto& have = ck.state.at("drafter");
    for (auto it = want.begin(); it != want.end(); ++it)
      if (!have.contains(it.key()) || have.at(it.key()) != it.value())
        throw error(errc::bad_input, field("drafter." + it.key()) + " is "
                                       + (have.contains(it.key()) ? have.at(it.key()).dump() : "missing")
                                       + ", this drafter has " + it.value().dump());
    require(ck.names == names, field("parameters") + " lists other parameters than this drafter's");
    for (size_t i = 0; i < names.size(); ++i)
      if (ck.weights[i].sizes() != masters[i].sizes())
        throw error(errc::bad_input, (dir / "weights.safetensors").string() + ": tensor '" + names[i]
                                       + "' has shape " + shape_text(ck.weights[i].sizes())
                                       + ", this drafter's is " + shape_text(masters[i].sizes()));
  }

  void restore(const std::filesystem::path& dir) {
    detail::device_scope scope(device);
    wait_memory_copy();
    auto ck = read_checkpoint(dir);  // checks files, names, shapes, dtypes
    const auto state_file = (dir / "state.json").string();
    auto field = [&](const std::string& f) { return state_file + ": field '" + f + "'"; };
    check_fits(ck, dir);  // the drafter's shape must be the one this engine was built with
    // Generator: validated on a clone, so a bad state leaves the engine as it was.
    auto next_gen = gen.clone();
    const auto& g = ck.state.at("generator");
    const std::string kind = device.is_cuda() ? "cuda" : "cpu";
    if (g.at("device").get<std::string>() == kind)
      detail::set_generator_state(next_gen, g.at("state").get<std::string>(), field("generator.state"));
    else  // another device kind: draws cannot continue bit-exactly; reseed deterministically
      next_gen = detail::private_generator(device, detail::mix_seed(opts.seed, 2 + static_cast<uint64_t>(ck.step)));
    // All checked: apply.
    for (auto& m : ck.exp_avg)
      m = m.to(device);
    for (auto& v : ck.exp_avg_sq)
      v = v.to(device);
    mark_update_begins();
    apply_state(ck.weights, ck.exp_avg, ck.exp_avg_sq, ck.step, next_gen);
    state_landed();
  }

  /// Takes a checked state (a checkpoint's, a restore point's): masters
  /// copied in, the moments and update count, the model copy, the generator;
  /// a captured graph is dropped (it registered the generator replaced here).
  void apply_state(const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& exp_avg,
                   const std::vector<at::Tensor>& exp_avg_sq, int64_t step, const at::Generator& next_gen) {
    {
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < masters.size(); ++i)
        masters[i].copy_(weights[i]);
    }
    optimizer->load_state(exp_avg, exp_avg_sq, step);
    refresh_model();
    gen = next_gen;
#ifdef TANDEM_HAVE_CUDA
    if (sg.graph)
      sg.graph->reset();
#endif
    applied = step;
  }

  /// drafter_engine::warm_start: weights only, from a checkpoint or a z-lab export.
  void warm_start(const std::filesystem::path& dir) {
    detail::device_scope scope(device);
    std::vector<at::Tensor> from(names.size());
    if (std::filesystem::exists(dir / "weights.safetensors")) {
      auto ck = read_checkpoint(dir);
      check_fits(ck, dir);
      from = ck.weights;
    } else if (std::filesystem::exists(dir / "config.json") && std::filesystem::exists(dir / "model.safetensors")) {
      auto [have, w] = load_dflash(dir, at::Device(at::kCPU), at::kFloat);
      const auto file = (dir / "config.json").string();
      auto same = [&](const char* field, int64_t a, int64_t b) {
        if (a != b)
          throw error(errc::bad_input, file + ": field '" + field + "' is " + std::to_string(a)
                                         + ", this drafter has " + std::to_string(b));
      };
      same("hidden_size", have.layer.hidden_size, cfg.layer.hidden_size);
      same("num_hidden_layers", have.layer.num_hidden_layers, cfg.layer.num_hidden_layers);
      same("intermediate_size", have.layer.intermediate_size, cfg.layer.intermediate_size);
      same("num_attention_heads", have.layer.num_attention_heads, cfg.layer.num_attention_heads);
      same("num_key_value_heads", have.layer.num_key_value_heads, cfg.layer.num_key_value_heads);
      same("head_dim", have.layer.head_dim, cfg.layer.head_dim);
      same("block_size", have.block_size, cfg.block_size);
      same("num_target_layers", have.num_target_layers, cfg.num_target_layers);
      require(have.target_layer_ids == cfg.target_layer_ids,
              file + ": field 'dflash_config.target_layer_ids' differs from this drafter's taps");
      auto sd = dflash_state_dict(w);
      for (size_t i = 0; i < names.size(); ++i) {
        auto it = sd.find(names[i]);
        require(it != sd.end(), (dir / "model.safetensors").string() + ": no tensor '" + names[i] + "'");
        from[i] = it->second;
      }
    } else {
      throw error(errc::bad_input, dir.string() + ": drafter.init_from is neither a Tandem checkpoint "
                                   "(weights.safetensors) nor a z-lab DFlash export (config.json + model.safetensors)");
    }
    for (size_t i = 0; i < names.size(); ++i)
      if (from[i].sizes() != masters[i].sizes())
        throw error(errc::bad_input, dir.string() + ": tensor '" + names[i] + "' has shape "
                                       + shape_text(from[i].sizes()) + ", this drafter's is "
                                       + shape_text(masters[i].sizes()));
    {
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < masters.size(); ++i)
        masters[i].copy_(from[i]);
    }
    refresh_model();
  }
};

drafter_engine::drafter_engine(const drafter_engine_options& opts) {
  (void)device_turns_enabled();  // a bad TANDEM_SHARED_GPU fails here, not at the first step
  try {
    impl_ = std::make_unique<impl>(opts);
  } catch (const c10::OutOfMemoryError& e) {
    throw error(errc::bad_input, "drafter engine: out of device memory while building the drafter: "
                                   + detail::out_of_memory_text(e) + "; " + detail::out_of_memory_hint);
  } catch (const c10::Error& e) {
    detail::throw_engine_error(e, "drafter engine: building the drafter");
  }
}
drafter_engine::~drafter_engine() = default;
drafter_engine::drafter_engine(drafter_engine&&) noexcept = default;
drafter_engine& drafter_engine::operator=(drafter_engine&&) noexcept = default;

int64_t drafter_engine::parameter_count(const drafter_engine_options& opts) {
  const auto tc = load_qwen3_config(opts.target_dir);
  const auto d = tc.hidden_size, i = tc.intermediate_size, h = tc.head_dim;
  const auto q = tc.num_attention_heads * h, kv = tc.num_key_value_heads * h;
  const auto taps = static_cast<int64_t>(
    (opts.tap_ids.empty() ? training_tap_ids(tc.num_hidden_layers) : opts.tap_ids).size());
  // dflash_weights: fc [D, n·D], hidden_norm [D], norm [D]; per layer the 11
  // tensors of decoder_layer_weights (gpu/models/common.hpp).
  const auto layer = 2 * d + q * d + 2 * kv * d + d * q + 2 * h + 3 * i * d;
  return d * taps * d + 2 * d + opts.layers * layer;
}

int64_t drafter_engine::keep_restore_point() {
  return impl_->keep_restore_point();
}

void drafter_engine::restore_memory(int64_t step) {
  impl_->restore_memory(step);
}

void drafter_engine::drop_restore_points() {
  {
    std::lock_guard<std::mutex> lock(memory_mutex);
    memory_table.clear();
  }
  std::lock_guard<std::mutex> lock(host_pool_mutex);
  host_pool.clear();
}

const drafter_info& drafter_engine::info() const {
  return impl_->info;
}

drafter_engine::memory_figures drafter_engine::device_memory() const {
  memory_figures m;
#ifdef TANDEM_HAVE_CUDA
  if (impl_->device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(impl_->device.index());
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    m.allocated = stats.allocated_bytes[all].current;
    m.reserved = stats.reserved_bytes[all].current;
    m.peak = stats.allocated_bytes[all].peak;
  }
#endif
  return m;
}

std::pair<int32_t, int64_t> drafter_engine::graph_pools() const {
#ifdef TANDEM_HAVE_CUDA
  if (impl_->sg.graph && impl_->sg.graph->captured())
    return {1, impl_->sg.graph->pool_bytes()};
#endif
  return {0, 0};
}

int64_t drafter_engine::step() const {
  return impl_->applied;
}

int64_t drafter_engine::sync_step() {
  return impl_->sync_step();
}

step_result drafter_engine::train_step(transport::handle batch, transport::handle features,
                                       bool contribute, double lr_scale) {
  require_positive_scale(lr_scale);
  return impl_->train_step(batch, features, contribute, lr_scale);
}

bool drafter_engine::group_broken() const {
  return impl_->comm && !impl_->comm->usable();
}

void drafter_engine::join_group(const std::vector<uint8_t>& nccl_unique_id, int rank, int world,
                                std::chrono::milliseconds timeout) {
  impl_->join_group(nccl_unique_id, rank, world, timeout);
}

bool drafter_engine::leave_group(std::chrono::milliseconds timeout) {
  return impl_->leave_group(timeout);
}

int drafter_engine::group_world() const {
  return impl_->comm ? impl_->comm->world() : 1;
}

void drafter_engine::inject(fault f) {
  switch (f) {
    case fault::nan_loss: impl_->nan_armed = true; break;
    case fault::throw_in_step: impl_->failure_armed = impl::armed_failure::throw_in_step; break;
    case fault::cuda_error: impl_->failure_armed = impl::armed_failure::cuda_error; break;
    case fault::cuda_sticky: impl_->failure_armed = impl::armed_failure::cuda_sticky; break;
    case fault::throw_after_update: impl_->throw_after_update_armed = true; break;
  }
}

void drafter_engine::slow_next_snapshot(double seconds) {
  impl_->slow_snapshot_s = seconds;
}

transport::handle drafter_engine::snapshot() const {
  return impl_->snapshot();
}

void drafter_engine::begin_snapshot() {
  impl_->begin_snapshot();
}

std::optional<transport::handle> drafter_engine::poll_snapshot() {
  return impl_->poll_snapshot();
}

void drafter_engine::restore(const std::filesystem::path& dir) {
  impl_->restore(dir);
}

void drafter_engine::warm_start(const std::filesystem::path& dir) {
  impl_->warm_start(dir);
}

void drafter_engine::export_zlab(const std::filesystem::path& dir, const std::string& dtype) const {
  at::ScalarType dt;
  if (dtype == "bfloat16")
    dt = at::kBFloat16;
  else if (dtype == "float16")
    dt = at::kHalf;
  else if (dtype == "float32")
    dt = at::kFloat;
  else
    throw error(errc::bad_input, who + ": export dtype '" + dtype
                                   + "' is not one of bfloat16, float16, float32");
  detail::device_scope scope(impl_->device);
  export_dflash(dir, impl_->cfg, impl_->master, dt);
}

} // namespace tandem::gpu
