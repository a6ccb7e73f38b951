#include "gpu/transport/tensors.hpp"

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
  handle next = 1;
};

registry& the_registry() {
  static registry r;
  return r;
}

} // namespace

handle publish(payload p) {
  auto& r = the_registry();
  auto shared = std::make_shared<const payload>(std::move(p));
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto h = r.next++;
  r.entries.emplace(h, std::move(shared));
  return h;
}

std::shared_ptr<const payload> peek(handle h) {
  auto& r = the_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.entries.find(h);
  if (it == r.entries.end())
    throw error(errc::bad_input, "transport: unknown handle " + std::to_string(h)
                                   + " (released, or published by another process)");
  return it->second;
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
  return r.entries.erase(h) > 0;
}

size_t live_handles() {
  auto& r = the_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.entries.size();
}

} // namespace tandem::gpu::transport
