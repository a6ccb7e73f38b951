#include "gpu/transport/tensors.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "gpu/device/error.hpp"
#include "gpu/transport/peer.hpp"

#ifdef TANDEM_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

namespace tandem::gpu::transport {

namespace {

/// The process's registry.  Entries are immutable once published: the only
/// shared state is the map itself, behind a mutex, touched once per publish,
/// acquire and release — never inside a step.
struct registry {
  std::mutex mutex;
  std::unordered_map<handle, std::shared_ptr<const payload>> entries;
  std::unordered_map<handle, std::string> segments;  ///< the shared ones' segment names
#ifdef TANDEM_HAVE_CUDA
  std::unordered_map<handle, cudaEvent_t> ipc_events;  ///< their IPC events, destroyed at release
#endif
  uint32_t next = 1;
};

registry& the_registry() {
  // Never destroyed: entries left at exit hold device tensors and events,
  // which must not be freed by the static destructors after the CUDA
  // runtime has shut down (their shared-memory segments are swept by the
  // next process, sweep_orphan_segments).
  static auto* r = new registry;
  return *r;
}

std::atomic<bool> sharing{false};

struct stats_box {
  std::mutex mutex;
  sharing_stats s;
};
stats_box& stats() {
  static stats_box b;
  return b;
}
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// ------------------------------------------------------- shared segments --
//
// A segment: a header, then each tensor's bytes at a 64-byte aligned offset.
//   magic "TNDMSHM1" | uint32 count | count × { int32 dtype, int32 ndim,
//   int64 sizes[8], int64 offset, int64 bytes }

constexpr char seg_magic[8] = {'T', 'N', 'D', 'M', 'S', 'H', 'M', '1'};
constexpr int max_dims = 8;

struct seg_entry {
  int32_t dtype = 0, ndim = 0;
  int64_t sizes[max_dims] = {};
  int64_t offset = 0, bytes = 0;
};

#ifdef TANDEM_HAVE_CUDA
// A CUDA IPC segment: the handles, not the bytes.
//   magic "TNDMIPC1" | int32 device | 64-byte event handle | uint32 count |
//   count × { int32 dtype, int32 ndim, int64 sizes[8], int64 offset (from
//   the allocation's base), int64 bytes, 64-byte memory handle }
constexpr char ipc_magic[8] = {'T', 'N', 'D', 'M', 'I', 'P', 'C', '1'};

struct ipc_entry {
  int32_t dtype = 0, ndim = 0;
  int64_t sizes[max_dims] = {};
  int64_t offset = 0, bytes = 0;
  cudaIpcMemHandle_t handle{};
};

void cuda_check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess)
    throw error(errc::device_failure, "transport: " + what + ": " + cudaGetErrorString(e));
}
#endif

std::string segment_name(uint32_t pid, uint32_t n) {
  return "/tandem-" + std::to_string(::getuid()) + "-" + std::to_string(pid) + "-" + std::to_string(n);
}

uint32_t pid_of(handle h) { return static_cast<uint32_t>(h >> 32); }

/// A mapping, unmapped when the last tensor viewing it is freed.
struct mapping {
  void* base = MAP_FAILED;
  size_t size = 0;
  ~mapping() {
    if (base != MAP_FAILED)
      ::munmap(base, size);
  }
};

std::string errno_text() { return std::strerror(errno); }

