#include "gpu/nccl/communicator.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "gpu/device/error.hpp"

#if defined(TANDEM_HAVE_NCCL) && defined(TANDEM_HAVE_CUDA)
#define TANDEM_NCCL_ENABLED 1
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace tandem::gpu::nccl {

namespace {

communicator_options with_timeout(std::chrono::milliseconds timeout) {
  communicator_options o;
  o.timeout = timeout;
  return o;
}

[[noreturn]] void throw_unavailable(const std::string& what) {
  throw error(errc::device_unavailable,
              "nccl: " + what + ": Tandem was built without NCCL (TANDEM_HAVE_NCCL undefined: "
                "no CUDA toolkit or no libnccl found at configure time)");
}

} // namespace

size_t element_size(element_type t) {
  switch (t) {
    case element_type::i8:
    case element_type::u8:
      return 1;
    case element_type::f16:
    case element_type::bf16:
      return 2;
    case element_type::i32:
    case element_type::u32:
    case element_type::f32:
      return 4;
    case element_type::i64:
    case element_type::u64:
    case element_type::f64:
      return 8;
  }
  return 0;
}

const char* to_string(element_type t) {
  switch (t) {
    case element_type::i8: return "i8";
    case element_type::u8: return "u8";
    case element_type::i32: return "i32";
    case element_type::u32: return "u32";
    case element_type::i64: return "i64";
    case element_type::u64: return "u64";
    case element_type::f16: return "f16";
    case element_type::bf16: return "bf16";
    case element_type::f32: return "f32";
    case element_type::f64: return "f64";
  }
  return "?";
}

const char* to_string(reduce_op op) {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::prod: return "prod";
    case reduce_op::max: return "max";
    case reduce_op::min: return "min";
    case reduce_op::avg: return "avg";
  }
  return "?";
}

#ifdef TANDEM_NCCL_ENABLED

// ─── with NCCL ──────────────────────────────────────────────────────────────

namespace {

using steady = std::chrono::steady_clock;

std::string ms_text(std::chrono::milliseconds d) {
  return std::to_string(d.count()) + " ms";
}

ncclDataType_t to_nccl(element_type t) {
  switch (t) {
    case element_type::i8: return ncclInt8;
    case element_type::u8: return ncclUint8;
    case element_type::i32: return ncclInt32;
    case element_type::u32: return ncclUint32;
    case element_type::i64: return ncclInt64;
    case element_type::u64: return ncclUint64;
    case element_type::f16: return ncclFloat16;
    case element_type::bf16: return ncclBfloat16;
    case element_type::f32: return ncclFloat32;
    case element_type::f64: return ncclFloat64;
  }
  throw error(errc::bad_input, "nccl: unknown element type");
}

ncclRedOp_t to_nccl(reduce_op op) {
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::prod: return ncclProd;
    case reduce_op::max: return ncclMax;
    case reduce_op::min: return ncclMin;
    case reduce_op::avg: return ncclAvg;
  }
  throw error(errc::bad_input, "nccl: unknown reduce op");
}

/// Makes `device` current for this scope and restores the caller's device.
class device_scope {
public:
  explicit device_scope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    // A failed switch (a device this process does not have: a communicator
    // refused at construction is still destroyed) must not leave the error
    // pending on this thread: LibTorch's allocator checks cudaGetLastError
    // before every cudaMalloc and would throw it from an unrelated place.
    if (previous_ != device) {
      if (cudaSetDevice(device) == cudaSuccess)
        switched_ = true;
      else
        cudaGetLastError();
    }
  }
  ~device_scope() {
    if (switched_ && previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess)
      cudaGetLastError();
  }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;

private:
  int previous_ = -1;
  bool switched_ = false;  // no CUDA call at all when already on the device (capture-safe)
};

/// Sleeps between polls: short at first (a collective usually finishes in
/// microseconds), then at most 1 ms so the deadline is kept to a millisecond.
class backoff {
public:
  void pause() {
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
    delay_us_ = std::min<int64_t>(delay_us_ * 2, 1000);
  }

private:
  int64_t delay_us_ = 20;
};

std::string cuda_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

