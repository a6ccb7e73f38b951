#pragma once
/// The data path's benchmark case and a synthetic dataset writer.
/// Torch-free and JSON-library-free facade (tools/ may include it).

#include <cstdint>
#include <filesystem>
#include <string>

namespace tandem::gpu::data {

/// What write_synthetic_dataset writes.
struct synthetic_spec {
  int64_t samples = 20000;
  int64_t min_length = 200;     ///< sample lengths uniform in [min_length, max_length]
  int64_t max_length = 3000;
  int64_t vocab_size = 151936;  ///< Qwen3's
  int64_t shards = 4;           ///< samples split evenly (the last takes the rest)
  uint64_t seed = 1;
};

/// Writes a valid dataset (manifest.json with sha256 values and content_hash,
/// shards by save_safetensors) of random tokens into `dir` (created if
/// needed). Each sample's first third is prompt (loss_mask 0), the rest
/// supervised (1). Deterministic given `spec`.
void write_synthetic_dataset(const std::filesystem::path& dir, const synthetic_spec& spec = {});

/// Benchmark case "prefetch_pack": on one thread, for about `seconds`,
/// repeats epochs of epoch_order + packing into `rows × seq_len` batches
/// (max_docs 16, look-ahead 16) in pinned memory when CUDA is available.
/// Uses the dataset in `dataset_dir`, or a synthetic one (20k samples of
/// 200–3000 tokens) in a temporary folder when it is empty. Returns one JSON
/// line: schema 1, case, rows, seq_len, samples_per_s, tokens_per_s (real
/// tokens), padding_waste, per-batch median_ms / mad_ms, and the rest
/// documented in the returned object's field names.
std::string bench_prefetch_json(const std::filesystem::path& dataset_dir, int64_t rows,
                                int64_t seq_len, double seconds);

} // namespace tandem::gpu::data
