#pragma once
/// `tandem eval` and `tandem export` behind a torch-free facade (tools/ and
/// actors/ include this; the work is in gpu/decode/, speculative.hpp).
///
/// A drafter is named by a folder of one of three kinds:
///   export      a z-lab DFlash folder (config.json with dflash_config + model.safetensors)
///   checkpoint  a Tandem checkpoint (state.json + weights.safetensors; its
///               state records the target it was trained against)
///   run         a run folder (config.toml + checkpoints/): its newest
///               checkpoint that verifies

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu/transport/transport.hpp"

namespace tandem::gpu {

struct drafter_location {
  std::string kind;                  ///< "export", "checkpoint"
  std::filesystem::path dir;         ///< the export or checkpoint folder
  std::filesystem::path target_dir;  ///< recorded at training; empty for an export
  int64_t step = -1;                 ///< the checkpoint's step (−1 for an export)
  /// A run folder's newer checkpoints that did not verify (why), skipped
  /// for this one: the commands warn about them.
  std::string skipped;
};

/// Sampling options: a finite temperature >= 0, top_p in (0, 1], top_k >= 0.
/// Throws gpu::error(bad_input) naming the one at fault, after `who`.
void check_sampling(double temperature, double top_p, int64_t top_k, const char* who);

/// Resolves `path` (export, checkpoint or run folder).  Throws
/// gpu::error(bad_input) naming the path and what it lacks.
drafter_location locate_drafter(const std::filesystem::path& path);

struct eval_options {
  std::filesystem::path target_dir;
  std::filesystem::path drafter;           ///< export, checkpoint or run folder
  std::vector<std::vector<int64_t>> prompts;  ///< token ids, rendered with the chat template
  std::vector<int64_t> stop_ids;           ///< EOS / end-of-turn ids
  int64_t max_new_tokens = 256;
  double temperature = 0.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  int32_t device = -1;                     ///< −1: the CPU; n: CUDA device n
  std::string dtype = "auto";              ///< auto: bfloat16 on CUDA, float32 on the CPU
  int64_t block_size = 0;                  ///< 0: the drafter's
  bool baseline = true;                    ///< also decode with block size 1 (the speedup)
  /// Also measure τ of two reference drafters on the same prompts: an
  /// untrained drafter of the same shape (the engine's initialisation) and
  /// prompt lookup with n-grams of up to `lookup_ngram` tokens.
  bool reference_drafters = false;
  int64_t lookup_ngram = 3;
  uint64_t seed = 0;
};

struct eval_prompt {
  int64_t prompt_tokens = 0;
  std::vector<int64_t> tokens;    ///< speculative decoding's new tokens
  std::vector<int64_t> produced;  ///< per cycle
  double tau = 0.0;               ///< mean of produced (0 when no cycle ran)
  double prefill_s = 0.0, decode_s = 0.0;
  double baseline_decode_s = 0.0;
  int64_t baseline_tokens = 0;
  /// Greedy only: the first index where the baseline's tokens differ (−1:
  /// identical).  Exact in float32; in bfloat16 a near-tie of the target's
  /// top two logits may resolve differently in a block and one at a time.
  int64_t first_difference = -1;
  /// There: the target's logit gap between the baseline's token and the
  /// speculative one, from a prefill of the prompt and the baseline's
  /// tokens before it (0 when identical).
  double difference_margin = 0.0;
};

struct eval_report {
  std::string target, drafter, drafter_kind, device, dtype;
  int64_t drafter_step = -1, block_size = 0, max_new_tokens = 0;
  double temperature = 0.0, top_p = 1.0;
  int64_t top_k = 0;
  std::vector<eval_prompt> prompts;
  double tau = 0.0;              ///< mean of produced over all cycles
  double tau_prompt_mean = 0.0;  ///< mean over prompts of per-prompt τ
  std::vector<int64_t> histogram;  ///< histogram[k]: cycles that produced k (k = 0 unused)
  int64_t cycles = 0, new_tokens = 0;
  double spec_tokens_per_s = 0.0;      ///< decode tokens (after the first) per second
  double baseline_tokens_per_s = 0.0;  ///< target-only decoding, same loop, block size 1
  bool baseline = false;               ///< the baseline ran (else its fields are null in the JSON)
  double speedup = 0.0;                ///< baseline time per token / speculative's
  int64_t differing_prompts = 0;       ///< greedy: prompts whose tokens differ from the baseline's
  /// Of those, the ones whose first difference is a near-tie: a logit gap
  /// ≤ near_tie_margin (bfloat16 rounding in a block of 16 and one token at
  /// a time may pick either).  In float32 every difference is a failure.
  int64_t near_tie_differences = 0;
  double near_tie_margin = 0.0;
  /// With reference_drafters (else −1): τ (mean over cycles) of an
  /// untrained drafter and of prompt lookup, and their decode tokens/s.
  double untrained_tau = -1.0, lookup_tau = -1.0;
  double untrained_tokens_per_s = 0.0, lookup_tokens_per_s = 0.0;
  int64_t lookup_ngram = 0;
};

/// Runs speculative decoding (and the baseline) over every prompt, one at a
/// time; `progress(done, total)` after each.  Throws gpu::error naming the
/// file or option at fault.
eval_report run_eval(const eval_options& o,
                     const std::function<void(size_t, size_t)>& progress = {});

/// The report as one JSON line (schema "tandem.eval.v1"), per-prompt figures included.
std::string eval_json(const eval_report& r);

/// Real τ during training (the eval actor's engine, config [eval]): the
/// target, loaded once (at the first evaluation: the snapshot says which
/// layers to tap), and held-out prompts; each evaluation takes the weights
/// of a drafter snapshot (drafter_engine::snapshot) and decodes one prompt
/// per call to next(), so that its actor serves its mailbox between
/// prompts.  No baseline, no references: τ, its histogram, tokens/s.  All
/// calls on one thread (it owns the device work).
struct eval_engine_options {
  std::filesystem::path target_dir;
  std::vector<std::vector<int64_t>> prompts;  ///< token ids, rendered with the chat template
  std::vector<int64_t> stop_ids;
  int64_t max_new_tokens = 128;
  double temperature = 0.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  int32_t device = -1;                        ///< −1: the CPU; n: CUDA device n
  std::string dtype = "auto";
  uint64_t seed = 0;
};

class eval_engine {
public:
  /// Checks the options and the target's config (not its weights yet).
  /// Throws gpu::error(bad_input) naming what is wrong.
  explicit eval_engine(eval_engine_options o);
  ~eval_engine();
  eval_engine(const eval_engine&) = delete;
  eval_engine& operator=(const eval_engine&) = delete;

