// `tandem eval`: real speculative decoding of held-out prompts with a target
// and a drafter (gpu/decode/eval.hpp): acceptance length τ, its histogram,
// and the speedup over target-only decoding, with the `dflash` package's
// definitions.  Prompts are rendered by the Python half of `tandem prepare`
// (--prompts-out), so they go through the same chat-template code as the
// training data.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "gpu/decode/eval.hpp"
#include "gpu/device/error.hpp"
#include "gpu/device/runtime.hpp"

namespace tandem::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;

int32_t parse_device(const std::string& s) {
  if (s == "cpu")
    return -1;
  if (s == "auto")
    return gpu::query_runtime().devices.empty() ? -1 : 0;
  if (s == "cuda")
    return 0;
  if (s.rfind("cuda:", 0) == 0) {
    try {
      size_t used = 0;
      const auto n = std::stoi(s.substr(5), &used);
      if (used == s.size() - 5 && n >= 0)
        return n;
    } catch (const std::exception&) {
    }
  }
  throw gpu::error(errc::bad_input, "--device '" + s + "' is not one of cpu, cuda, cuda:N, auto");
  return -1;
}

void read_prompt_file(const std::string& file, std::vector<std::vector<int64_t>>& prompts,
                      std::vector<int64_t>& stop_ids) {
  std::ifstream f(file);
  if (!f)
    throw gpu::error(errc::bad_input, "cannot read " + file);
  std::string line;
  int64_t n = 0;
  while (std::getline(f, line)) {
    ++n;
    const auto j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      throw gpu::error(errc::bad_input, file + ":" + std::to_string(n) + ": not a JSON object");
    try {
      if (n == 1)
        stop_ids = j.value("stop_ids", std::vector<int64_t>{});
      else
        prompts.push_back(j.at("ids").get<std::vector<int64_t>>());
    } catch (const json::exception& e) {
      throw gpu::error(errc::bad_input, file + ":" + std::to_string(n) + ": " + e.what());
    }
  }
}

void add_generation_eos(const std::string& target, std::vector<int64_t>& stop_ids) {
  std::ifstream f(fs::path(target) / "generation_config.json");
  if (!f)
    return;
  const auto j = json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.contains("eos_token_id"))
    return;
  std::vector<int64_t> eos;
  const auto& e = j["eos_token_id"];
  if (e.is_number_integer())
    eos.push_back(e.get<int64_t>());
  else if (e.is_array())
    for (const auto& x : e)
      if (x.is_number_integer())
        eos.push_back(x.get<int64_t>());
  for (auto id : eos)
    if (std::find(stop_ids.begin(), stop_ids.end(), id) == stop_ids.end())
      stop_ids.push_back(id);
}

