#pragma once
/// The LibTorch side of gpu/nccl (gpu/ only): one flat gradient bucket so a
/// single all-reduce covers every gradient, the global gradient norm and
/// clipping computed on the device (no host synchronisation, so the whole
/// drafter step can be captured in one graph; DESIGN.md §4), and tensor
/// forms of the communicator's collectives.
///
/// A step with a bucket, all on the drafter's stream:
///
///   flat_bucket bucket(fp32_grads);           // once: fp32_grads[i] are now views
///   ...backward / copy into fp32_grads...
///   all_reduce(comm, bucket.flat(), reduce_op::avg);
///   auto norm = global_norm({bucket.flat()}); // == global_norm(fp32_grads)
///   clip_(bucket.views(), max_norm, norm);
///
/// The views keep the bucket's storage alive and never move, so a graph that
/// captured them stays valid for the bucket's life.

#include <cstdint>
#include <vector>

#include "gpu/nccl/communicator.hpp"
#include "gpu/pch.hpp"

namespace tandem::gpu::nccl {

/// One contiguous fp32 buffer behind a list of gradients.
class flat_bucket {
public:
  /// Views start at multiples of this many elements (64 bytes), so the
  /// vectorised foreach / fused-optimizer kernels see aligned tensors.
  static constexpr int64_t default_alignment = 16;

  flat_bucket() = default;

  /// Allocates ONE fp32 buffer on the gradients' device, copies each
  /// gradient's current value into its slot (padding is zero) and replaces
  /// every `grads[i]` by a contiguous view of that slot with the same shape.
  /// All gradients must be defined fp32 tensors on one device; throws
  /// gpu::error(bad_input) otherwise.  An empty list gives an empty bucket.
  explicit flat_bucket(std::vector<at::Tensor>& grads, int64_t alignment = default_alignment);

  /// As above for parameters' `.grad()`: each parameter's gradient becomes a
  /// view of the bucket (an undefined gradient starts as zeros).  Autograd
  /// then accumulates into the views in place, as long as gradients are
  /// zeroed in place (`zero_()`), never set to none.
  static flat_bucket of_param_grads(std::vector<at::Tensor>& params,
                                    int64_t alignment = default_alignment);

  /// [numel()] fp32: every gradient and the zero padding between them.
  const at::Tensor& flat() const { return flat_; }
  /// The gradients' views, in the order given.
  const std::vector<at::Tensor>& views() const { return views_; }
  /// Where view i starts in flat(), in elements.
  const std::vector<int64_t>& offsets() const { return offsets_; }
  int64_t numel() const { return flat_.defined() ? flat_.numel() : 0; }
  bool empty() const { return views_.empty(); }

  /// Zeroes every gradient with one kernel.
  void zero_();

private:
  at::Tensor flat_;
  std::vector<at::Tensor> views_;
  std::vector<int64_t> offsets_;
};

/// ‖(‖t_i‖₂)_i‖₂ as a float32 [] tensor on the tensors' device, with no host
/// synchronisation (as torch.nn.utils.clip_grad_norm_).  Throws bad_input for
/// an empty list.
at::Tensor global_norm(const std::vector<at::Tensor>& tensors);

/// In place, on the device: t_i *= min(1, max_norm / (norm + 1e-6)), with
/// `norm` a [] tensor (usually global_norm of the same tensors).  Returns the
/// factor applied ([] float32).  max_norm ≤ 0 leaves the tensors unchanged.
at::Tensor clip_(const std::vector<at::Tensor>& tensors, double max_norm, const at::Tensor& norm);

/// The NCCL element type of a LibTorch dtype; bad_input for others.
element_type element_type_of(at::ScalarType type);

/// Collectives on a contiguous CUDA tensor on `comm`'s device, in place, on
/// the current stream of that device (so they capture with the step).
void all_reduce(communicator& comm, const at::Tensor& tensor, reduce_op op,
                const collective_options& options = {});
void broadcast(communicator& comm, const at::Tensor& tensor, int root,
               const collective_options& options = {});
void send(communicator& comm, const at::Tensor& tensor, int peer,
          const collective_options& options = {});
void recv(communicator& comm, const at::Tensor& tensor, int peer,
          const collective_options& options = {});

} // namespace tandem::gpu::nccl