/// Copies the CPU tensors of `p` into a new segment `name` and replaces
/// them by views of its mapping.
void write_segment(payload& p, const std::string& name) {
  const size_t header = sizeof(seg_magic) + sizeof(uint32_t) + p.tensors.size() * sizeof(seg_entry);
  std::vector<seg_entry> entries(p.tensors.size());
  size_t end = (header + 63) / 64 * 64;
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    auto& t = p.tensors[i];
    if (t.dim() > max_dims)
      throw error(errc::bad_input, "transport: a shared payload's tensor has " + std::to_string(t.dim())
                                     + " dimensions (at most " + std::to_string(max_dims) + ")");
    auto& e = entries[i];
    e.dtype = static_cast<int32_t>(t.scalar_type());
    e.ndim = static_cast<int32_t>(t.dim());
    for (int64_t d = 0; d < t.dim(); ++d)
      e.sizes[d] = t.size(d);
    e.offset = static_cast<int64_t>(end);
    e.bytes = static_cast<int64_t>(t.numel() * t.element_size());
    end = (end + static_cast<size_t>(e.bytes) + 63) / 64 * 64;
  }
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    throw error(errc::device_failure, "transport: cannot create the shared-memory segment /dev/shm" + name + ": "
                                        + errno_text());
  // Reserve every page now: a full /dev/shm is this error, not a SIGBUS
  // when the copy first touches a page.
  if (const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(end)); rc != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw error(errc::device_failure, "transport: cannot reserve " + std::to_string(end)
                                        + " bytes of shared memory for /dev/shm" + name + ": "
                                        + std::strerror(rc) + " (is /dev/shm full? df -h /dev/shm)");
  }
  auto m = std::make_shared<mapping>();
  m->size = end;
  m->base = ::mmap(nullptr, end, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m->base == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    throw error(errc::device_failure, "transport: cannot map /dev/shm" + name + ": " + errno_text());
  }
  auto* base = static_cast<char*>(m->base);
  std::memcpy(base, seg_magic, sizeof(seg_magic));
  const auto count = static_cast<uint32_t>(entries.size());
  std::memcpy(base + sizeof(seg_magic), &count, sizeof(count));
  std::memcpy(base + sizeof(seg_magic) + sizeof(count), entries.data(), entries.size() * sizeof(seg_entry));
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    const auto& e = entries[i];
    auto view = at::from_blob(base + e.offset, at::IntArrayRef(e.sizes, static_cast<size_t>(e.ndim)),
                              [m](void*) {}, at::TensorOptions().dtype(p.tensors[i].scalar_type()));
    view.copy_(p.tensors[i]);
    p.tensors[i] = view;
  }
}

/// Writes the small segment `name` of bytes `data`.
void write_small_segment(const std::string& name, const std::string& data) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    throw error(errc::device_failure, "transport: cannot create /dev/shm" + name + ": " + errno_text());
  if (const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(data.size())); rc != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw error(errc::device_failure, "transport: cannot reserve " + std::to_string(data.size())
                                        + " bytes of shared memory for /dev/shm" + name + ": " + std::strerror(rc));
  }
  const bool ok = ::pwrite(fd, data.data(), data.size(), 0) == static_cast<ssize_t>(data.size());
  ::close(fd);
  if (!ok) {
    ::shm_unlink(name.c_str());
    throw error(errc::device_failure, "transport: cannot write /dev/shm" + name + ": " + errno_text());
  }
}

#ifdef TANDEM_HAVE_CUDA
/// The CUDA tensors of `p` (contiguous, on one device) exported: their IPC
/// memory handles and offsets and an IPC event recorded after `p.ready` on
/// the current stream, in segment `name`.  Returns the event (the producer
/// destroys it at release).
cudaEvent_t write_ipc_segment(const payload& p, const std::string& name) {
  const auto dev = p.tensors.front().device().index();
  c10::cuda::CUDAGuard guard(dev);
  auto stream = c10::cuda::getCurrentCUDAStream(dev);
  if (p.ready)
    p.ready->block(stream);
  std::vector<ipc_entry> entries(p.tensors.size());
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    const auto& t = p.tensors[i];
    auto& e = entries[i];
    e.dtype = static_cast<int32_t>(t.scalar_type());
    e.ndim = static_cast<int32_t>(t.dim());
    for (int64_t d = 0; d < t.dim(); ++d)
      e.sizes[d] = t.size(d);
    e.bytes = static_cast<int64_t>(t.numel() * t.element_size());
    size_t alloc_size = 0;
    auto* base = static_cast<char*>(c10::cuda::CUDACachingAllocator::getBaseAllocation(t.data_ptr(), &alloc_size));
    e.offset = static_cast<char*>(t.data_ptr()) - base;
    cuda_check(cudaIpcGetMemHandle(&e.handle, base), "cudaIpcGetMemHandle");
  }
  cudaEvent_t ev = nullptr;
  cuda_check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess), "an IPC event");
  cudaIpcEventHandle_t eh{};
  try {
    cuda_check(cudaEventRecord(ev, stream.stream()), "cudaEventRecord");
    cuda_check(cudaIpcGetEventHandle(&eh, ev), "cudaIpcGetEventHandle");
    std::string data(ipc_magic, sizeof(ipc_magic));
    const int32_t d32 = static_cast<int32_t>(dev);
    data.append(reinterpret_cast<const char*>(&d32), sizeof(d32));
    data.append(reinterpret_cast<const char*>(&eh), sizeof(eh));
    const auto count = static_cast<uint32_t>(entries.size());
    data.append(reinterpret_cast<const char*>(&count), sizeof(count));
    data.append(reinterpret_cast<const char*>(entries.data()), entries.size() * sizeof(ipc_entry));
    write_small_segment(name, data);
  } catch (...) {
    cudaEventDestroy(ev);
    throw;
  }
  return ev;
}

