#pragma once
/// Payloads between two processes by NCCL: a target's batches and features
/// pulled by a drafter on another host (or, with `cluster.transport =
/// "nccl"`, in another process of the same host).  Torch-free facade: the
/// target and drafter actors hold one link per peer and call it on their own
/// threads.  Built on gpu/transport/nccl.hpp's send_payload / recv_payload;
/// the protocol that drives it (messages/target.hpp, link and pull) is:
///
///   drafter j (consumer, rank 1)                     target i (producer, rank 0)
///   ─────────────────────────────                    ─────────────────────────────
///   (link, j) ─────────────────────────────────────▶ id = nccl::new_unique_id()
///          ◀──────────────────────────────────── id  (answered first, then:)
///   link(id, 1, …)   ── both join, then one byte ──   link(id, 0, …)
///   a work item whose features are not reachable
///   in this host's memory:
///   (pull, j, {batch, features}) ──────────────────▶ specs = check(handles)
///          ◀──────────────────────────────── specs   (answered, then:)
///   handles = receive(specs)   ◀══ NCCL ══           send(handles): enqueued on the
///   (blocks the host until received, bounded)         link's stream, the host not blocked
///   train on the local handles, release them
///
/// The producer answers a pull only after every check passed, so a refused
/// pull leaves no send queued, and the consumer posts its receives only after
/// the answer: sends and receives of one pair always match, in order.  A
/// link that failed (a timeout, the peer gone) is unusable; the consumer
/// asks for a new one, which replaces (aborts) the producer's old one and
/// with it any send still waiting for a receive that never comes.
///
/// Wire format: each tensor's raw bytes, row-major; `wire_tensor::dtype`
/// names it ("int32", "uint8", "int64", "bfloat16", "float16", "float32").

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu/transport/transport.hpp"
#include "messages/descriptors.hpp"

namespace tandem::gpu::transport {

/// One end of a two-rank NCCL communicator.  Every method belongs to the
/// owner's thread.
class link {
public:
  /// Joins communicator `id` (nccl::new_unique_id's bytes) as `rank` (0: the
  /// producer, 1: the consumer) on CUDA device `device`, and connects the
  /// pair with one byte sent from rank 0 to rank 1.  Blocks until the peer
  /// has done the same, at most `timeout`, which also bounds every later
  /// transfer.  Throws gpu::error: device_unavailable (built without NCCL, or
  /// `device` < 0: the CPU path does not cross hosts), timeout, device_failure.
  link(const std::vector<uint8_t>& id, int rank, int32_t device, std::chrono::milliseconds timeout,
       const std::string& name);
  ~link();  ///< aborts the communicator (a send waiting for its receive ends)
  link(const link&) = delete;
  link& operator=(const link&) = delete;

  /// Producer: what `handles` hold, checked (every handle known, every
  /// tensor on this link's device or copyable to it) without any NCCL call.
  /// Throws gpu::error(bad_input) naming the handle.
  std::vector<payload_spec> check(const std::vector<handle>& handles) const;

  /// Producer: enqueues the payloads under `handles`, in order, to the peer
  /// on the link's stream (after each payload's ready event); returns once
  /// enqueued.  `specs` is what `check` returned for them.  The payloads'
  /// memory stays in use on the link's stream until the peer has received
  /// it (the caching allocator knows; release them as usual).
  void send(const std::vector<handle>& handles, const std::vector<payload_spec>& specs);

  /// Consumer: receives payloads described by `specs` into new tensors on
  /// this link's device and publishes each in this process (scope::process);
  /// blocks the host until they have arrived, at most the link's timeout
  /// (then the communicator is aborted and gpu::error(timeout) thrown).
  /// The caller releases the returned handles.
  std::vector<handle> receive(const std::vector<payload_spec>& specs);

  /// Initialised and neither failed nor aborted.
  bool usable() const;
  /// "NCCL rank 1 of 2 on cuda:0 (features from target 0)".
  std::string describe() const;
  /// Bytes this end sent or received so far, and the host time receives
  /// took (for the run's summary and the bench).
  int64_t bytes() const;
  double receive_ms() const;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// What this process's links moved so far (every link, also closed ones):
/// for `tandem node`'s report and the bench.
struct link_stats {
  uint64_t links = 0;                    ///< joined
  uint64_t pulls_sent = 0, pulls_received = 0;
  int64_t bytes_sent = 0, bytes_received = 0;
  double receive_ms = 0;                 ///< host time in receive (enqueue to arrival)
};
link_stats links_cost();

/// The identity of this process's host ("HOSTNAME boot BOOT_ID", as a node's
/// hello says it): payloads between processes of one host go through shared
/// memory or CUDA IPC, others through a link.  `set_host_identity` replaces
/// it (a node uses its hello's, which tests may pose).
const std::string& host_identity();
void set_host_identity(std::string host);

/// Names this process's host for NCCL (the NCCL_HOSTID variable, unless the
/// user set it): host_identity(), or with `per_process` host_identity() and
/// `process` (a node's name).  cluster.transport = "nccl" does the latter:
/// NCCL then treats every process as a host of its own and moves payloads
/// between them with its network transport — the cross-host path, also
/// between two processes on one GPU, which NCCL refuses within one host.
/// Call before the process's first NCCL communicator.
void name_nccl_host(const std::string& process, bool per_process);

/// `cluster.transport = "nccl"`: payloads between any two processes go
/// through a link, also on one host.  Off by default.
void force_links(bool on);
bool forcing_links();

/// The deadline of joining a link and of each transfer on it
/// (`cluster.timeout_s`-derived; 60 s by default).
void set_link_timeout(std::chrono::milliseconds timeout);
std::chrono::milliseconds link_timeout();

} // namespace tandem::gpu::transport