/// One ncclCommAbort running on its own thread, so that a caller is never
/// held longer than its bound by an abort that waits for peers.
struct abort_job {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  ncclResult_t result = ncclSuccess;
};

} // namespace

namespace {

/// What abort_group reaches: the communicators of this process, by group.
struct group_member {
  /// False when there was nothing left to abort (closed, or aborted before).
  virtual bool abort_for_group(const std::string& why) = 0;

protected:
  ~group_member() = default;
};

struct group_registry {
  std::mutex mutex;
  std::multimap<unique_id_bytes, group_member*> members;  ///< by unique id
};

group_registry& registry() {
  static group_registry r;
  return r;
}

/// A fresh abort flag (0), in pinned mapped pages that are never freed and
/// whose slots are never reused: a kernel still queued behind an aborted
/// collective may read its communicator's flag after the communicator is
/// gone (a stream is drained only after the abort finishes, which is
/// bounded by abort_timeout, not guaranteed).  4 bytes a communicator.
int32_t* new_abort_flag(const std::string& who) {
  constexpr size_t slots = 1024;
  static std::mutex mutex;
  static int32_t* page = nullptr;
  static size_t used = slots;
  std::lock_guard<std::mutex> lock(mutex);
  if (used == slots) {
    int32_t* p = nullptr;
    const auto e = cudaHostAlloc(reinterpret_cast<void**>(&p), slots * sizeof(int32_t),
                                 cudaHostAllocMapped | cudaHostAllocPortable);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw error(errc::device_failure, who + ": cudaHostAlloc of abort flags: " + cuda_text(e));
    }
    page = p;
    used = 0;
  }
  int32_t* flag = page + used++;
  __atomic_store_n(flag, 0, __ATOMIC_SEQ_CST);
  return flag;
}

} // namespace

struct communicator::impl final : group_member {
  enum class phase { initialising, ready, failed, closed };

  int rank;
  int world;
  int device;
  communicator_options options;

  /// Guards `comm`, `state`, `failure_text` and the abort fields.  NCCL
  /// calls on `comm` are made while holding it, except ncclCommAbort, which
  /// runs on `aborter` after `comm` has been cleared, so no other call can
  /// touch a communicator being freed.
  mutable std::mutex mutex;
  ncclComm_t comm = nullptr;
  phase state = phase::initialising;
  std::string failure_text;
  std::shared_ptr<abort_job> job;
  std::thread aborter;

  /// Completion event of the last eager collective per stream (owner's
  /// thread only): what close() waits for.
  std::vector<std::pair<cudaStream_t, cudaEvent_t>> tails;

  /// The group this rank is registered under (abort_group); empty until init starts.
  unique_id_bytes group;
  /// Mapped pinned host memory (device-visible): 1 once an abort began.
  int32_t* abort_flag = nullptr;

  impl(int r, int w, int d, communicator_options o)
      : rank(r), world(w), device(d), options(std::move(o)) {}

  void join_registry(const unique_id_bytes& id) {
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    group = id;
    reg.members.emplace(id, this);
  }

  void leave_registry() {
    if (group.empty())
      return;
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    auto [first, last] = reg.members.equal_range(group);
    for (auto it = first; it != last; ++it)
      if (it->second == this) {
        reg.members.erase(it);
        break;
      }
    group.clear();
  }