namespace {

struct eval_args {
  std::string target, tokenizer, drafter, prompts, device = "auto", dtype = "auto";
  int64_t max_new_tokens = 256, limit = 0, block_size = 0, top_k = 0;
  double temperature = 0.0, top_p = 1.0;
  uint64_t seed = 0;
  bool last_turn = false, as_json = false, no_baseline = false, quiet = false, references = false;
  int64_t lookup_ngram = 3;
};

std::string percent(int64_t k, int64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", n ? 100.0 * static_cast<double>(k) / static_cast<double>(n) : 0.0);
  return buf;
}

void print_table(const gpu::eval_report& r, FILE* out) {
  std::fprintf(out, "tandem eval: %zu prompts, block size %lld, %s, at most %lld new tokens, %s %s\n",
               r.prompts.size(), static_cast<long long>(r.block_size),
               r.temperature > 0 ? ("temperature " + std::to_string(r.temperature)).c_str() : "greedy",
               static_cast<long long>(r.max_new_tokens), r.device.c_str(), r.dtype.c_str());
  std::fprintf(out, "  drafter     %s (%s%s)\n  target      %s\n", r.drafter.c_str(), r.drafter_kind.c_str(),
               r.drafter_step >= 0 ? (", step " + std::to_string(r.drafter_step)).c_str() : "",
               r.target.c_str());
  std::fprintf(out, "  tau         %.3f  (mean tokens per cycle over %lld cycles; per-prompt mean %.3f)\n",
               r.tau, static_cast<long long>(r.cycles), r.tau_prompt_mean);
  std::string hist;
  for (size_t k = 1; k < r.histogram.size(); ++k)
    if (r.histogram[k])
      hist += "  " + std::to_string(k) + ": " + percent(r.histogram[k], r.cycles);
  std::fprintf(out, "  histogram  %s\n", hist.c_str());
  std::fprintf(out, "  decode      speculative %.1f tok/s", r.spec_tokens_per_s);
  if (r.baseline_tokens_per_s > 0)
    std::fprintf(out, ", target only %.1f tok/s, speedup %.2fx", r.baseline_tokens_per_s, r.speedup);
  std::fprintf(out, "\n");
  if (r.lookup_tau >= 0)
    std::fprintf(out, "  references  untrained drafter tau %.3f; prompt lookup (n-grams <= %lld) tau %.3f, %.1f tok/s\n",
                 r.untrained_tau, static_cast<long long>(r.lookup_ngram), r.lookup_tau,
                 r.lookup_tokens_per_s);
  if (r.baseline_tokens_per_s > 0 && r.temperature <= 0)
    std::fprintf(out, "  lossless    %zu of %zu prompts token-for-token equal to target-only greedy decoding%s\n",
                 r.prompts.size() - static_cast<size_t>(r.differing_prompts), r.prompts.size(),
                 r.differing_prompts == 0 ? ""
                 : (" (" + std::to_string(r.near_tie_differences) + " of the "
                    + std::to_string(r.differing_prompts) + " differences at a near-tie, target logit gap <= "
                    + std::to_string(r.near_tie_margin).substr(0, 4) + ")").c_str());
}

int run_eval_command(const eval_args& a) {
  gpu::eval_options o;
  o.drafter = a.drafter;
  const auto loc = gpu::locate_drafter(a.drafter);
  if (!loc.skipped.empty())
    std::fprintf(stderr, "tandem eval: warning: using %s; newer checkpoints did not verify: %s\n", loc.dir.c_str(),
                 loc.skipped.c_str());
  o.target_dir = !a.target.empty() ? fs::path(a.target) : loc.target_dir;
  if (o.target_dir.empty())
    throw gpu::error(errc::bad_input, a.drafter + " is an export, which does not record its target: pass --target DIR");
  fs::path tokenizer = a.tokenizer.empty() ? o.target_dir : fs::path(a.tokenizer);
  if (!fs::exists(tokenizer / "tokenizer.json"))
    throw gpu::error(errc::bad_input, "no tokenizer.json in " + tokenizer.string()
                                             + (a.tokenizer.empty() ? " (the target folder): pass --tokenizer DIR" : " (--tokenizer)"));
  // Render the prompts with the target's chat template (tandem prepare --prompts-out).
  char tmpl[] = "/tmp/tandem-eval-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0)
    throw gpu::error(errc::bad_input, "cannot create a temporary file in /tmp");
  close(fd);
  const fs::path rendered = tmpl;
  std::vector<std::string> args{a.prompts, "--tokenizer", tokenizer.string(), "--prompts-out",
                                rendered.string(), "--quiet"};
  if (a.limit > 0)
    args.insert(args.end(), {"--limit", std::to_string(a.limit)});
  if (a.last_turn)
    args.push_back("--last-turn-only");
  const int rc = run_prepare(args);
  if (rc != 0) {
    fs::remove(rendered);
    std::fprintf(stderr, "tandem eval: rendering the prompts of %s failed (exit %d)\n", a.prompts.c_str(), rc);
    return rc == 2 ? 2 : 1;
  }
  read_prompt_file(rendered.string(), o.prompts, o.stop_ids);
  fs::remove(rendered);
  add_generation_eos(o.target_dir.string(), o.stop_ids);
  o.max_new_tokens = a.max_new_tokens;
  o.temperature = a.temperature;
  o.top_p = a.top_p;
  o.top_k = a.top_k;
  o.device = parse_device(a.device);
  o.dtype = a.dtype;
  o.block_size = a.block_size;
  o.baseline = !a.no_baseline;
  o.seed = a.seed;
  o.reference_drafters = a.references;
  o.lookup_ngram = a.lookup_ngram;
  const bool tty = isatty(STDERR_FILENO);
  size_t last_shown = 0;
  auto progress = [&](size_t done, size_t total) {
    if (a.quiet)
      return;
    if (tty) {
      const int width = 30, filled = static_cast<int>(width * done / total);
      std::fprintf(stderr, "\r  [%s%s] %zu/%zu prompts", std::string(filled, '#').c_str(),
                   std::string(width - filled, '.').c_str(), done, total);
      if (done == total)
        std::fprintf(stderr, "\n");
    } else if (done == total || done * 10 / total != last_shown * 10 / total) {
      std::fprintf(stderr, "  %zu/%zu prompts\n", done, total);
    }
    last_shown = done;
  };
  const auto report = gpu::run_eval(o, progress);
  print_table(report, a.as_json ? stderr : stdout);
  if (a.as_json)
    std::printf("%s\n", gpu::eval_json(report).c_str());
  return 0;
}

} // namespace

