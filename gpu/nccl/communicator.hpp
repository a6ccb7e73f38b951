#pragma once
/// One rank of an NCCL communicator, owned by one GPU actor on its own thread
/// (DESIGN.md §3: the drafters' data-parallel group; §4: NCCL rules).
///
/// Lifecycle, on the owner's thread:
///
///   rank 0 (or the supervisor)            every rank r of W
///   ───────────────────────────           ──────────────────────────────────
///   id = new_unique_id()  ──message──▶    communicator c(id, r, W, device, timeout)
///                                         (warm up: one eager call of every
///                                          collective the graph will capture)
///                                         capture / replay graphs that call
///                                         c.all_reduce_avg(...); c.wait(...)
///                                         free those graphs
///                                         c.close(timeout)   (all ranks together)
///
/// The communicator is created in NCCL's non-blocking mode, so nothing here can
/// hang: initialisation, every collective and shutdown are polled against a
/// deadline, and a deadline that passes (or an asynchronous NCCL error) aborts
/// the communicator with `ncclCommAbort` and throws `gpu::error` with
/// `errc::timeout` (or `errc::device_failure`) naming the rank, the world size,
/// the device and what did not finish.  A failed communicator is unusable; the
/// supervisor forms a new one (a fresh unique id) for the survivors and the
/// replacement.
///
/// Graph capture (at::cuda::CUDAGraph, cudaStreamCaptureModeThreadLocal, under
/// the process capture lock) of `all_reduce*`, `broadcast`, `send`, `recv`:
///  - the constructor must have returned (init is complete) before capture;
///  - run each collective once eagerly, with the same count, type and peers,
///    before capturing it: NCCL connects peers lazily on first use, and a
///    connection set up inside a capture fails or deadlocks.  The usual warm-up
///    iterations of the step on its side stream do exactly this;
///  - every rank of the communicator must capture the same collectives in the
///    same order, and replay the graphs together (a replay is a collective);
///  - `collective_options::wait` must be false inside a capture (it throws);
///    after a replay call `wait(stream, timeout, what)` from outside the
///    capture to bound the step on the host;
///  - replay each rank's graphs from that rank's own thread: NCCL documents
///    that launching graphs of several communicators from one thread can
///    deadlock while captured and eager collectives are mixed (then see
///    NCCL_GRAPH_MIXING_SUPPORT=0).
///
/// Shutdown order (DESIGN.md §4; violating it hangs the process): wait for the
/// streams, destroy every graph that captured a collective of this
/// communicator, then `close()` on all ranks at once (each on its own thread).
/// `close()` finalises and destroys within its deadline and falls back to
/// `ncclCommAbort`.  Since NCCL 2.19 an aborted communicator must be aborted
/// on every rank of the node, so a rank that sees a peer fail aborts too.
///
/// Threading: every method except `abort()` belongs to the owner's thread.
/// `abort()` (and `abort_group`) may also come from another thread (a
/// watchdog, the coordinator); a `wait()` or a collective blocked on the
/// owner's thread then ends with an error, and graph replays go through
/// `enqueue` so that none starts on an aborted communicator.
///
/// Torch-free and CUDA-free header (streams are `cudaStream_t` under their
/// own name).  Built without NCCL, `available()` is false and everything that
/// needs NCCL throws `errc::device_unavailable` ("built without NCCL").

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

struct CUstream_st;  // the struct behind cudaStream_t

namespace tandem::gpu::nccl {

/// A CUDA stream (`cudaStream_t`); nullptr is the legacy default stream.
using cuda_stream = CUstream_st*;

/// An `ncclUniqueId` as bytes: travels in a CAF message as a plain
/// `std::vector<uint8_t>`; every rank of one communicator gets the same bytes.
using unique_id_bytes = std::vector<uint8_t>;
constexpr size_t unique_id_size = 128;  ///< NCCL_UNIQUE_ID_BYTES

/// True when Tandem was built with NCCL (and CUDA).
bool available();

/// The NCCL library's version ("2.28.9"), or "" when built without NCCL.
std::string version();

/// A fresh id for one communicator (ncclGetUniqueId).  Call it once, on one
/// rank or the supervisor, and send the bytes to every rank.  The calling
/// process hosts NCCL's bootstrap root for that id, so it must stay alive
/// until all ranks have initialised.
unique_id_bytes new_unique_id();

/// Aborts every communicator of group `id` in this process (ncclCommAbort on
/// each one's abort thread), from any thread, without waiting for the aborts
/// to finish.  The supervisor's fast path when a rank is known to have
/// failed: a survivor blocked in that group's init, collective or `wait`
/// ends at once with errc::device_failure naming `why`, instead of at its
/// deadline.  Ranks in other processes are not reached: their deadlines
/// still bound them.  Returns how many communicators it aborted (0 for an
/// unknown id, or without NCCL).
size_t abort_group(const unique_id_bytes& id, const std::string& why);

enum class element_type : uint8_t { i8, u8, i32, u32, i64, u64, f16, bf16, f32, f64 };
enum class reduce_op : uint8_t { sum, prod, max, min, avg };

size_t element_size(element_type t);
const char* to_string(element_type t);  ///< "f32"
const char* to_string(reduce_op op);    ///< "sum"

struct communicator_options {
  /// Deadline of initialisation, and the default of every collective,
  /// `wait` and `close`.
  std::chrono::milliseconds timeout{std::chrono::minutes(2)};
  /// How long `abort()` (and the destructor) wait for `ncclCommAbort` to
  /// return.  An abort that takes longer is left to finish on its own thread
  /// (reported on stderr); the process can still exit.
  std::chrono::milliseconds abort_timeout{std::chrono::seconds(15)};
  /// Shown in NCCL's logs and in every error ("drafters"); may be empty.
  std::string name;
};

struct collective_options {
  /// Deadline of this call; 0 means the communicator's `timeout`.  Covers the
  /// enqueue (which may wait for lazy peer connection in non-blocking mode)
  /// and, with `wait`, the completion on the device.
  std::chrono::milliseconds timeout{0};
  /// Also block the host until the collective has completed on the device
  /// (polls an event and NCCL's error state; never a blind synchronise).
  /// Not allowed while the stream is capturing.
  bool wait = false;
};

class communicator {
public:
  /// Joins communicator `id` as `rank` of `world` on CUDA device `device`
  /// (ncclCommInitRankConfig, non-blocking).  Blocks until every rank has
  /// joined or `timeout` passes.  Throws gpu::error: errc::bad_input for bad
  /// arguments, errc::device_unavailable (no NCCL, no such device),
  /// errc::timeout (a rank never joined, or ranks disagree on the world size),
  /// errc::device_failure (NCCL failed).
  communicator(const unique_id_bytes& id, int rank, int world, int device,
               std::chrono::milliseconds timeout);
  communicator(const unique_id_bytes& id, int rank, int world, int device,
               communicator_options options);