  bool abort_for_group(const std::string& why) override {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (state == phase::closed || job)
        return false;
    }
    start_abort(describe() + ": aborted for its group: " + why);
    return true;
  }

  ~impl() {
    leave_registry();  // abort_group must not reach a communicator being destroyed
    bool live;
    {
      std::lock_guard<std::mutex> lock(mutex);
      live = state == phase::initialising || state == phase::ready;
    }
    if (live)
      start_abort(describe() + ": destroyed without close()");
    if (!wait_abort(options.abort_timeout)) {
      std::lock_guard<std::mutex> lock(mutex);
      if (aborter.joinable()) {
        std::fprintf(stderr,
                     "tandem: %s: ncclCommAbort did not return within %s; leaving it to finish "
                     "on its own thread\n",
                     describe().c_str(), ms_text(options.abort_timeout).c_str());
        aborter.detach();  // the thread owns its job through a shared_ptr
      }
    }
    if (tails.empty())
      return;  // nothing on the device (e.g. refused before init): no device switch
    device_scope scope(device);
    for (auto& [stream, event] : tails)
      cudaEventDestroy(event);
  }

  std::string describe() const {
    auto s = "NCCL rank " + std::to_string(rank) + " of " + std::to_string(world) + " on cuda:"
             + std::to_string(device);
    if (!options.name.empty())
      s += " (" + options.name + ")";
    return s;
  }

  std::string nccl_text(ncclResult_t r) const {
    std::string s = std::string(ncclGetErrorString(r));
    std::lock_guard<std::mutex> lock(mutex);
    const char* last = ncclGetLastError(comm);
    if (last && *last)
      s += ": " + std::string(last);
    return s;
  }

  /// Hands `comm` to an abort thread (once).  Any thread; never blocks on NCCL.
  void start_abort(const std::string& reason) {
    // Before ncclCommAbort can end any kernel early: a kernel that runs after
    // this communicator's collectives and reads 0 knows they completed.
    if (abort_flag)
      __atomic_store_n(abort_flag, 1, __ATOMIC_SEQ_CST);
    std::lock_guard<std::mutex> lock(mutex);
    if (state != phase::closed)
      state = phase::failed;
    if (failure_text.empty())
      failure_text = reason;
    if (job)
      return;
    job = std::make_shared<abort_job>();
    ncclComm_t c = std::exchange(comm, nullptr);
    if (!c) {
      job->done = true;
      return;
    }
    aborter = std::thread([j = job, c, d = device] {
      cudaSetDevice(d);
      const auto r = ncclCommAbort(c);
      {
        std::lock_guard<std::mutex> l(j->mutex);
        j->done = true;
        j->result = r;
      }
      j->cv.notify_all();
    });
  }

  /// Waits up to `bound` for the abort (if any) to finish; joins its thread.
  bool wait_abort(std::chrono::milliseconds bound) {
    std::shared_ptr<abort_job> j;
    {
      std::lock_guard<std::mutex> lock(mutex);
      j = job;
    }
    if (!j)
      return true;
    {
      std::unique_lock<std::mutex> l(j->mutex);
      if (!j->cv.wait_for(l, bound, [&] { return j->done; }))
        return false;
    }
    std::thread t;
    {
      std::lock_guard<std::mutex> lock(mutex);
      t = std::move(aborter);
      if (t.joinable() && j->result != ncclSuccess)
        failure_text += std::string("; ncclCommAbort returned ") + ncclGetErrorString(j->result);
    }
    if (t.joinable())
      t.join();
    return true;
  }

  /// Aborts and throws: the one way out of a failed operation.
  [[noreturn]] void fail(errc code, const std::string& message) {
    start_abort(message);
    throw error(code, message);
  }

  /// Polls ncclCommGetAsyncError until the communicator leaves ncclInProgress
  /// or the deadline passes (returns ncclInProgress then).
  ncclResult_t settle(steady::time_point deadline, const std::string& what) {
    backoff pause;
    for (;;) {
      ncclResult_t state_now = ncclSuccess;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (!comm)
          throw error(errc::device_failure,
                      describe() + ": " + what + ": the communicator was aborted (" + failure_text
                        + ")");
        const auto r = ncclCommGetAsyncError(comm, &state_now);
        if (r != ncclSuccess)
          state_now = r;
      }
      if (state_now != ncclInProgress || steady::now() >= deadline)
        return state_now;
      pause.pause();
    }
  }

  /// Waits for `event` to complete, watching NCCL's error state and the deadline.
  void await(cudaEvent_t event, steady::time_point deadline, std::chrono::milliseconds timeout,
             const std::string& what) {
    backoff pause;
    for (;;) {
      const auto q = cudaEventQuery(event);
      if (q == cudaSuccess)
        return;
      if (q != cudaErrorNotReady) {
        cudaGetLastError();
        fail(errc::device_failure, describe() + ": " + what + ": CUDA error " + cuda_text(q)
                                     + "; the communicator was aborted");
      }
      ncclResult_t async = ncclSuccess;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (!comm)
          throw error(errc::device_failure,
                      describe() + ": " + what + ": the communicator was aborted while waiting ("
                        + failure_text + ")");
        ncclCommGetAsyncError(comm, &async);
      }
      if (async != ncclSuccess && async != ncclInProgress)
        fail(errc::device_failure, describe() + ": " + what + ": NCCL reported "
                                     + nccl_text(async) + "; the communicator was aborted");
      if (steady::now() >= deadline)
        fail(errc::timeout, describe() + ": " + what + " did not complete within "
                              + ms_text(timeout)
                              + " (a peer rank did not take part, died or is stuck); the "
                                "communicator was aborted");
      pause.pause();
    }
  }

  cudaEvent_t tail_event(cudaStream_t stream) {
    for (auto& [s, e] : tails)
      if (s == stream)
        return e;
    cudaEvent_t e = nullptr;
    const auto r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (r != cudaSuccess) {
      cudaGetLastError();
      throw error(errc::device_failure, describe() + ": cudaEventCreate: " + cuda_text(r));
    }
    tails.emplace_back(stream, e);
    return e;
  }

  bool capturing(cudaStream_t stream, const std::string& what) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const auto r = cudaStreamIsCapturing(stream, &status);
    if (r != cudaSuccess) {
      cudaGetLastError();
      throw error(errc::device_failure,
                  describe() + ": " + what + ": cudaStreamIsCapturing: " + cuda_text(r));
    }
    return status == cudaStreamCaptureStatusActive;
  }

  /// Enqueues one NCCL operation on `stream` (`call` runs with the mutex held)
  /// and, with options.wait, waits for it on the device.
  template <class Call>
  void run(const std::string& what, cudaStream_t stream, const collective_options& o,
           Call&& call) {
    const auto timeout = o.timeout.count() > 0 ? o.timeout : options.timeout;
    const auto deadline = steady::now() + timeout;
    device_scope scope(device);
    const bool in_capture = capturing(stream, what);
    if (o.wait && in_capture)
      throw error(errc::bad_input,
                  describe() + ": " + what
                    + ": collective_options::wait inside a graph capture (wait after the "
                      "replay with communicator::wait instead)");
    ncclResult_t r;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (state != phase::ready || !comm)
        throw error(errc::device_failure, describe() + ": " + what
                                            + ": the communicator is not usable ("
                                            + (failure_text.empty() ? "closed" : failure_text)
                                            + ")");
      r = call(comm);
    }
    if (r == ncclInProgress) {
      r = settle(deadline, what);
      if (r == ncclInProgress)
        fail(errc::timeout, describe() + ": " + what + " could not be enqueued within "
                              + ms_text(timeout)
                              + " (NCCL was still connecting to its peers: a peer rank did not "
                                "take part); the communicator was aborted");
    }
    if (r != ncclSuccess)
      fail(errc::device_failure, describe() + ": " + what + " failed: " + nccl_text(r)
                                   + "; the communicator was aborted");
    if (in_capture)
      return;  // completion is the replay's; see communicator::wait
    auto event = tail_event(stream);
    const auto rec = cudaEventRecord(event, stream);
    if (rec != cudaSuccess) {
      cudaGetLastError();
      fail(errc::device_failure, describe() + ": " + what + ": cudaEventRecord: " + cuda_text(rec));
    }
    if (o.wait)
      await(event, deadline, timeout, what);
  }

  std::string size_text(size_t count, element_type type) const {
    return std::to_string(count) + " " + to_string(type);
  }

  void check_peer(int peer, const char* role, const std::string& what) const {
    if (peer < 0 || peer >= world)
      throw error(errc::bad_input, describe() + ": " + what + ": " + role + " " + std::to_string(peer)
                                     + " is not a rank of a world of " + std::to_string(world));
  }
};

