#include "gpu/transport/tensors.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "gpu/device/error.hpp"
#include "gpu/transport/peer.hpp"

#ifdef TANDEM_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
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
  uint32_t next = 1;
};

registry& the_registry() {
  static registry r;
  return r;
}

std::atomic<bool> sharing{false};

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
    throw unknown("no shared segment /dev/shm" + name
                  + " (released already, or a GPU payload: CUDA IPC between processes is not built yet)");
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
  if (m->size < fixed || std::memcmp(base, seg_magic, sizeof(seg_magic)) != 0)
    throw unknown("/dev/shm" + name + " is not a Tandem payload segment");
  std::memcpy(&count, base + sizeof(seg_magic), sizeof(count));
  if (count > 64 || m->size < fixed + count * sizeof(seg_entry))
    throw unknown("/dev/shm" + name + ": a damaged header (" + std::to_string(count) + " tensors)");
  std::vector<seg_entry> entries(count);
  std::memcpy(entries.data(), base + fixed, count * sizeof(seg_entry));
  auto p = std::make_shared<payload>();
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
  bool shared = false;
  if (s == scope::host && sharing.load()) {
    shared = !p.tensors.empty();
    for (const auto& t : p.tensors)
      shared = shared && !t.is_cuda();
  }
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
  auto entry = std::make_shared<const payload>(std::move(p));
  std::lock_guard<std::mutex> lock(r.mutex);
  r.entries.emplace(h, std::move(entry));
  if (shared)
    r.segments.emplace(h, std::move(name));
  return h;
}

std::shared_ptr<const payload> peek(handle h) {
  auto& r = the_registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.entries.find(h);
    if (it != r.entries.end())
      return it->second;
  }
  if (pid_of(h) != 0 && pid_of(h) != static_cast<uint32_t>(::getpid()))
    return map_segment(h);
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
  std::lock_guard<std::mutex> lock(r.mutex);
  if (auto it = r.segments.find(h); it != r.segments.end()) {
    ::shm_unlink(it->second.c_str());  // consumers' mappings stay valid until they unmap
    r.segments.erase(it);
  }
  return r.entries.erase(h) > 0;
}

size_t live_handles() {
  auto& r = the_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.entries.size();
}

} // namespace tandem::gpu::transport
