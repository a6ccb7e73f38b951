#pragma once
/// A prepared token dataset: `manifest.json` plus safetensors shards, as
/// docs/data.md specifies. Torch-free facade (actors may hold one).
///
/// Opening memory-maps every shard (zero-copy, through read_safetensors) and
/// checks the manifest against the shards: formats, per-shard counts against
/// the tensors' shapes and the shards' `__metadata__`, dtypes, offsets (0 at
/// the start, non-decreasing, T at the end), every token id below
/// `tokenizer.vocab_size`, every loss-mask value 0 or 1, supervised counts,
/// and the totals. Every problem throws gpu::error(errc::bad_input) naming
/// the file (manifest.json or the shard) and the field or row, e.g.
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
  std::string options_json;          ///< `options`, as JSON text ("{}" if absent)
  std::string report_json;           ///< `report`, as JSON text ("{}" if absent)
  std::vector<shard_info> shards;
  int64_t total_samples = 0;
  int64_t total_tokens = 0;
  int64_t total_supervised = 0;
  std::string content_hash;          ///< "" if absent
};

struct dataset_options {
  /// Recompute every shard's sha256 (and `content_hash`, when present) and
  /// compare with the manifest: reads every byte once (`--verify`).
  bool verify_hashes = false;
  /// Scan every token id and loss-mask value (on by default; the scan is
  /// sequential and costs far less than a training step per shard).
  bool check_values = true;
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

private:
  struct impl;
  std::shared_ptr<const impl> impl_;
};

/// The name of shard `index` as `tandem prepare` writes it: "shard-00002.safetensors".
std::string shard_file_name(int64_t index);

} // namespace tandem::gpu::data