bool available() {
  return true;
}

std::string version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess)
    return "";
  return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "."
         + std::to_string(v % 100);
}

unique_id_bytes new_unique_id() {
  ncclUniqueId id;
  const auto r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) {
    const char* last = ncclGetLastError(nullptr);
    throw error(errc::device_failure, std::string("nccl: ncclGetUniqueId failed: ")
                                        + ncclGetErrorString(r) + (last ? std::string(": ") + last : ""));
  }
  static_assert(sizeof(id.internal) == unique_id_size, "NCCL_UNIQUE_ID_BYTES changed");
  return unique_id_bytes(reinterpret_cast<const uint8_t*>(id.internal),
                         reinterpret_cast<const uint8_t*>(id.internal) + unique_id_size);
}

size_t abort_group(const unique_id_bytes& id, const std::string& why) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto [first, last] = reg.members.equal_range(id);
  size_t n = 0;
  for (auto it = first; it != last; ++it)
    n += it->second->abort_for_group(why) ? 1 : 0;
  return n;
}

communicator::communicator(const unique_id_bytes& id, int rank, int world, int device,
                           std::chrono::milliseconds timeout)
    : communicator(id, rank, world, device, with_timeout(timeout)) {}

communicator::communicator(const unique_id_bytes& id, int rank, int world, int device,
                           communicator_options options) {
  if (options.abort_timeout.count() <= 0)
    options.abort_timeout = communicator_options{}.abort_timeout;
  impl_ = std::make_unique<impl>(rank, world, device, std::move(options));
  auto& m = *impl_;
  const auto who = m.describe();
  if (world < 1 || rank < 0 || rank >= world)
    throw error(errc::bad_input, who + ": rank must be in [0, world) and world ≥ 1");
  if (id.size() != unique_id_size)
    throw error(errc::bad_input, who + ": the unique id has " + std::to_string(id.size())
                                   + " bytes, not " + std::to_string(unique_id_size)
                                   + " (not made by new_unique_id?)");
  if (m.options.timeout.count() <= 0)
    throw error(errc::bad_input, who + ": the timeout must be positive");
  int count = 0;
  const auto dc = cudaGetDeviceCount(&count);
  if (dc != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  if (device < 0 || device >= count)
    throw error(errc::device_unavailable,
                who + ": no such CUDA device (this process sees " + std::to_string(count)
                  + (dc == cudaSuccess ? "" : "; cudaGetDeviceCount: " + cuda_text(dc)) + ")");

  device_scope scope(device);
  m.abort_flag = new_abort_flag(who);
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.data(), unique_id_size);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; we poll (see header)
  if (!m.options.name.empty())
    config.commName = m.options.name.c_str();
  const auto deadline = steady::now() + m.options.timeout;
  ncclComm_t c = nullptr;
  auto r = ncclCommInitRankConfig(&c, world, uid, rank, &config);
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    m.comm = c;
  }
  m.join_registry(id);  // from here abort_group reaches this rank, init included
  if (r != ncclSuccess && r != ncclInProgress)
    m.fail(errc::device_failure, who + ": ncclCommInitRankConfig failed: " + m.nccl_text(r));
  r = m.settle(deadline, "init");
  if (r == ncclInProgress)
    m.fail(errc::timeout,
           who + ": init did not complete within " + ms_text(m.options.timeout)
             + ": not every rank of the world joined (do all " + std::to_string(world)
             + " ranks call it with the same unique id and world size, each on its own device "
               "and thread?); the communicator was aborted");
  if (r != ncclSuccess)
    m.fail(errc::device_failure, who + ": init failed: " + m.nccl_text(r)
                                   + "; the communicator was aborted");
  std::lock_guard<std::mutex> lock(m.mutex);
  m.state = impl::phase::ready;
}

