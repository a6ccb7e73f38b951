#include "gpu/data/identity.hpp"

#include <algorithm>

#include "gpu/device/error.hpp"

namespace tandem::gpu::data {

namespace {

std::string id_text(int64_t id) {
  return id < 0 ? std::string("null") : std::to_string(id);
}

std::string ids_text(const std::vector<int64_t>& ids) {
  if (ids.size() == 1)
    return std::to_string(ids[0]);
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i)
    s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

} // namespace

std::vector<std::string> check_tokenizer_identity(const manifest_info& m,
                                                  const std::filesystem::path& manifest_file,
                                                  const model_tokens& target) {
  const std::string manifest = manifest_file.string();
  const std::string config = target.file.empty() ? std::string("the target's config.json")
                                                 : target.file.string();
  auto mismatch = [&](const std::string& field, const std::string& ours,
                      const std::string& target_field, const std::string& theirs,
                      const std::string& why) {
    throw error(errc::bad_input, manifest + ": tokenizer." + field + " = " + ours + " but "
                                   + config + " has " + target_field + " = " + theirs + ": "
                                   + why);
  };
  const std::string other = "the data set was tokenized for another model (prepare it with "
                            "the target's tokenizer: data.tokenizer, or `tandem prepare "
                            "--tokenizer`)";
  if (m.vocab_size > target.vocab_size)
    mismatch("vocab_size", std::to_string(m.vocab_size), "vocab_size",
             std::to_string(target.vocab_size),
             "token ids up to " + std::to_string(m.vocab_size - 1)
               + " would index past the target's embedding; " + other);
  std::vector<std::string> warnings;
  if (!m.special_tokens_recorded) {
    warnings.push_back(manifest + ": the manifest records no special token ids (tokenizer."
                       "eos_token_id, bos_token_id, pad_token_id; prepared before Tandem "
                       "recorded them): only tokenizer.vocab_size = "
                       + std::to_string(m.vocab_size) + " is checked against " + config
                       + " (prepare the data again to check the tokenizer fully)");
    return warnings;
  }
  if (m.eos_token_id >= 0 && !target.eos_token_ids.empty()
      && std::find(target.eos_token_ids.begin(), target.eos_token_ids.end(), m.eos_token_id)
           == target.eos_token_ids.end())
    mismatch("eos_token_id", id_text(m.eos_token_id), "eos_token_id",
             ids_text(target.eos_token_ids), other);
  if (m.bos_token_id >= 0 && target.bos_token_id >= 0 && m.bos_token_id != target.bos_token_id)
    mismatch("bos_token_id", id_text(m.bos_token_id), "bos_token_id",
             id_text(target.bos_token_id), other);
  return warnings;
}

} // namespace tandem::gpu::data
