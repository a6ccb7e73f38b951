#pragma once
/// The tensor side of gpu/transport/transport.hpp (gpu/ only).

#include <memory>
#include <vector>

#include "gpu/pch.hpp"
#include "gpu/transport/transport.hpp"

namespace tandem::gpu::transport {

/// What a handle names: tensors and, on a GPU, the event after which they
/// are valid on their device.
struct payload {
  std::vector<at::Tensor> tensors;
#ifdef TANDEM_HAVE_CUDA
  std::shared_ptr<at::cuda::CUDAEvent> ready;  ///< null: valid now
#endif
  /// Mapped from another process (shared memory or CUDA IPC): not this
  /// process's caching allocator's, and already ordered on the stream that
  /// acquired it.
  bool foreign = false;
};

/// Who may acquire a payload: this process only (snapshots, anything a
/// local actor consumes), or any process of this host when sharing is on
/// (share_with_host: batches and features, which a node's drafter may take
/// from another node's prefetch and target).
enum class scope { process, host };

/// Publishes `p` and returns its handle (never 0).  With scope::host and
/// sharing on, CPU tensors are copied once into a shared-memory segment and
/// the payload holds views of it; CUDA tensors (contiguous, one device) are
/// not copied: a small segment carries their CUDA IPC memory handles and
/// offsets and an IPC event recorded after `p.ready`, and another process
/// maps them (each allocation once per process) and waits on the event on
/// its current stream.
handle publish(payload p, scope s = scope::process);

/// The payload of `h` as published: no copy, no wait on its event (the
/// tensors may still be being written).  For looking at shapes, dtypes and
/// devices.  Throws gpu::error(errc::bad_input) for an unknown handle.
std::shared_ptr<const payload> peek(handle h);

/// The payload of `h` for a consumer on `device`, on the current stream:
/// waits (on the device, not the host) for the producer's event.  Same
/// device: the tensors themselves (no copy).  Another device of this
/// process: an asynchronous peer copy on the current stream.  Another
/// process's shared payload (share_with_host): its segment mapped
/// copy-on-write, then moved to `device` if that is a GPU.  Throws
/// gpu::error(errc::bad_input) for an unknown handle.
std::vector<at::Tensor> acquire(handle h, const at::Device& device);

} // namespace tandem::gpu::transport