communicator::~communicator() = default;

int communicator::rank() const {
  return impl_->rank;
}
int communicator::world() const {
  return impl_->world;
}
int communicator::device() const {
  return impl_->device;
}

bool communicator::usable() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->state == impl::phase::ready && impl_->comm;
}

std::string communicator::failure() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->failure_text;
}

std::string communicator::describe() const {
  return impl_->describe();
}

void communicator::all_reduce(const void* send, void* recv, size_t count, element_type type,
                              reduce_op op, cuda_stream stream, const collective_options& o) {
  const auto what =
    std::string("all_reduce_") + to_string(op) + " of " + impl_->size_text(count, type);
  impl_->run(what, stream, o, [&](ncclComm_t c) {
    return ncclAllReduce(send, recv, count, to_nccl(type), to_nccl(op), c, stream);
  });
}

void communicator::all_reduce_sum(void* data, size_t count, element_type type, cuda_stream stream,
                                  const collective_options& o) {
  all_reduce(data, data, count, type, reduce_op::sum, stream, o);
}

void communicator::all_reduce_avg(void* data, size_t count, element_type type, cuda_stream stream,
                                  const collective_options& o) {
  all_reduce(data, data, count, type, reduce_op::avg, stream, o);
}

void communicator::broadcast(void* data, size_t count, element_type type, int root,
                             cuda_stream stream, const collective_options& o) {
  const auto what = "broadcast from rank " + std::to_string(root) + " of "
                    + impl_->size_text(count, type);
  impl_->check_peer(root, "root", what);
  impl_->run(what, stream, o, [&](ncclComm_t c) {
    return ncclBroadcast(data, data, count, to_nccl(type), root, c, stream);
  });
}

