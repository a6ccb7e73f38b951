#pragma once
/// Descriptors that cross actors (and, later, nodes): shapes, ids and
/// transport handles — never tensor payloads (DESIGN.md §3).  Registered in
/// messages/registry.cpp; append fields at the end only.

#include <cstdint>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/meta/type_name.hpp>

namespace tandem {

/// Where a payload lives: node (0 on a single host) and CUDA ordinal (−1 = CPU).
struct device_ref {
  int32_t node = 0;
  int32_t device = -1;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_ref& x) {
  return f(caf::meta::type_name("tandem.device_ref"), x.node, x.device);
}

/// A packed batch staged by a prefetch actor: tokens [rows, seq_len] int32,
/// loss_mask [rows, seq_len] uint8, doc_lengths [rows, K] int64 behind `handle`.
struct batch_desc {
  int64_t batch_id = -1;             ///< the ledger's id
  int64_t epoch = 0;
  int64_t generation = 0;            ///< the data generation it was packed in (see prefetch.hpp)
  int32_t source = 0;                ///< prefetch index
  std::vector<int64_t> sample_ids;   ///< every sample in the batch
  int64_t rows = 0, seq_len = 0;
  int64_t real_tokens = 0;           ///< tokens that are not padding
  device_ref where;
  uint64_t handle = 0;               ///< gpu::transport handle
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, batch_desc& x) {
  return f(caf::meta::type_name("tandem.batch_desc"), x.batch_id, x.epoch, x.generation, x.source,
           x.sample_ids,
           x.rows, x.seq_len, x.real_tokens, x.where, x.handle);
}

/// The target's taps for one batch: [rows, seq_len, n·D] behind `handle`.
struct features_desc {
  int64_t batch_id = -1;
  int32_t target = 0;                ///< target index (owner of the handle)
  std::vector<int64_t> shape;
  device_ref where;
  uint64_t handle = 0;
  double forward_ms = 0;             ///< target compute time
  std::string dtype;                 ///< of the taps: "bfloat16" or "float32" (a receiver on
                                     ///< another node allocates from shape and dtype)
  /// Where the handles (this one and the batch's) can be acquired: the host
  /// of the target's process (gpu/transport/link.hpp host_identity) and the
  /// target actor itself.  A drafter in another process of that host maps
  /// them (shared memory, CUDA IPC); one on another host, or any other
  /// process when cluster.transport = "nccl", pulls them from `producer`
  /// over an NCCL link (messages/target.hpp).
  std::string host;
  caf::actor producer;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, features_desc& x) {
  return f(caf::meta::type_name("tandem.features_desc"), x.batch_id, x.target, x.shape, x.where,
           x.handle, x.forward_ms, x.dtype, x.host, x.producer);
}

/// One tensor on the wire of an NCCL link (gpu/transport/link.hpp): its
/// shape and dtype ("int32", "uint8", "int64", "bfloat16", "float16",
/// "float32"); the bytes travel by NCCL, row-major.
struct wire_tensor {
  std::vector<int64_t> shape;
  std::string dtype;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, wire_tensor& x) {
  return f(caf::meta::type_name("tandem.wire_tensor"), x.shape, x.dtype);
}

/// The tensors of one payload (a batch, a target's features), in order.
struct payload_spec {
  std::vector<wire_tensor> tensors;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, payload_spec& x) {
  return f(caf::meta::type_name("tandem.payload_spec"), x.tensors);
}

/// A target's answer to a pull: what it is about to send, payload by payload
/// in the order the pull named the handles.
struct pulled {
  std::vector<payload_spec> payloads;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pulled& x) {
  return f(caf::meta::type_name("tandem.pulled"), x.payloads);
}

/// What a drafter trains on: a batch and its features.
struct work_item {
  batch_desc batch;
  features_desc features;
  /// false: a data-parallel rank without a batch of its own this step (see
  /// messages/drafter.hpp): train on this copy with the loss scaled by 0.
  bool contribute = true;
  /// The learning-rate multiplier of the step this item trains (the
  /// coordinator's schedule, set at run time through the control endpoint and
  /// kept in checkpoints): every replica of a group step gets the same.
  double lr_scale = 1.0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, work_item& x) {
  return f(caf::meta::type_name("tandem.work_item"), x.batch, x.features, x.contribute, x.lr_scale);
}

/// A drafter's report of one optimizer step.
struct step_report {
  int32_t drafter = 0;
  int64_t step = 0;          ///< optimizer steps taken by this drafter, after this one
  int64_t batch_id = -1;
  double loss = 0, accuracy = 0, grad_norm = 0, lr = 0;
  int64_t scored_tokens = 0;
  int64_t real_tokens = 0;   ///< batch tokens that are not padding
  bool finite = true;        ///< false: non-finite loss or gradient, update skipped
  double compute_ms = 0;     ///< the step itself
  double wait_ms = 0;        ///< idle time before this work item arrived
  bool contributed = true;   ///< false: the work item's contribute was false
  /// The step's collective did not complete on this drafter (a peer died,
  /// the group was aborted): it left its group and waits for the next
  /// group_spec.  `step` is then what its state holds, read back from the
  /// device: the step before (the update was skipped) or this one (the
  /// collective had completed, every rank's gradient is in).
  bool group_failed = false;
  double tflop = 0;          ///< the step's useful work (gpu/models/flops.hpp), for MFU
  /// Simulated acceptance length (drafter_engine.hpp step_result): an
  /// estimate from the step's own blocks, not τ.
  double sim_accept = 0;
  /// The update count its restore point in device memory holds after this
  /// step (checkpoint.memory_every; −1: none): a failure from here on is
  /// restored from it, not from the newest checkpoint.
  int64_t restore_point = -1;
  /// The drafter's device after the step (CUDA; 0 on the CPU): bytes its
  /// caching allocator has allocated, reserved and at most allocated — the
  /// whole device's, since the actors on one GPU share the allocator — and
  /// the captured graphs and the bytes of their private memory pools.
  int64_t mem_allocated = 0, mem_reserved = 0, mem_peak = 0;
  int32_t graphs = 0;
  int64_t graph_pool_bytes = 0;
  /// The work item's payloads never arrived (pulled over an NCCL link from a
  /// target that died, or a link that failed): nothing was trained, `step`
  /// is the drafter's unchanged count, and the coordinator re-issues the
  /// batches in flight (a single drafter; one in a group fails instead).
  bool lost_input = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_report& x) {
  return f(caf::meta::type_name("tandem.step_report"), x.drafter, x.step, x.batch_id, x.loss,
           x.accuracy, x.grad_norm, x.lr, x.scored_tokens, x.real_tokens, x.finite, x.compute_ms,
           x.wait_ms, x.contributed, x.group_failed, x.tflop, x.sim_accept, x.restore_point,
           x.mem_allocated, x.mem_reserved, x.mem_peak, x.graphs, x.graph_pool_bytes, x.lost_input);
}

/// A drafter's state copied off its device, ready for the checkpointer.
struct snapshot_desc {
  int32_t drafter = 0;
  int64_t step = 0;
  uint64_t handle = 0;       ///< gpu::transport handle of the CPU copies
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, snapshot_desc& x) {
  return f(caf::meta::type_name("tandem.snapshot_desc"), x.drafter, x.step, x.handle);
}

} // namespace tandem
