#include "gpu/transport/peer.hpp"

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "gpu/device/error.hpp"
#include "gpu/device/shape_text.hpp"

#ifdef TANDEM_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

namespace tandem::gpu::transport {

const char* to_string(copy_path p) {
  switch (p) {
    case copy_path::same_device: return "same_device";
    case copy_path::peer: return "peer";
    case copy_path::staged: return "staged";
  }
  return "?";
}

#ifndef TANDEM_HAVE_CUDA

bool enable_peer_access(int, int) {
  return false;
}

#else

namespace {

void check(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess)
    return;
  cudaGetLastError();  // clear the non-sticky error
  throw error(errc::device_failure, "transport: " + what + ": " + cudaGetErrorName(e) + " ("
                                      + cudaGetErrorString(e) + ")");
}

/// Device `from` maps device `to`'s memory; an already enabled mapping is fine.
bool enable_one_way(int from, int to) {
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, from, to) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (!can)
    return false;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(from));
  const auto e = cudaDeviceEnablePeerAccess(to, 0);
  if (e == cudaSuccess)
    return true;
  cudaGetLastError();
  return e == cudaErrorPeerAccessAlreadyEnabled;
}

/// "[2, 3] BFloat16 on cuda:1".
std::string tensor_text(const at::Tensor& t) {
  return shape_text(t.sizes()) + " " + c10::toString(t.scalar_type()) + " on " + t.device().str();
}

void check_cuda_tensor(const at::Tensor& t, const char* role) {
  if (!t.defined() || !t.is_cuda())
    throw error(errc::bad_input, std::string("transport: the ") + role + " must be a CUDA tensor, got "
                                   + (t.defined() ? tensor_text(t) : std::string("undefined")));
  if (!t.is_contiguous())
    throw error(errc::bad_input, std::string("transport: the ") + role + " " + tensor_text(t)
                                   + " is not contiguous");
}

void check_stream(const c10::cuda::CUDAStream& s, const at::Device& device, const char* role) {
  if (s.device_index() != device.index())
    throw error(errc::bad_input, std::string("transport: the ") + role + " is on cuda:"
                                   + std::to_string(s.device_index()) + ", the consumer on "
                                   + device.str());
}

/// The copy itself: `copy_stream` is already ordered after everything the
/// copy depends on.
device_copy copy_now(const at::Tensor& src, const at::Tensor& dst,
                     const c10::cuda::CUDAStream& copy_stream,
                     const c10::cuda::CUDAStream& compute_stream) {
  const int from = src.device().index();
  const int to = dst.device().index();
  const size_t bytes = static_cast<size_t>(src.numel()) * src.element_size();
  device_copy out;
  out.tensor = dst;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(to));
  if (from == to) {
    out.path = copy_path::same_device;
    check(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), bytes, cudaMemcpyDeviceToDevice,
                          copy_stream.stream()),
          "cudaMemcpyAsync on " + dst.device().str());
  } else {
    out.path = enable_peer_access(from, to) ? copy_path::peer : copy_path::staged;
    check(cudaMemcpyPeerAsync(dst.data_ptr(), to, src.data_ptr(), from, bytes, copy_stream.stream()),
          "cudaMemcpyPeerAsync cuda:" + std::to_string(from) + " → cuda:" + std::to_string(to));
  }
  // Keep both buffers from being reused before the copy stream passes this
  // point, whoever drops the last reference first.
  c10::cuda::CUDACachingAllocator::recordStream(src.storage().data_ptr(), copy_stream);
  c10::cuda::CUDACachingAllocator::recordStream(dst.storage().data_ptr(), copy_stream);
  out.done = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
  out.done->record(copy_stream);
  out.done->block(compute_stream);
  return out;
}

} // namespace

bool enable_peer_access(int a, int b) {
  if (a == b)
    return true;
  static std::mutex mutex;
  static std::map<std::pair<int, int>, bool> known;
  const auto key = std::make_pair(std::min(a, b), std::max(a, b));
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find(key);
  if (it != known.end())
    return it->second;
  const bool on = enable_one_way(a, b) && enable_one_way(b, a);
  known.emplace(key, on);
  return on;
}

device_copy copy_into(const at::Tensor& src, const std::shared_ptr<at::cuda::CUDAEvent>& ready,
                      const at::Tensor& dst, const c10::cuda::CUDAStream& copy_stream,
                      const c10::cuda::CUDAStream& compute_stream) {
  check_cuda_tensor(src, "source");
  check_cuda_tensor(dst, "destination");
  if (src.scalar_type() != dst.scalar_type() || src.numel() != dst.numel())
    throw error(errc::bad_input, "transport: cannot copy " + tensor_text(src) + " into "
                                   + tensor_text(dst) + " (dtype and element count must match)");
  check_stream(copy_stream, dst.device(), "copy stream");
  check_stream(compute_stream, dst.device(), "compute stream");
  c10::cuda::CUDAGuard guard(dst.device().index());
  if (ready)
    ready->block(copy_stream);
  // Earlier readers of a reused destination (the consumer's static buffer)
  // finish before it is overwritten.
  at::cuda::CUDAEvent readers_done(cudaEventDisableTiming);
  readers_done.record(compute_stream);
  readers_done.block(copy_stream);
  return copy_now(src, dst, copy_stream, compute_stream);
}

device_copy fetch(const at::Tensor& src, const std::shared_ptr<at::cuda::CUDAEvent>& ready,
                  const at::Device& device, const c10::cuda::CUDAStream& copy_stream,
                  const c10::cuda::CUDAStream& compute_stream) {
  check_cuda_tensor(src, "source");
  if (!device.is_cuda() || !device.has_index())
    throw error(errc::bad_input, "transport: fetch to " + device.str()
                                   + " (needs a CUDA device with an index)");
  check_stream(compute_stream, device, "compute stream");
  if (src.device() == device) {
    c10::cuda::CUDAGuard guard(device.index());
    if (ready)
      ready->block(compute_stream);
    c10::cuda::CUDACachingAllocator::recordStream(src.storage().data_ptr(), compute_stream);
    device_copy out;
    out.tensor = src;
    out.path = copy_path::same_device;
    return out;
  }
  check_stream(copy_stream, device, "copy stream");
  at::Tensor dst;
  {
    // Allocated on the copy stream: the block's earlier users are ordered on it.
    c10::cuda::CUDAStreamGuard on_copy(copy_stream);
    dst = at::empty(src.sizes(), src.options().device(device));
  }
  if (ready) {
    c10::cuda::CUDAGuard guard(device.index());
    ready->block(copy_stream);
  }
  auto out = copy_now(src, dst, copy_stream, compute_stream);
  c10::cuda::CUDACachingAllocator::recordStream(dst.storage().data_ptr(), compute_stream);
  return out;
}

#endif

} // namespace tandem::gpu::transport
