#include "gpu/engine/batch.hpp"

#include "gpu/pch.hpp"
#include "gpu/transport/tensors.hpp"

namespace tandem::gpu {

transport::handle publish_batch(const data::packed_batch& b) {
  transport::payload p;
  p.tensors = {b.tokens, b.loss_mask, b.doc_lengths};
  return transport::publish(std::move(p));
}

transport::handle publish_batch(const data::device_batch& b) {
  transport::payload p;
  p.tensors = {b.tokens, b.loss_mask, b.doc_lengths};
#ifdef TANDEM_HAVE_CUDA
  p.ready = b.ready;
#endif
  return transport::publish(std::move(p));
}

} // namespace tandem::gpu
