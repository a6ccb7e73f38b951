#pragma once
/// Each shard verified once per process, however many prefetch engines read
/// it.  Every prefetch actor (one per target) reads the whole epoch order's
/// share of its rank, which touches every shard: without this, eight
/// targets would hash a data set eight times over.

#include <cstddef>

#include "gpu/data/dataset.hpp"

namespace tandem::gpu::data {

/// As `ds.verify_shard(index, check)`, but a shard that any thread of this
/// process has verified with the same result key (the file's absolute path,
/// size and modification time, the manifest's sha256, the vocabulary limit
/// and its source) is not read again: its result is returned (or its error
/// thrown again); one being verified by another thread is waited for.
/// Thread-safe.
void verify_shard_once(const dataset& ds, size_t index, const shard_check& check);

} // namespace tandem::gpu::data
