#pragma once
/// Feature transport across nodes by NCCL send/recv (DESIGN.md §3: "the
/// drafter pulls the payload GPU-to-GPU, peer copy within a node, NCCL
/// send/recv across nodes").  The third leg beside gpu/transport/tensors.hpp
/// (one process) and gpu/transport/peer.hpp (GPUs of one node).  gpu/ only.
///
/// Both sides hold a rank of one transport communicator (gpu/nccl/
/// communicator.hpp; NOT the drafters' gradient communicator, whose captured
/// all-reduce must not interleave with these point-to-point calls).  The
/// consumer pulls; payload bytes travel by NCCL, CAF carries descriptors:
///
///   producer (rank p, its device, send stream S)    consumer (rank c, compute C, copy K)
///   ───────────────────────────────────────────    ───────────────────────────────────────
///   writes buffers on P; ready.record(P)
///   h = publish({tensors, ready})  ──descriptor──▶  specs = batch_specs / feature_specs(desc)
///                                  ◀──pull{h, c, specs}──
///   sent = send_payload(comm, c, h, specs, S)
///     checks h, specs, device, peer: bad_input
///       here means NO NCCL call was made ──error──▶ (no recv posted: the pair stays in step)
///     S waits on `ready`; S: ncclSend tensor 0..n-1
///     sent recorded on S                ──ok──────▶ got = recv_payload(comm, p, specs, dev, K, C)
///                                                     allocates on K; K: ncclRecv 0..n-1
///                                                     got.done recorded on K; C waits on it
///   P waits on `sent` before overwriting;           compute on C reads got.tensors
///   release(h) once `sent` has completed
///
/// Ordering.  Sends and receives between one pair of ranks match in the order
/// they are enqueued, tensor by tensor: both sides must transfer payloads in
/// the same order (the pull order), and the tensors of one payload go in list
/// order.  Each tensor travels as its raw bytes (row-major, contiguous), so any
/// dtype moves bit for bit; a non-contiguous producer tensor is sent as a
/// contiguous copy made on S.  Zero-element tensors send nothing.  Nothing is
/// checked on the wire: the producer's check of its payload against the
/// consumer's specs is what keeps both sides' byte counts equal, so the
/// consumer must send in `pull` the very specs it will receive with.
///
/// Threads and streams.  Every call runs on the thread that owns the
/// communicator (the actor's detached thread).  S should be a stream reserved
/// for sends: a send occupies its stream until the consumer has posted the
/// matching recv.  K is the consumer's copy stream; C only waits on events.
/// No host ever waits on the other side's events.
///
/// Lifetime.  Until `sent` completes, NCCL reads the producer's buffers: the
/// producer must not overwrite them (make its compute stream wait on `sent`)
/// nor free them.  The caching allocator already knows the tensors are used
/// on S (recordStream), so dropping the last reference early is safe for
/// memory from LibTorch's allocator; a static buffer a graph rewrites every
/// step needs the wait.  The consumer owns what it received; its memory is
/// recorded as used on C.
///
/// A peer that never arrives (died, stuck, never pulled or never sent): with
/// `transfer_options::wait` the call blocks the host at most `timeout`, then
/// the communicator is aborted (ncclCommAbort, which ends the kernels stuck
/// on the device) and gpu::error(errc::timeout) names the rank, the peer and
/// the tensor.  Without `wait` the call returns once enqueued, and the caller
/// bounds completion later with `comm.wait(stream, timeout, what)`, with the
/// same outcome.  Never a hang.  The other rank learns it by message (or its
/// own timeout) and aborts its rank too (NCCL ≥ 2.19: every rank of a node
/// aborts); the supervisor then forms a new transport communicator.
///
/// Memory from outside the producer's device: tensors of the payload on
/// another GPU of the node or on the CPU are copied to the communicator's
/// device first (as transport::acquire does), on S.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gpu/nccl/communicator.hpp"
#include "gpu/pch.hpp"
#include "gpu/transport/transport.hpp"
#include "messages/descriptors.hpp"

namespace tandem::gpu::transport {

/// The shape and dtype of one tensor of a payload: what a receiver needs to
/// allocate it, and what a producer checks its payload against.
struct tensor_spec {
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::ScalarType::Undefined;

