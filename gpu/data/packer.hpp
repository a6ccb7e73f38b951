#pragma once
/// Packing samples into fixed `rows × seq_len` batches (docs/data.md,
/// "Packing"): one static shape per bucket, so graphs are captured once.
///
/// Samples are taken in the rank's epoch order. The packer keeps a window of
/// the next `lookahead` pending samples and places each, oldest first, in
/// the first row with room for all of it (first fit; at most `max_docs`
/// documents per row). A sample that fits no row stays pending and the scan
/// moves on; the batch is closed when every pending sample has been refused.
/// The oldest pending sample always fits an empty row, so none waits more
/// than `lookahead` batches. Whole samples only: a sample longer than
/// `seq_len` keeps its first `seq_len` tokens and is counted as truncated.
/// The rest of each row is padding (token 0, loss_mask 0).
///
/// Deterministic: the batches depend only on the dataset's sample lengths,
/// the order, the options and the starting cursor; a packer started from
/// any batch's `after` cursor produces exactly the batches an uninterrupted
/// one produces next.

#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "gpu/data/dataset.hpp"
#include "gpu/data/order.hpp"
#include "gpu/data/packing.hpp"

namespace tandem::gpu::data {


/// One batch, in CPU memory (pinned when asked and possible).
///
/// Tokens are int32, as in the shards: a plain copy out of the mapping, half
/// the bytes of int64 to stage and to copy to the GPU; at::embedding takes
/// int32 ids and the objective widens its labels on the device.
struct packed_batch {
  at::Tensor tokens;       ///< [B, S] int32; padding 0
  at::Tensor loss_mask;    ///< [B, S] uint8; padding 0
  at::Tensor doc_lengths;  ///< [B, K] int64; row r's documents in order, then zeros
                           ///< (as make_doc_layout(doc_lengths, S) takes them)
  at::Tensor doc_ids;      ///< [B, K] int64; the sample id of each document, -1 = none
  std::vector<int64_t> sample_ids;  ///< every sample of the batch, row by row, in row order
  int64_t real_tokens = 0;          ///< Σ doc_lengths
  int64_t padding_tokens = 0;       ///< B·S − real_tokens
  int64_t truncated_samples = 0;    ///< samples cut to S tokens
  int64_t truncated_tokens = 0;     ///< tokens those lost
  cursor after;                     ///< resume here to get the batches after this one

  /// padding_tokens / (B·S).
  double padding_waste() const;
};

/// Totals over the batches a packer has produced.
struct packing_stats {
  int64_t batches = 0;
  int64_t samples = 0;
  int64_t real_tokens = 0;
  int64_t padding_tokens = 0;
  int64_t truncated_samples = 0;
  int64_t truncated_tokens = 0;

  /// padding_tokens / (real_tokens + padding_tokens); 0 before any batch.
  double padding_waste() const;
};

class packer {
public:
  /// Packs the samples `order[from.position …]` (a rank's order for epoch
  /// `from.epoch`), skipping the positions in `from.taken`. Throws
  /// gpu::error(bad_input) for invalid options or a cursor outside `order`.
  packer(dataset ds, std::vector<int64_t> order, const packer_options& opts, cursor from = {});

  /// The next batch, or nullopt once every sample of the order is packed.
  /// The epoch's last batch is usually part padding; its shape is the same.
  std::optional<packed_batch> next();

  /// The cursor after the last batch returned (the starting one before).
  const cursor& position() const { return cursor_; }
  const packing_stats& stats() const { return stats_; }
  const packer_options& options() const { return opts_; }
  const std::vector<int64_t>& order() const { return order_; }

  /// How many batches next() would still return, planned from the sample
  /// lengths without copying a token; the packer is at the end afterwards.
  int64_t count_rest();

private:
  /// One document placed in a row.
  struct doc {
    int64_t id;
    int64_t length;  ///< after truncation
  };
  /// Plans the next batch from the window (first fit, lengths only) and
  /// takes its samples off the window; false when nothing is pending.
  bool place(std::vector<std::vector<doc>>& row_docs, int64_t& truncated_samples, int64_t& truncated_tokens);

  /// Appends the next unconsumed position to the window; false at the end.
  bool pull();
  cursor cursor_now() const;

  dataset ds_;
  std::vector<int64_t> order_;
  packer_options opts_;
  cursor cursor_;
  packing_stats stats_;
  std::vector<int64_t> window_;   ///< pending positions, ascending
  int64_t next_pos_ = 0;          ///< next position pull() looks at
  std::vector<int64_t> skip_;     ///< from.taken (ascending): consumed before we started
  size_t skip_next_ = 0;          ///< first entry of skip_ not yet passed by next_pos_
};

/// A packer over rank `rank` of `world`'s share of epoch `from.epoch`:
/// rank_order(epoch_order(ds.num_samples(), seed, from.epoch), rank, world).
packer make_epoch_packer(const dataset& ds, uint64_t seed, int64_t rank, int64_t world,
                         const packer_options& opts, cursor from = {});

/// Zero-copy CPU tensor views of one sample (int32 tokens, uint8 mask) over
/// the read-only shard mapping, which they keep alive. Never write to them.
struct sample_tensors {
  int64_t id = 0;
  at::Tensor tokens;     ///< [length] int32
  at::Tensor loss_mask;  ///< [length] uint8
};
sample_tensors tensors_of(const dataset& ds, int64_t id);

} // namespace tandem::gpu::data