/// Another process's CUDA payload: each allocation opened once per process
/// (the producer's caching allocator hands out the same blocks again), the
/// producer's event waited on by the current stream of its device.
std::shared_ptr<const payload> map_ipc(const char* base, size_t size, const std::string& where) {
  const size_t fixed = sizeof(ipc_magic) + sizeof(int32_t) + sizeof(cudaIpcEventHandle_t) + sizeof(uint32_t);
  if (size < fixed)
    throw error(errc::bad_input, where + ": a damaged CUDA IPC header");
  int32_t dev = 0;
  cudaIpcEventHandle_t eh{};
  uint32_t count = 0;
  const char* at = base + sizeof(ipc_magic);
  std::memcpy(&dev, at, sizeof(dev));
  at += sizeof(dev);
  std::memcpy(&eh, at, sizeof(eh));
  at += sizeof(eh);
  std::memcpy(&count, at, sizeof(count));
  at += sizeof(count);
  if (count > 64 || size < fixed + count * sizeof(ipc_entry) || dev < 0)
    throw error(errc::bad_input, where + ": a damaged CUDA IPC header (" + std::to_string(count) + " tensors)");
  std::vector<ipc_entry> entries(count);
  std::memcpy(entries.data(), at, count * sizeof(ipc_entry));
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(dev));
  static std::mutex open_mutex;
  static std::map<std::string, char*> opened;  // allocation handle → its mapping here
  auto p = std::make_shared<payload>();
  p->foreign = true;
  for (const auto& e : entries) {
    if (e.ndim < 0 || e.ndim > max_dims || e.offset < 0 || e.bytes < 0)
      throw error(errc::bad_input, where + ": a damaged CUDA IPC entry");
    const std::string key(reinterpret_cast<const char*>(&e.handle), sizeof(e.handle));
    char* mapped = nullptr;
    {
      std::lock_guard<std::mutex> lock(open_mutex);
      auto it = opened.find(key);
      if (it == opened.end()) {
        void* ptr = nullptr;
        cuda_check(cudaIpcOpenMemHandle(&ptr, e.handle, cudaIpcMemLazyEnablePeerAccess),
                   where + ": cudaIpcOpenMemHandle");
        it = opened.emplace(key, static_cast<char*>(ptr)).first;
        std::lock_guard<std::mutex> s(stats().mutex);
        ++stats().s.ipc_opened;
      }
      mapped = it->second;
    }
    const auto dtype = static_cast<at::ScalarType>(e.dtype);
    p->tensors.push_back(at::from_blob(mapped + e.offset, at::IntArrayRef(e.sizes, static_cast<size_t>(e.ndim)),
                                       [](void*) {}, at::TensorOptions().dtype(dtype).device(at::kCUDA, dev)));
  }
  cudaEvent_t ev = nullptr;
  cuda_check(cudaIpcOpenEventHandle(&ev, eh), where + ": cudaIpcOpenEventHandle");
  const auto wait = cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(dev)).stream(), ev, 0);
  cudaEventDestroy(ev);
  cuda_check(wait, where + ": cudaStreamWaitEvent");
  std::lock_guard<std::mutex> s(stats().mutex);
  ++stats().s.ipc_mapped;
  return p;
}
#endif

/// The payload of another process's segment, mapped copy-on-write (a
/// consumer that writes into its views does not touch the producer's).
std::shared_ptr<const payload> map_segment(handle h) {
  const auto name = segment_name(pid_of(h), static_cast<uint32_t>(h));
  const auto unknown = [&](const std::string& why) {
    return error(errc::bad_input, "transport: handle " + std::to_string(h) + " of process " + std::to_string(pid_of(h))
                                    + ": " + why);
  };
  const int fd = ::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) {
    if (::kill(static_cast<pid_t>(pid_of(h)), 0) != 0 && errno == ESRCH)
      throw unknown("its process is gone (no segment /dev/shm" + name + ")");
    throw unknown("no shared segment /dev/shm" + name + " (released already)");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw unknown("cannot stat /dev/shm" + name + ": " + errno_text());
  }
  auto m = std::make_shared<mapping>();
  m->size = static_cast<size_t>(st.st_size);
  m->base = ::mmap(nullptr, m->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m->base == MAP_FAILED)
    throw unknown("cannot map /dev/shm" + name + ": " + errno_text());
  const auto* base = static_cast<const char*>(m->base);
  uint32_t count = 0;
  const size_t fixed = sizeof(seg_magic) + sizeof(count);
