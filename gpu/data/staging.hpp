#pragma once
/// Host → device staging of packed batches for the prefetch actor: copies
/// from pinned host memory on the actor's own copy stream, asynchronously,
/// and records an event the consumer waits on (never a host synchronise).
/// On the CPU it hands the host tensors through unchanged.

#include <memory>
#include <vector>

#include "gpu/data/packer.hpp"
#include "gpu/pch.hpp"

namespace tandem::gpu::data {

/// A packed batch resident on a device.
struct device_batch {
  at::Tensor tokens;       ///< [B, S] int32
  at::Tensor loss_mask;    ///< [B, S] uint8
  at::Tensor doc_lengths;  ///< [B, K] int64
  std::vector<int64_t> sample_ids;
  cursor after;
#ifdef TANDEM_HAVE_CUDA
  /// Recorded on the copy stream after the copies; null on the CPU.
  std::shared_ptr<at::cuda::CUDAEvent> ready;
#endif

  /// Makes `stream`'s later work wait for the copies (no host blocking) and
  /// tells the caching allocator the tensors are used there.  No-op on the CPU.
  void wait_on_current_stream() const;
};

/// One per prefetch actor; lives and is used on that actor's thread.
class stager {
public:
  /// `device`: where batches go (the CPU means "pass through").
  explicit stager(at::Device device);

  /// Starts the copies of `batch` (its tensors should be pinned for the copy
  /// to be asynchronous) and returns at once.  The host tensors are kept
  /// alive by the copy until it completes.
  device_batch stage(const packed_batch& batch);

  const at::Device& device() const { return device_; }

private:
  at::Device device_;
#ifdef TANDEM_HAVE_CUDA
  std::optional<c10::cuda::CUDAStream> copy_stream_;
#endif
};

} // namespace tandem::gpu::data