  /// Starts an evaluation of snapshot `snap`'s weights (copied: the caller
  /// may release the handle once this returns).  Throws gpu::error
  /// (bad_input: not a snapshot of a drafter that fits the target).
  void begin(transport::handle snap);
  /// Decodes the next prompt; true while prompts remain after it.
  bool next();
  size_t done() const;
  size_t total() const;
  /// The evaluation begun last (drafter_step: the snapshot's step).
  eval_report report() const;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

struct generate_options {
  std::filesystem::path target_dir;
  std::vector<std::vector<int64_t>> prompts;  ///< token ids
  std::vector<int64_t> stop_ids;
  int64_t max_new_tokens = 1024;
  double temperature = 0.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  int32_t device = -1;                        ///< −1: the CPU; n: CUDA device n
  std::string dtype = "auto";
  int64_t batch = 16;                         ///< prompts decoded together
  uint64_t seed = 0;
};

/// Target-only decoding of every prompt (regeneration of responses), in
/// batches of prompts of similar length.  `done(i, tokens, hit_limit)` is
/// called for prompt i as soon as its batch ends (tokens include the stop
/// token when one ended it).  `skip(i)`, when given, leaves prompt i out (it
/// was done before an interruption).  Returns the decoding seconds.
double generate(const generate_options& o,
                const std::function<void(size_t, const std::vector<int64_t>&, bool)>& done,
                const std::function<bool(size_t)>& skip = {});

struct export_options {
  std::filesystem::path source;  ///< checkpoint, run or export folder
  std::filesystem::path out;
  std::filesystem::path target;  ///< empty: the one recorded in the checkpoint
  std::string dtype = "bfloat16";
};

struct export_result {
  drafter_location from;
  std::filesystem::path target_dir;
  int64_t parameters = 0;
  int64_t block_size = 0, layers = 0;
  std::vector<int64_t> target_layer_ids;
  int64_t mask_token_id = -1;
};

/// Writes the z-lab layout of the drafter into `out` (config.json +
/// model.safetensors).  Refuses a target whose hidden size, layer count or
/// vocabulary differ from the checkpoint's, naming both.
export_result export_drafter(const export_options& o);

} // namespace tandem::gpu
