#pragma once
/// The packer's options and its step count, without LibTorch: what a
/// launcher needs to know about packing before any batch is made
/// (gpu/data/packer.hpp packs; docs/data.md, "Packing").

#include <cstdint>

#include "gpu/data/dataset.hpp"

namespace tandem::gpu::data {

struct packer_options {
  int64_t rows = 1;         ///< B: rows per batch
  int64_t seq_len = 3072;   ///< S: tokens per row
  int64_t max_docs = 16;    ///< K: documents per row at most (the width of doc_lengths)
  int64_t lookahead = 16;   ///< W: pending samples first fit chooses from
  bool pinned = false;      ///< page-locked host memory (only when CUDA is available)
};

/// The optimizer steps of `epochs` passes over `ds`: per epoch, the batches
/// of every prefetch rank (`ranks` of them, each packing its rank_order share
/// from a fresh cursor) dealt `drafters` a step, the epoch's last step with
/// fewer.  Exact while the epochs counted visit at most `budget` samples;
/// past that (a very large data set) the later epochs are taken to pack like
/// the counted ones and the total is scaled from them (`epochs_counted` says
/// how many were).  This is the learning-rate schedule's length and the
/// progress line's total: the packer decides how many rows a data set fills,
/// not an assumed fill factor.
struct step_count {
  int64_t steps = 0;
  int64_t epochs_counted = 0;
};
step_count count_steps(const dataset& ds, uint64_t seed, int64_t ranks, int64_t drafters,
                       const packer_options& opts, int64_t epochs, int64_t budget = 50'000'000);

} // namespace tandem::gpu::data
