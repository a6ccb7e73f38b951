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
};

/// Publishes `p` and returns its handle (never 0).
handle publish(payload p);

/// The payload of `h` as published: no copy, no wait on its event (the
/// tensors may still be being written).  For looking at shapes, dtypes and
/// devices.  Throws gpu::error(errc::bad_input) for an unknown handle.
std::shared_ptr<const payload> peek(handle h);

/// The payload of `h` for a consumer on `device`, on the current stream:
/// waits (on the device, not the host) for the producer's event.  Same
/// device: the tensors themselves (no copy).  Another device of this
/// process: an asynchronous peer copy on the current stream.  Throws
/// gpu::error(errc::bad_input) for an unknown handle.
std::vector<at::Tensor> acquire(handle h, const at::Device& device);

} // namespace tandem::gpu::transport