void communicator::send(const void* data, size_t count, element_type type, int peer,
                        cuda_stream stream, const collective_options& o) {
  const auto what = "send of " + impl_->size_text(count, type) + " to rank " + std::to_string(peer);
  impl_->check_peer(peer, "peer", what);
  impl_->run(what, stream, o, [&](ncclComm_t c) {
    return ncclSend(data, count, to_nccl(type), peer, c, stream);
  });
}

void communicator::recv(void* data, size_t count, element_type type, int peer, cuda_stream stream,
                        const collective_options& o) {
  const auto what =
    "recv of " + impl_->size_text(count, type) + " from rank " + std::to_string(peer);
  impl_->check_peer(peer, "peer", what);
  impl_->run(what, stream, o, [&](ncclComm_t c) {
    return ncclRecv(data, count, to_nccl(type), peer, c, stream);
  });
}

const int32_t* communicator::abort_flag() const {
  return impl_->abort_flag;  // mapped: under UVA the host address is the device address
}

void communicator::enqueue(const std::function<void()>& launch, const std::string& what) {
  auto& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mutex);  // start_abort clears `comm` under it
  if (m.state != impl::phase::ready || !m.comm)
    throw error(errc::device_failure, m.describe() + ": " + what + ": the communicator is not usable ("
                                        + (m.failure_text.empty() ? "closed" : m.failure_text) + ")");
  launch();
}

void communicator::wait(cuda_stream stream, std::chrono::milliseconds timeout,
                        const std::string& what) {
  auto& m = *impl_;
  if (timeout.count() <= 0)
    timeout = m.options.timeout;
  const auto deadline = steady::now() + timeout;
  device_scope scope(m.device);
  if (m.capturing(stream, what))
    throw error(errc::bad_input, m.describe() + ": wait for " + what + " inside a graph capture");
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    if (!m.comm)
      throw error(errc::device_failure, m.describe() + ": wait for " + what
                                          + ": the communicator is not usable ("
                                          + (m.failure_text.empty() ? "closed" : m.failure_text)
                                          + ")");
  }
  auto event = m.tail_event(stream);
  const auto rec = cudaEventRecord(event, stream);
  if (rec != cudaSuccess) {
    cudaGetLastError();
    m.fail(errc::device_failure, m.describe() + ": " + what + ": cudaEventRecord: " + cuda_text(rec));
  }
  m.await(event, deadline, timeout, what);
}

bool communicator::close() {
  return close(impl_->options.timeout);
}