#ifdef TANDEM_HAVE_CUDA
  if (m->size >= sizeof(ipc_magic) && std::memcmp(base, ipc_magic, sizeof(ipc_magic)) == 0)
    return map_ipc(base, m->size, "transport: handle " + std::to_string(h) + " of process " + std::to_string(pid_of(h)));
#endif
  if (m->size >= sizeof(seg_magic) && std::memcmp(base, "TNDMIPC1", 8) == 0)
    throw unknown("a CUDA payload, and this build has no CUDA");
  if (m->size < fixed || std::memcmp(base, seg_magic, sizeof(seg_magic)) != 0)
    throw unknown("/dev/shm" + name + " is not a Tandem payload segment");
  std::memcpy(&count, base + sizeof(seg_magic), sizeof(count));
  if (count > 64 || m->size < fixed + count * sizeof(seg_entry))
    throw unknown("/dev/shm" + name + ": a damaged header (" + std::to_string(count) + " tensors)");
  std::vector<seg_entry> entries(count);
  std::memcpy(entries.data(), base + fixed, count * sizeof(seg_entry));
  auto p = std::make_shared<payload>();
  p->foreign = true;
  for (const auto& e : entries) {
    if (e.ndim < 0 || e.ndim > max_dims || e.offset < 0 || e.bytes < 0
        || static_cast<size_t>(e.offset + e.bytes) > m->size)
      throw unknown("/dev/shm" + name + ": a tensor entry out of bounds");
    const auto dtype = static_cast<at::ScalarType>(e.dtype);
    auto t = at::from_blob(static_cast<char*>(m->base) + e.offset, at::IntArrayRef(e.sizes, static_cast<size_t>(e.ndim)),
                           [m](void*) {}, at::TensorOptions().dtype(dtype));
    if (t.numel() * t.element_size() != e.bytes)
      throw unknown("/dev/shm" + name + ": a tensor entry's size does not match its shape");
    p->tensors.push_back(std::move(t));
  }
  return p;
}

} // namespace

/// At exit, a sharing process unlinks the segments it still owns (payloads
/// in flight when its run ended); a killed one leaves them to the sweep.
void unlink_own_segments() {
  auto& r = the_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& [h, name] : r.segments)
    ::shm_unlink(name.c_str());
  r.segments.clear();
}

void share_with_host(bool on) {
  static std::once_flag registered;
  if (on)
    std::call_once(registered, [] {
      the_registry();  // built first, so destroyed after the handler has run
      std::atexit(unlink_own_segments);
    });
  sharing.store(on);
}


bool sharing_with_host() { return sharing.load(); }

size_t sweep_orphan_segments() {
  const std::string prefix = "tandem-" + std::to_string(::getuid()) + "-";
  size_t removed = 0;
  DIR* dir = ::opendir("/dev/shm");
  if (!dir)
    return 0;
  while (const auto* ent = ::readdir(dir)) {
    const std::string name = ent->d_name;
    if (name.rfind(prefix, 0) != 0)
      continue;
    const auto rest = name.substr(prefix.size());  // PID-N
    const auto dash = rest.find('-');
    if (dash == std::string::npos || rest.find_first_not_of("0123456789-") != std::string::npos)
      continue;
    const auto pid = static_cast<pid_t>(std::stoll(rest.substr(0, dash)));
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH && ::shm_unlink(("/" + name).c_str()) == 0)
      ++removed;
  }
  ::closedir(dir);
  return removed;
}

handle publish(payload p, scope s) {
  auto& r = the_registry();
  bool shared = false, on_gpu = false;
  if (s == scope::host && sharing.load() && !p.tensors.empty()) {
    bool cpu = true, gpu = true;
    for (const auto& t : p.tensors) {
      cpu = cpu && !t.is_cuda();
      gpu = gpu && t.is_cuda() && t.is_contiguous() && t.device() == p.tensors.front().device();
    }
    shared = cpu;
    on_gpu = gpu;
  }
  const auto t0 = std::chrono::steady_clock::now();
  uint32_t n = 0;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    n = r.next++;
  }
  // Shared or not, a sharing process names its handles by its pid, so a
  // consumer elsewhere knows whose they are.
  const handle h = sharing.load() ? (static_cast<handle>(::getpid()) << 32) | n : n;
  std::string name;
  if (shared) {
    name = segment_name(static_cast<uint32_t>(::getpid()), n);
    write_segment(p, name);
  }