  /// Aborts unless closed (bounded by `abort_timeout`).  Destroy graphs that
  /// captured collectives of this communicator first.
  ~communicator();

  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;

  int rank() const;
  int world() const;
  int device() const;
  /// Initialised and neither failed, aborted nor closed.
  bool usable() const;
  /// Why the communicator failed or was aborted; "" while usable.
  std::string failure() const;
  /// "NCCL rank 0 of 2 on cuda:0 (drafters)": the prefix of every error.
  std::string describe() const;

  /// In-place or out-of-place all-reduce of `count` elements on `stream`.
  void all_reduce(const void* send, void* recv, size_t count, element_type type, reduce_op op,
                  cuda_stream stream, const collective_options& options = {});
  /// In place: data ← Σ_ranks data.
  void all_reduce_sum(void* data, size_t count, element_type type, cuda_stream stream,
                      const collective_options& options = {});
  /// In place: data ← (Σ_ranks data) / world (ncclAvg).
  void all_reduce_avg(void* data, size_t count, element_type type, cuda_stream stream,
                      const collective_options& options = {});
  /// In place: every rank's `data` ← `root`'s (restores a restarted replica).
  void broadcast(void* data, size_t count, element_type type, int root, cuda_stream stream,
                 const collective_options& options = {});
  /// Point to point: `peer` must call the matching `recv` (same count, type).
  void send(const void* data, size_t count, element_type type, int peer, cuda_stream stream,
            const collective_options& options = {});
  void recv(void* data, size_t count, element_type type, int peer, cuda_stream stream,
            const collective_options& options = {});

  /// A device-readable int32 (mapped pinned host memory) that turns 1 before
  /// an abort starts (abort(), abort_group, or a failed wait or collective).
  /// A kernel that runs after this communicator's collectives in stream order
  /// and reads 0 there knows they completed: only an abort ends one early,
  /// and what an aborted collective leaves in its buffers is undefined
  /// (measured: a one-element all-reduce cut short by an abort still held the
  /// full sum, from stale peer data).  Never freed (4 bytes a communicator),
  /// so a kernel still queued behind an aborted collective may read it late.
  const int32_t* abort_flag() const;

  /// Runs `launch` (the replay of a graph that captured this communicator's
  /// collectives) with abort() held off: an abort from another thread
  /// (abort_group) comes either before it, and then this throws
  /// errc::device_failure and launches nothing, or after the launch, whose
  /// collectives then end with the abort.  Replay such graphs through here:
  /// a graph of an aborted communicator would touch freed NCCL resources.
  void enqueue(const std::function<void()>& launch, const std::string& what);

  /// Blocks until all work enqueued on `stream` so far has completed (e.g. a
  /// graph replay containing collectives), polling NCCL's error state and the
  /// deadline.  On a timeout or NCCL error the communicator is aborted and
  /// gpu::error thrown, `what` naming the work.  Not inside a capture.
  void wait(cuda_stream stream, std::chrono::milliseconds timeout, const std::string& what);

  /// Orderly shutdown, all ranks together: waits for this communicator's
  /// eagerly enqueued collectives, then ncclCommFinalize (polled) and
  /// ncclCommDestroy, all within `timeout`; past it, or on an error, falls
  /// back to ncclCommAbort.  True when it finalised cleanly; false when it
  /// had to abort (see `failure()`).  Never throws; idempotent.
  bool close(std::chrono::milliseconds timeout);
  /// As above with the communicator's timeout.
  bool close();

  /// The supervisor's path: ncclCommAbort now (outstanding kernels of this
  /// communicator end), from any thread.  True when the abort has finished
  /// within `abort_timeout`.  Idempotent; a closed communicator stays closed.
  bool abort();

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace tandem::gpu::nccl
