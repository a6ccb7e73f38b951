#pragma once
/// Publishing packed batches as transport payloads {tokens, loss_mask,
/// doc_lengths}, the layout target_engine::forward and
/// drafter_engine::train_step read (gpu/ and tests; torch).

#include "gpu/data/packer.hpp"
#include "gpu/data/staging.hpp"
#include "gpu/transport/transport.hpp"

namespace tandem::gpu {

/// Publishes the batch's CPU tensors (shared, not copied).  The caller owns
/// the handle.
transport::handle publish_batch(const data::packed_batch& batch);

/// Publishes a staged batch with its ready event (on a GPU).
transport::handle publish_batch(const data::device_batch& batch);

} // namespace tandem::gpu
