#pragma once
/// Device-to-device feature transport within one node (DESIGN.md §3: "the
/// drafter pulls the payload GPU-to-GPU, peer copy within a node").  gpu/ only.
///
///   producer (cuda:i, its stream P)      consumer (cuda:j, compute stream C, copy stream K)
///   ─────────────────────────────────    ──────────────────────────────────────────────────
///   writes src on P; ready.record(P)
///   publish(src, ready) ──descriptor──▶  copy = copy_into(src, ready, dst, K, C)
///                                          K waits for `ready` and for C's earlier work
///                                          K: cudaMemcpyPeerAsync src → dst
///                                          copy.done recorded on K; C waits on it
///                                        compute on C reads dst
///   src may be overwritten once            ◀──ack── (after copy.done, or make P wait on it)
///   copy.done has completed
///
/// The copy runs on the consumer's copy stream, never on the producer's
/// streams, and no host ever waits: the ordering is all events.  Peer access
/// (cudaDeviceCanAccessPeer / cudaDeviceEnablePeerAccess) is enabled once per
/// pair of devices, both ways, when the hardware allows; without it the same
/// cudaMemcpyPeerAsync is staged through host memory by the driver.
///
/// Lifetime of the producer's tensor: the caching allocator is told that
/// `src` is in use on the copy stream (recordStream), so even if the
/// producer drops its last reference right after the call, device i does not
/// reuse that memory before the copy has finished.  A producer's *static*
/// buffer (one a graph writes every step) is never freed, so the producer
/// must not overwrite it before `done` has completed: its stream waits on
/// `done`, or it waits for the consumer's acknowledgement sent after `done`.

#include <memory>

#include "gpu/pch.hpp"

namespace tandem::gpu::transport {

/// How a tensor reached the consumer's device.
enum class copy_path {
  same_device,  ///< fetch: no copy, the producer's tensor itself; copy_into: a device-local copy
  peer,         ///< direct GPU-to-GPU (NVLink / PCIe peer access)
  staged,       ///< no peer access: staged through host memory by the driver
};

const char* to_string(copy_path p);

/// Enables peer access between CUDA devices `a` and `b`, both ways, once per
/// process (later calls are cached).  True when direct access is on; false
/// when the hardware cannot (or without CUDA).  Thread-safe.
bool enable_peer_access(int a, int b);

#ifdef TANDEM_HAVE_CUDA

/// What one device-to-device transfer left behind.
struct device_copy {
  at::Tensor tensor;  ///< on the consumer's device
  /// Recorded on the copy stream after the copy; the consumer's compute
  /// stream already waits on it.  Null for copy_path::same_device.
  std::shared_ptr<at::cuda::CUDAEvent> done;
  copy_path path = copy_path::same_device;
};

/// Copies `src` (any CUDA device) into the consumer-owned `dst` (CUDA,
/// contiguous, same dtype and element count; `src` contiguous too) on
/// `copy_stream` (a stream of dst's device).  The copy starts after `ready`
/// (the producer's event; null: src is valid now) and after all work already
/// enqueued on `compute_stream` (so earlier readers of a reused `dst` are
/// done); `compute_stream` (dst's device) waits on the returned `done`.
/// Asynchronous.  Throws gpu::error(bad_input) for mismatched tensors.
device_copy copy_into(const at::Tensor& src, const std::shared_ptr<at::cuda::CUDAEvent>& ready,
                      const at::Tensor& dst, const c10::cuda::CUDAStream& copy_stream,
                      const c10::cuda::CUDAStream& compute_stream);

/// `src` on `device` for a consumer computing on `compute_stream`.  Same
/// device: no copy — `compute_stream` waits on `ready` and `src` itself comes
/// back (the allocator learns it is used on `compute_stream`).  Another
/// device: a new tensor allocated on `copy_stream` and filled as by
/// copy_into, its memory marked as used on `compute_stream`.
device_copy fetch(const at::Tensor& src, const std::shared_ptr<at::cuda::CUDAEvent>& ready,
                  const at::Device& device, const c10::cuda::CUDAStream& copy_stream,
                  const c10::cuda::CUDAStream& compute_stream);

#endif

} // namespace tandem::gpu::transport
