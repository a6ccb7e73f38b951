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

/// Sharing with the other processes of this host (a cluster whose nodes run
/// on one machine, `tandem node`): when on, payloads published with
/// scope::host (batches, features) that live on the CPU are written once
/// into a POSIX shared-memory segment (/dev/shm/tandem-UID-PID-N, reserved
/// with posix_fallocate, so a full /dev/shm is an error naming its size, not
/// a SIGBUS), and their handle names the segment: a consumer in another
/// process maps it (no copy) and the producer's release unlinks it.  Off (the
/// default) handles are process-local as before.
void share_with_host(bool on);
bool sharing_with_host();

/// Unlinks the segments this process still owns (done at exit when sharing
/// is on; call it before a std::_Exit).
void unlink_own_segments();

/// What sharing with other processes cost this process so far (host time):
/// publishing (the copy into shared memory, or the IPC handles and event),
/// mapping another process's payload (shared memory, or opening IPC handles
/// and the event), releasing.  For `tandem node`'s report and the bench.
struct sharing_stats {
  uint64_t published = 0, mapped = 0, released = 0;
  double publish_ms = 0, map_ms = 0, release_ms = 0;
  uint64_t ipc_published = 0, ipc_mapped = 0, ipc_opened = 0;  ///< CUDA IPC payloads; allocations opened
};
sharing_stats sharing_cost();

/// Removes the segments of this user's processes that are no longer alive
/// (a node killed before it released its payloads); returns how many.
size_t sweep_orphan_segments();

} // namespace tandem::gpu::transport