  int64_t numel() const;
  int64_t bytes() const;
};

bool operator==(const tensor_spec& a, const tensor_spec& b);
bool operator!=(const tensor_spec& a, const tensor_spec& b);

/// "[4, 512, 3072] BFloat16".
std::string to_string(const tensor_spec& s);

/// The specs of tensors as they are.
std::vector<tensor_spec> specs_of(const std::vector<at::Tensor>& tensors);

/// The specs of the payload published under `h`, without touching its data
/// or its device (no copy, no wait).  Throws gpu::error(bad_input) for an
/// unknown handle.
std::vector<tensor_spec> specs_of(handle h);

/// A staged batch {tokens [rows, seq_len] Int, loss_mask [rows, seq_len] Byte,
/// doc_lengths [rows, max_docs] Long} (gpu/engine/batch.hpp's layout).  The
/// descriptor does not carry max_docs: it is the packer's (config) K.
std::vector<tensor_spec> batch_specs(const batch_desc& desc, int64_t max_docs);

/// A target's taps {[rows, seq_len, n·D] in the target's dtype} (target_info's,
/// which the target actor also writes into the descriptor).
std::vector<tensor_spec> feature_specs(const features_desc& desc, at::ScalarType dtype);
/// As above with the descriptor's own dtype ("bfloat16", "float16", "float32");
/// gpu::error(bad_input) when it is empty or another.
std::vector<tensor_spec> feature_specs(const features_desc& desc);

/// Throws gpu::error(bad_input) unless every spec has a defined dtype and
/// non-negative sizes; `what` opens the message.
void check_specs(const std::vector<tensor_spec>& specs, const std::string& what);

/// Throws gpu::error(bad_input) naming the first difference (count, then the
/// first tensor whose shape or dtype differs) between what is `held` and
/// what is `expected`; `what` opens the message.
void check_matches(const std::vector<tensor_spec>& held, const std::vector<tensor_spec>& expected,
                   const std::string& what);

/// Deadline and blocking of one send_payload / recv_payload / recv_into.
struct transfer_options {
  /// Bounds the whole call: enqueueing every tensor (NCCL may still be
  /// connecting to the peer) and, with `wait`, the completion on the device.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  /// Block the host until the transfer has completed on the device (polling
  /// the event and NCCL's error state against the deadline).  false: return
  /// once enqueued; then bound it with `comm.wait(stream, timeout, what)`.
  bool wait = true;
};

#ifdef TANDEM_HAVE_CUDA

/// Producer side: sends the payload published under `h` to rank `peer` of
/// `comm`, on `stream` (a stream of comm's device), after the payload's ready
/// event.  Checks first, before any NCCL call, and throws gpu::error(bad_input)
/// for: an unknown handle, a payload that differs from `expected` (count,
/// shape or dtype; `expected` is what the consumer will receive with), a
/// stream on another device than the communicator's, a peer that is not
/// another rank of the communicator.  errc::device_failure for a communicator
/// that is no longer usable.  Returns the event recorded on `stream` after
/// the last send: the buffers may be overwritten or freed once it completes.
/// Timeouts and NCCL failures: see the header comment (errc::timeout /
/// device_failure, the communicator aborted).
std::shared_ptr<at::cuda::CUDAEvent> send_payload(nccl::communicator& comm, int peer, handle h,
                                                  const std::vector<tensor_spec>& expected,
                                                  const c10::cuda::CUDAStream& stream,
                                                  const transfer_options& options = {});

/// What the consumer received.
struct received_payload {
  std::vector<at::Tensor> tensors;  ///< on the consumer's device, contiguous, as the specs say
  /// Recorded on the copy stream after the last recv; the compute stream
  /// already waits on it.
  std::shared_ptr<at::cuda::CUDAEvent> done;
};

/// Consumer side: receives from rank `peer` of `comm` the payload described by
/// `specs` into new tensors on `device` (comm's device), allocated and
/// received on `copy_stream`; `compute_stream` waits on the returned event.
/// Throws gpu::error(bad_input), before any allocation or NCCL call, for
/// malformed specs, a device or stream other than the communicator's device,
/// or a peer that is not another rank.
received_payload recv_payload(nccl::communicator& comm, int peer,
                              const std::vector<tensor_spec>& specs, const at::Device& device,
                              const c10::cuda::CUDAStream& copy_stream,
                              const c10::cuda::CUDAStream& compute_stream,
                              const transfer_options& options = {});

/// As recv_payload, into the consumer's own tensors `dst` (e.g. a graph's
/// static inputs; CUDA, contiguous, on comm's device; their specs are the
/// payload's).  The receive also waits for the work already enqueued on
/// `compute_stream`, so earlier readers of `dst` finish first.  Returns the
/// event on `copy_stream` that `compute_stream` now waits on.
std::shared_ptr<at::cuda::CUDAEvent> recv_into(nccl::communicator& comm, int peer,
                                               const std::vector<at::Tensor>& dst,
                                               const c10::cuda::CUDAStream& copy_stream,
                                               const c10::cuda::CUDAStream& compute_stream,
                                               const transfer_options& options = {});

#endif

} // namespace tandem::gpu::transport
