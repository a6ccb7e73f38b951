#pragma once
/// A prepared token dataset: `manifest.json` plus safetensors shards, as
/// docs/data.md specifies. Torch-free facade (actors may hold one).
///
/// Opening memory-maps every shard (zero-copy, through read_safetensors) and
/// checks the manifest against the shards' structure: formats, per-shard
/// counts against the tensors' shapes and the shards' `__metadata__`,
/// dtypes, offsets (0 at the start, non-decreasing, T at the end), and the
/// totals. That reads headers and offsets only, so opening a 10 GB data set
/// is quick. A truncated shard fails here (its tensors no longer fit the
/// file).
///
/// The bytes themselves are checked per shard by verify_shard(): the file's
/// sha256 against the manifest (a bit flipped after `prepare`), every token
/// id below the vocabulary, every loss-mask value 0 or 1, the supervised
/// count. The prefetch engine verifies each shard on a background thread
/// before that shard's first batch (docs/data.md states the cost per GB);
/// dataset_options does all of it at open instead, for tools and tests.
///
/// Every problem throws gpu::error(errc::bad_input) naming the file
/// (manifest.json or the shard) and the field or row, e.g.
/// ".../shard-00002.safetensors: offsets[18] = 80 < offsets[17] = 90".
///
/// A dataset is a cheap handle: copies share the (read-only) mappings, which
/// live until the last copy is gone. All const methods are thread-safe.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace tandem::gpu::data {

/// One entry of the manifest's `shards`.
struct shard_info {
  std::string file;          ///< name inside the dataset folder
  int64_t num_samples = 0;   ///< N
  int64_t num_tokens = 0;    ///< T
  int64_t num_supervised = 0;
  std::string sha256;        ///< of the whole file, lowercase hex
  int64_t first_sample = 0;  ///< global id of its sample 0 (sum of earlier shards' N)
};

/// The manifest's fields that the reader uses or reports.
struct manifest_info {
  std::string format;                ///< "tandem.dataset.v1"
  std::string created_by;
  std::string tokenizer_source;
  int64_t vocab_size = 0;            ///< tokenizer.vocab_size
  std::string tokenizer_sha256;
  std::string chat_template_sha256;
  /// The tokenizer's special token ids (tokenizer.eos_token_id,
  /// bos_token_id, pad_token_id; -1 = the tokenizer has none). Manifests
  /// written before `prepare` recorded them have none of the three keys:
  /// special_tokens_recorded is false.
  bool special_tokens_recorded = false;
  int64_t eos_token_id = -1;
  int64_t bos_token_id = -1;
  int64_t pad_token_id = -1;
  std::string options_json;          ///< `options`, as JSON text ("{}" if absent)
  std::string report_json;           ///< `report`, as JSON text ("{}" if absent)
  std::vector<shard_info> shards;
  int64_t total_samples = 0;
  int64_t total_tokens = 0;
  int64_t total_supervised = 0;
  std::string content_hash;          ///< "" if absent
};

struct dataset_options {
  /// At open: recompute every shard's sha256 (and `content_hash`, when
  /// present) and compare with the manifest: reads every byte once
  /// (`--verify`).
  bool verify_hashes = false;
  /// At open: scan every token id (below `tokenizer.vocab_size`) and
  /// loss-mask value. Off by default: it reads every token before the first
  /// batch; the prefetch engine checks each shard with verify_shard() in the
  /// background instead.
  bool check_values = false;
};

/// What verify_shard() checks besides the file's sha256.
struct shard_check {
  /// Check the file's bytes against the manifest's sha256.
  bool sha256 = true;
  /// Token ids must also be below this (the target's embedding rows;
  /// 0 = only `tokenizer.vocab_size`).
  int64_t vocab_size = 0;
  /// Where `vocab_size` comes from, for messages ("vocab_size of
  /// /models/q/config.json").
  std::string vocab_source;
  /// A token id that must not occur (drafter.mask_token_id; −1: none) and
  /// its name for messages.
  int64_t forbidden_token = -1;
  std::string forbidden_source;
};

/// Sample `id`, pointing into the shard's mapping: valid while any copy of
/// the dataset that produced it lives.
struct sample_view {
  int64_t id = 0;                       ///< global sample id
  int64_t length = 0;                   ///< tokens
  const int32_t* tokens = nullptr;      ///< [length]
  const uint8_t* loss_mask = nullptr;   ///< [length], 0 or 1
};

class dataset {
public:
  /// Opens and checks the dataset in `dir` (a folder, or its manifest.json);
  /// throws gpu::error(bad_input).
  explicit dataset(const std::filesystem::path& dir, const dataset_options& opts = {});

  const std::filesystem::path& dir() const;
  const manifest_info& manifest() const;

  int64_t num_samples() const;
  int64_t num_tokens() const;
  int64_t vocab_size() const;
  /// The longest sample's length.
  int64_t max_sample_length() const;

  /// Sample `id`, 0 ≤ id < num_samples() (throws bad_input otherwise).
  sample_view sample(int64_t id) const;
  /// Its length alone (the packer's hot path; same bounds check).
  int64_t sample_length(int64_t id) const;

  /// Which shard holds `id`, and the sample's index inside it.
  std::pair<size_t, int64_t> locate(int64_t id) const;

  /// Shards (manifest().shards, in order) and the path of shard `index`.
  size_t num_shards() const;
  std::filesystem::path shard_path(size_t index) const;

  /// Reads shard `index` whole and checks its bytes: the file's sha256
  /// against the manifest's (when `check.sha256` and the manifest records
  /// one: an empty sha256, as hand-written test data sets have, is skipped;
  /// the prefetch engine warns about it), then every token id
  /// below tokenizer.vocab_size and check.vocab_size, every loss-mask value
  /// 0 or 1, and the supervised count. Throws gpu::error(bad_input) naming
  /// the shard file and the field: "sha256 is <actual> but manifest.json
  /// shards[2].sha256 = '<expected>'", or the token's position, its sample
  /// and the vocabulary size. Thread-safe (const; reads the file and the
  /// read-only mapping).
  void verify_shard(size_t index, const shard_check& check = {}) const;
  /// Throws gpu::error(bad_input) naming the file when shard `index` was
  /// written in place since it was opened (same file, another size or
  /// modification time): its mapping then shows bytes nobody checked.  A
  /// shard removed or replaced by a new file is no error (the mapping keeps
  /// the old bytes).  A stat() per call: meant for once per batch.
  void check_unchanged(size_t index) const;

private:
  struct impl;
  std::shared_ptr<const impl> impl_;
};

/// Parses and checks `manifest.json` alone (no shard opened): `path` is the
/// data set's folder or its manifest. Throws gpu::error(bad_input).
manifest_info read_manifest(const std::filesystem::path& path);

/// The name of shard `index` as `tandem prepare` writes it: "shard-00002.safetensors".
std::string shard_file_name(int64_t index);

} // namespace tandem::gpu::data