bool communicator::close(std::chrono::milliseconds timeout) {
  auto& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    if (m.state == impl::phase::closed)
      return true;
  }
  if (!communicator::usable()) {  // failed or aborted: finish the abort
    m.wait_abort(m.options.abort_timeout);
    return false;
  }
  if (timeout.count() <= 0)
    timeout = m.options.timeout;
  const auto deadline = steady::now() + timeout;
  device_scope scope(m.device);
  try {
    // 1. Everything this communicator enqueued eagerly has finished.
    for (auto& [stream, event] : m.tails)
      m.await(event, deadline, timeout, "close: the last collective before close");
    // 2. ncclCommFinalize: flushes and reaches global quiescence (polled).
    ncclResult_t r;
    {
      std::lock_guard<std::mutex> lock(m.mutex);
      r = ncclCommFinalize(m.comm);
    }
    if (r == ncclSuccess || r == ncclInProgress)
      r = m.settle(deadline, "close: ncclCommFinalize");
    if (r == ncclInProgress)
      m.fail(errc::timeout, m.describe() + ": close: ncclCommFinalize did not complete within "
                              + ms_text(timeout)
                              + " (do all ranks close together, with every graph that captured "
                                "a collective already destroyed?); the communicator was aborted");
    if (r != ncclSuccess)
      m.fail(errc::device_failure, m.describe() + ": close: ncclCommFinalize failed: "
                                     + m.nccl_text(r) + "; the communicator was aborted");
    // 3. ncclCommDestroy: local only once finalised.
    ncclComm_t c;
    {
      std::lock_guard<std::mutex> lock(m.mutex);
      c = std::exchange(m.comm, nullptr);
      m.state = impl::phase::closed;
    }
    r = ncclCommDestroy(c);
    if (r != ncclSuccess && r != ncclInProgress) {  // in progress: freeing locally, nothing to wait for
      std::lock_guard<std::mutex> lock(m.mutex);
      m.failure_text = m.describe() + ": close: ncclCommDestroy failed: " + ncclGetErrorString(r);
      return false;
    }
    return true;
  } catch (const error&) {
    // fail() has started the abort and recorded why (failure()).
    m.wait_abort(m.options.abort_timeout);
    return false;
  }
}

bool communicator::abort() {
  auto& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    if (m.state == impl::phase::closed)
      return true;
  }
  m.start_abort(m.describe() + ": aborted by its owner");
  return m.wait_abort(m.options.abort_timeout);
}

#else

// ─── without NCCL ───────────────────────────────────────────────────────────

struct communicator::impl {};

bool available() {
  return false;
}

std::string version() {
  return "";
}

unique_id_bytes new_unique_id() {
  throw_unavailable("new_unique_id");
}

communicator::communicator(const unique_id_bytes& id, int rank, int world, int device,
                           std::chrono::milliseconds timeout)
    : communicator(id, rank, world, device, with_timeout(timeout)) {}

size_t abort_group(const unique_id_bytes&, const std::string&) {
  return 0;  // no communicator can exist without NCCL
}

communicator::communicator(const unique_id_bytes&, int rank, int world, int device,
                           communicator_options) {
  throw_unavailable("communicator for rank " + std::to_string(rank) + " of "
                    + std::to_string(world) + " on cuda:" + std::to_string(device));
}

communicator::~communicator() = default;

// Unreachable: no communicator can be constructed without NCCL.
int communicator::rank() const { return -1; }
int communicator::world() const { return 0; }
int communicator::device() const { return -1; }
bool communicator::usable() const { return false; }
std::string communicator::failure() const { return "built without NCCL"; }
std::string communicator::describe() const { return "NCCL (not built)"; }
void communicator::all_reduce(const void*, void*, size_t, element_type, reduce_op, cuda_stream,
                              const collective_options&) {
  throw_unavailable("all_reduce");
}
void communicator::all_reduce_sum(void*, size_t, element_type, cuda_stream,
                                  const collective_options&) {
  throw_unavailable("all_reduce_sum");
}
void communicator::all_reduce_avg(void*, size_t, element_type, cuda_stream,
                                  const collective_options&) {
  throw_unavailable("all_reduce_avg");
}
void communicator::broadcast(void*, size_t, element_type, int, cuda_stream,
                             const collective_options&) {
  throw_unavailable("broadcast");
}
void communicator::send(const void*, size_t, element_type, int, cuda_stream,
                        const collective_options&) {
  throw_unavailable("send");
}
void communicator::recv(void*, size_t, element_type, int, cuda_stream, const collective_options&) {
  throw_unavailable("recv");
}
const int32_t* communicator::abort_flag() const { return nullptr; }
void communicator::enqueue(const std::function<void()>&, const std::string&) {
  throw_unavailable("enqueue");
}
void communicator::wait(cuda_stream, std::chrono::milliseconds, const std::string&) {
  throw_unavailable("wait");
}
bool communicator::close(std::chrono::milliseconds) { return true; }
bool communicator::close() { return true; }
bool communicator::abort() { return true; }

#endif

} // namespace tandem::gpu::nccl
