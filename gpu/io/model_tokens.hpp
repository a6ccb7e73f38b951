#pragma once
/// What a Hugging Face config.json says about a model's tokens: the
/// embedding's rows and the special token ids.  Compared with the data
/// set's tokenizer before training (gpu/data/identity.hpp).  A header of its
/// own, beside hf_config.hpp, so that the models do not depend on it.

#include <cstdint>
#include <filesystem>
#include <vector>

namespace tandem::gpu {

struct model_tokens {
  std::filesystem::path file;          ///< the config.json read (for messages)
  int64_t vocab_size = 0;              ///< the embedding's rows
  std::vector<int64_t> eos_token_ids;  ///< `eos_token_id`: one id or a list; empty = none
  int64_t bos_token_id = -1;           ///< −1 = none (absent or null)
  int64_t pad_token_id = -1;
};

/// Reads `path` (config.json, or the directory holding it).  Throws
/// gpu::error(bad_input) naming the file and the field: vocab_size missing
/// or not a positive integer, a special token id that is not an integer.
/// The ids are taken as stated (not range-checked: the model never uses
/// them, and a config with an odd one must still load).
model_tokens load_model_tokens(const std::filesystem::path& path);

} // namespace tandem::gpu
