#include "gpu/data/staging.hpp"

#include "gpu/device/error.hpp"

#ifdef TANDEM_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace tandem::gpu::data {

void device_batch::wait_on_current_stream() const {
#ifdef TANDEM_HAVE_CUDA
  if (!ready)
    return;
  auto stream = c10::cuda::getCurrentCUDAStream(tokens.device().index());
  ready->block(stream);
  for (const auto* t : {&tokens, &loss_mask, &doc_lengths})
    c10::cuda::CUDACachingAllocator::recordStream(t->storage().data_ptr(), stream);
#endif
}

stager::stager(at::Device device) : device_(device) {
  if (device_.is_cuda()) {
#ifdef TANDEM_HAVE_CUDA
    copy_stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index());
#else
    throw error(errc::device_unavailable, "stager for " + device_.str()
                                            + ": Tandem was built without CUDA");
#endif
  }
}

device_batch stager::stage(const packed_batch& batch) {
  device_batch out;
  out.sample_ids = batch.sample_ids;
  out.after = batch.after;
  if (!device_.is_cuda()) {
    out.tokens = batch.tokens;
    out.loss_mask = batch.loss_mask;
    out.doc_lengths = batch.doc_lengths;
    return out;
  }
#ifdef TANDEM_HAVE_CUDA
  c10::cuda::CUDAGuard guard(device_.index());
  c10::cuda::CUDAStreamGuard on_copy_stream(*copy_stream_);
  // Allocated on the copy stream; non_blocking from pinned memory is a true
  // async copy, and the allocator keeps the pinned source alive until the
  // copy stream passes it.
  out.tokens = batch.tokens.to(device_, /*non_blocking=*/true);
  out.loss_mask = batch.loss_mask.to(device_, true);
  out.doc_lengths = batch.doc_lengths.to(device_, true);
  out.ready = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
  out.ready->record(*copy_stream_);
#endif
  return out;
}

} // namespace tandem::gpu::data
