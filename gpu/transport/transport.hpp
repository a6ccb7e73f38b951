#pragma once
/// Feature and batch transport between GPU-owning actors (DESIGN.md §3).
///
/// Payload bytes never travel through CAF: the producer publishes tensors
/// here and sends a descriptor carrying the returned handle; the consumer
/// acquires the tensors by handle, uses them, and acknowledges to the
/// producer by message; the producer (the only owner) then releases the
/// handle.  Within one process a handle names tensors in this registry;
/// across nodes the same handle names the producer's buffer for an NCCL
/// send/recv (GPU-engine issue).
///
/// This header is torch-free: actors hold and release handles.  Publishing
/// and acquiring tensors is in gpu/transport/tensors.hpp (gpu/ only).

#include <cstddef>
#include <cstdint>

namespace tandem::gpu::transport {

using handle = uint64_t;

/// Drops the producer's reference; the tensors are freed once no consumer
/// still holds them.  Releasing an unknown handle is a no-op (returns false),
/// so a producer restarted after a crash can release idempotently.
bool release(handle h);

/// Handles currently published (for leak checks in tests and the shell).
size_t live_handles();

} // namespace tandem::gpu::transport