void add_eval(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<eval_args>();
  auto* cmd = app.add_subcommand(
    "eval", "Speculative decoding of held-out prompts with a target and a drafter: acceptance "
            "length tau, its histogram, and the speedup over target-only decoding");
  cmd->add_option("--drafter", a->drafter, "A drafter: `tandem export` folder, checkpoint, or run "
                                           "folder (its newest checkpoint)")->required();
  cmd->add_option("--prompts", a->prompts, "Conversations (JSONL in the formats tandem prepare "
                                           "reads); each is cut before its first assistant turn")
    ->required()->check(CLI::ExistingFile);
  cmd->add_option("--target", a->target, "The target (Hugging Face Qwen3 folder); default: the one "
                                         "the checkpoint was trained against")
    ->check(CLI::ExistingDirectory);
  cmd->add_option("--tokenizer", a->tokenizer, "Tokenizer folder (default: the target folder)")
    ->check(CLI::ExistingDirectory);
  cmd->add_option("--max-new-tokens", a->max_new_tokens, "New tokens per prompt at most")
    ->capture_default_str()->check(at_least_one);
  cmd->add_option("--temperature", a->temperature, "0: greedy (lossless, token for token); > 0: "
                                                   "speculative sampling (lossless in distribution)")
    ->capture_default_str()->check(non_negative);
  cmd->add_option("--top-p", a->top_p, "Nucleus sampling, in (0, 1]")->capture_default_str()
    ->check(top_p_range);
  cmd->add_option("--top-k", a->top_k, "Top-k sampling (0: off)")->capture_default_str()
    ->check(non_negative);
  cmd->add_option("--limit", a->limit, "At most this many prompts (0: all)")->capture_default_str()
    ->check(non_negative);
  cmd->add_flag("--last-turn", a->last_turn, "Cut each conversation before its last assistant "
                                             "turn instead of its first");
  cmd->add_option("--block-size", a->block_size, "Draft block size (0: the drafter's)")
    ->capture_default_str()->check(non_negative);
  cmd->add_option("--device", a->device, "cpu, cuda, cuda:N, or auto (cuda:0 when present)")
    ->capture_default_str();
  cmd->add_option("--dtype", a->dtype, "auto (bfloat16 on CUDA, float32 on the CPU), float32, "
                                       "bfloat16")->capture_default_str();
  cmd->add_option("--seed", a->seed, "Seed of the sampling generator")->capture_default_str()
    ->check(non_negative);
  cmd->add_flag("--no-baseline", a->no_baseline, "Skip target-only decoding (no speedup figure)");
  cmd->add_flag("--references", a->references, "Also measure tau of an untrained drafter of the "
                                                "same shape and of prompt lookup (n-gram) drafting");
  cmd->add_option("--lookup-ngram", a->lookup_ngram, "Prompt lookup's longest n-gram")
    ->capture_default_str()->check(at_least_one);
  cmd->add_flag("--json", a->as_json, "One JSON line on stdout (schema tandem.eval.v1, per-prompt "
                                      "figures included); the table goes to stderr");
  cmd->add_flag("--quiet", a->quiet, "No progress bar");
  cmd->callback([a, &exit_code] {
    try {
      exit_code = run_eval_command(*a);
    } catch (const gpu::error& e) {
      std::fprintf(stderr, "tandem eval: %s\n", unprefixed(e.what(), "tandem eval: ").c_str());
      // Bad input, and a device this host lacks (--device cuda:3): the command line's (2).
      exit_code = e.code() == errc::bad_input || e.code() == errc::device_unavailable ? 2 : 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem eval: %s\n", unprefixed(e.what(), "tandem eval: ").c_str());
      exit_code = 1;
    }
  });
}

} // namespace tandem::cli