#ifdef TANDEM_HAVE_CUDA
  cudaEvent_t ipc_event = nullptr;
  if (on_gpu) {
    name = segment_name(static_cast<uint32_t>(::getpid()), n);
    ipc_event = write_ipc_segment(p, name);
  }
#else
  (void)on_gpu;
#endif
  if (!name.empty()) {
    std::lock_guard<std::mutex> lock(stats().mutex);
    ++stats().s.published;
    stats().s.publish_ms += ms_since(t0);
#ifdef TANDEM_HAVE_CUDA
    if (on_gpu)
      ++stats().s.ipc_published;
#endif
  }
  auto entry = std::make_shared<const payload>(std::move(p));
  std::lock_guard<std::mutex> lock(r.mutex);
  r.entries.emplace(h, std::move(entry));
  if (!name.empty())
    r.segments.emplace(h, std::move(name));
#ifdef TANDEM_HAVE_CUDA
  if (ipc_event)
    r.ipc_events.emplace(h, ipc_event);
#endif
  return h;
}

sharing_stats sharing_cost() {
  std::lock_guard<std::mutex> lock(stats().mutex);
  return stats().s;
}

std::shared_ptr<const payload> peek(handle h) {
  auto& r = the_registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.entries.find(h);
    if (it != r.entries.end())
      return it->second;
  }
  if (pid_of(h) != 0 && pid_of(h) != static_cast<uint32_t>(::getpid())) {
    const auto t0 = std::chrono::steady_clock::now();
    auto p = map_segment(h);
    std::lock_guard<std::mutex> lock(stats().mutex);
    ++stats().s.mapped;
    stats().s.map_ms += ms_since(t0);
    return p;
  }
  throw error(errc::bad_input, "transport: unknown handle " + std::to_string(h)
                                 + " (released, or published by another process)");
}

std::vector<at::Tensor> acquire(handle h, const at::Device& device) {
  const auto p = peek(h);
  std::vector<at::Tensor> out;
  out.reserve(p->tensors.size());
#ifdef TANDEM_HAVE_CUDA
  if (device.is_cuda()) {
    auto stream = c10::cuda::getCurrentCUDAStream(device.index());
    if (p->ready)
      p->ready->block(stream);
    for (const auto& t : p->tensors) {
      if (t.device() == device) {
        // (Another process's memory is not this allocator's to track.)
        if (!p->foreign)
          c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream);
        out.push_back(t);
      } else if (t.is_cuda() && t.is_contiguous()) {
        // Another GPU of this process: a peer copy on a copy stream of the
        // consumer, ordered by events (gpu/transport/peer.hpp).
        auto copy_stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
        out.push_back(fetch(t, p->ready, device, copy_stream, stream).tensor);
      } else {
        out.push_back(t.to(device, /*non_blocking=*/true));
      }
    }
    return out;
  }
#endif
  for (const auto& t : p->tensors)
    out.push_back(t.device() == device ? t : t.to(device));
  return out;
}

bool release(handle h) {
  auto& r = the_registry();
  const auto t0 = std::chrono::steady_clock::now();
  bool shared = false;
  bool found = false;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    if (auto it = r.segments.find(h); it != r.segments.end()) {
      ::shm_unlink(it->second.c_str());  // consumers' mappings stay valid until they unmap
      r.segments.erase(it);
      shared = true;
    }
#ifdef TANDEM_HAVE_CUDA
    if (auto it = r.ipc_events.find(h); it != r.ipc_events.end()) {
      cudaEventDestroy(it->second);  // the consumer acknowledged: its wait is enqueued long since
      r.ipc_events.erase(it);
    }
#endif
    found = r.entries.erase(h) > 0;
  }
  if (shared) {
    std::lock_guard<std::mutex> lock(stats().mutex);
    ++stats().s.released;
    stats().s.release_ms += ms_since(t0);
  }
  return found;
}

size_t live_handles() {
  auto& r = the_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.entries.size();
}

} // namespace tandem::gpu::transport
