#pragma once
/// The prefetch actor's engine: reads its rank's share of a dataset in the
/// epoch's seeded order, packs static-shape batches, stages them onto the
/// device and publishes them for the target (gpu/transport/transport.hpp).
/// Torch-free facade (actors/prefetch.cpp includes it).
///
/// Bad data never reaches the device.  At construction the manifest's
/// tokenizer is checked against the target's config.json (vocabulary size,
/// special tokens: gpu/data/identity.hpp).  Then a background thread
/// verifies every shard's bytes (sha256 against the manifest, every token
/// id below the target's vocabulary, loss-mask values), in the order the
/// epoch first needs them, while the target and drafters load and train;
/// next() publishes a batch only once every shard it draws from is
/// verified, waiting if it must, and throws the first failure of any shard
/// (gpu::error(bad_input) naming the shard file and the field).  Cost:
/// docs/data.md ("Verification").

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "gpu/transport/transport.hpp"

namespace tandem::gpu {

struct prefetch_engine_options {
  std::filesystem::path dataset;  ///< a folder written by `tandem prepare`
  int32_t device = -1;            ///< CUDA ordinal; −1 = CPU
  int64_t rows = 1, seq_len = 3072, max_docs = 16, lookahead = 16;
  uint64_t seed = 0;
  int32_t rank = 0, world = 1;    ///< this prefetch's share of every epoch
  /// The target's folder (model.target): the manifest's tokenizer is
  /// checked against its config.json and every token id against its
  /// vocab_size.  "" = the manifest's own vocab_size only (tests).
  std::filesystem::path target;
  /// drafter.mask_token_id: the shard verification fails on a token equal
  /// to it (the drafter could not tell data from its mask).  −1: unchecked.
  int64_t mask_token_id = -1;
  /// Verify each shard (sha256, values) in the background before its first
  /// batch.  False only where the bytes were just written (tests, benches).
  bool verify_shards = true;
  /// Verify every shard at construction instead, before the first batch.
  bool verify_hashes = false;
};

/// What the shard verification has done so far.
struct verify_stats {
  int64_t shards = 0;        ///< in the data set
  int64_t verified = 0;      ///< passed
  int64_t bytes = 0;         ///< of the verified shards' files
  double seconds = 0;        ///< the verifier thread's time on them
  double waited_s = 0;       ///< next() blocked for unverified shards
};

/// One staged batch: the payload {tokens, loss_mask, doc_lengths} is
/// behind `handle`, owned by the engine until released.
struct staged_batch {
  transport::handle handle = 0;
  std::vector<int64_t> sample_ids;
  int64_t rows = 0, seq_len = 0, real_tokens = 0, padding_tokens = 0;
};

class prefetch_engine {
public:
  /// Opens and checks the dataset (throws gpu::error(bad_input) naming the
  /// file), on the calling thread.
  explicit prefetch_engine(const prefetch_engine_options& opts);
  ~prefetch_engine();
  prefetch_engine(prefetch_engine&&) noexcept;
  prefetch_engine& operator=(prefetch_engine&&) noexcept;

  /// Samples in the whole dataset.
  int64_t dataset_samples() const;

  /// Starts `epoch`: this rank's order, minus the samples in `done` (already
  /// committed, on a resumed run; trained into the restore point, after a
  /// rollback).  Drops the re-issue queue.
  void start_epoch(int64_t epoch, const std::unordered_set<int64_t>& done = {});

  /// Samples to pack before anything else (re-issued after a rollback).
  void reissue(const std::vector<int64_t>& sample_ids);

  /// Packs and stages the next batch; nullopt when the epoch (and the
  /// re-issue queue) is exhausted.
  std::optional<staged_batch> next();

  /// The consumer is done with a batch: drop the payload.
  void release(transport::handle h);

  /// Samples in the current epoch's order for this rank (those already
  /// done at start_epoch left out): what the epoch packs, re-issues aside.
  int64_t epoch_samples() const;

  /// Fraction of batch tokens that were padding so far.
  double padding_waste() const;

  /// Warnings from construction (an old manifest without special tokens).
  const std::vector<std::string>& warnings() const;

  /// The shard verification's progress.
  verify_stats verification() const;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace tandem::gpu
