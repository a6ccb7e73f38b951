#pragma once
/// Speculative decoding with a DFlash drafter (DFLASH.md, "Inference and τ"),
/// with the bookkeeping of the `dflash` package's `dflash_generate`
/// (dflash/model.py), which tests/decode/ checks token for token:
///
///   prefill: the target runs the prompt; its last logits give the first new
///     token, its taps the drafter's first context.
///   cycle:   T = min(Bs, max_length − start) where `start` is the position
///     of the last committed token; the drafter drafts block positions
///     1 … T−1 after [last token, MASK × (T−1)] (a shorter block near the
///     end: the tail path); the target verifies the block in one forward;
///     `accepted` = the run of leading drafts equal to the target's
///     choice one position earlier (greedy), or accepted by rejection
///     sampling (temperature > 0: draft k kept with probability
///     min(1, p/q), the first rejection resampled from (p − q)+);
///     produced = min(accepted + 1, max_length − start − 1), cut after the
///     first stop token; both caches keep the committed positions only.
///   τ = mean of `produced` over cycles.
/// Block size 1 is plain target decoding through the same loop (the
/// baseline of the speedup).

#include <cstdint>
#include <string>
#include <vector>

#include "gpu/decode/decoder.hpp"

namespace tandem::gpu {

struct sampling_options {
  double temperature = 0.0;  ///< 0: greedy (argmax)
  double top_p = 1.0;        ///< (0, 1]
  int64_t top_k = 0;         ///< 0: the whole vocabulary
};

/// A deliberate bug, for the tests that must catch it (TANDEM_TEST_PLANT in
/// the environment: "always_accept" or "shifted_drafts"; none otherwise).
enum class planted_bug { none, always_accept, shifted_drafts };
planted_bug planted_bug_from_env();

struct speculative_options {
  int64_t max_new_tokens = 256;
  std::vector<int64_t> stop_ids;  ///< generation ends after the first of these
  sampling_options sampling;
  int64_t block_size = 16;        ///< 1: target-only decoding (no drafter)
  /// > 0 and no drafter: prompt lookup instead (the n-gram baseline): the
  /// longest suffix of the sequence so far, of at most this many tokens,
  /// that occurred earlier proposes the tokens that followed its latest
  /// earlier occurrence (up to block_size − 1 of them); a cycle with no
  /// match decodes one token.
  int64_t lookup_ngram = 0;
  planted_bug bug = planted_bug::none;
};

struct generation {
  std::vector<int64_t> tokens;    ///< the new tokens, the prefill's first included
  std::vector<int64_t> produced;  ///< per cycle (the prefill's token is no cycle's)
  double prefill_s = 0.0;         ///< time to the first token
  double decode_s = 0.0;          ///< the cycles' time
};

/// One prompt (row 0 of both decoders, which are reset first).  `drafter`
/// may be null when block_size is 1 or with lookup_ngram.  `gen` draws the samples (on the
/// target's device).  Timings synchronise the device.
generation speculative_generate(target_decoder& target, drafter_decoder* drafter,
                                const std::vector<int64_t>& prompt,
                                const speculative_options& opts, at::Generator& gen);

/// Target-only decoding of up to target.batch() prompts at once (the
/// regeneration of responses): rows are padded on the right, and each ends
/// after its first stop token or max_new_tokens (o.block_size is ignored).
/// Returns one generation per prompt (produced stays empty; the timings are
/// the batch's).
std::vector<generation> target_generate(target_decoder& target,
                                        const std::vector<std::vector<int64_t>>& prompts,
                                        const speculative_options& o, at::Generator& gen);

/// Probabilities for sampling at `s` from logits [..., V] (float32):
/// temperature, then top-k, then top-p, as the dflash package's
/// _sampling_probs.
at::Tensor sampling_probs(const at::Tensor& logits, const sampling_options& s);

} // namespace tandem::gpu
