#pragma once
/// Does a prepared data set belong to this target?  The manifest records the
/// tokenizer that made the shards (docs/data.md): its vocabulary size and,
/// since issue 19, its special token ids.  A data set tokenized for another
/// model trains a drafter on ids that mean something else, or on ids past
/// the target's embedding (a device-side assert on the GPU, no message), so
/// a mismatch stops the run before any batch.

#include <filesystem>
#include <string>
#include <vector>

#include "gpu/data/dataset.hpp"
#include "gpu/io/model_tokens.hpp"

namespace tandem::gpu::data {

/// Checks `m` (read from `manifest_file`) against the target's config.json:
///   - tokenizer.vocab_size must not exceed the target's vocab_size (the
///     embedding's rows; Qwen3 pads them past the tokenizer's length, so
///     fewer is fine);
///   - tokenizer.eos_token_id must be one of the target's eos_token_id(s),
///     and bos_token_id equal the target's, each compared only where both
///     sides state one (Qwen3's tokenizer has no bos token while its config
///     names one; pad_token_id is recorded but not compared: padding is
///     never trained on).
/// Throws gpu::error(bad_input) naming the manifest, the field, both values
/// and the target's config.json.  Returns warnings (a manifest written
/// before `prepare` recorded special tokens: only the vocabulary is checked).
std::vector<std::string> check_tokenizer_identity(const manifest_info& m,
                                                  const std::filesystem::path& manifest_file,
                                                  const model_tokens& target);

} // namespace tandem::gpu::data
