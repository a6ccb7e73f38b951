// `tandem export`: a drafter checkpoint (or a run's newest) → the z-lab DFlash
// layout that SGLang, vLLM and the `dflash` package load (config.json with
// dflash_config, model.safetensors in bf16), plus a short model card.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "build_info.hpp"
#include "commands.hpp"
#include "gpu/decode/eval.hpp"
#include "gpu/device/error.hpp"

namespace tandem::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

/// The run folder a checkpoint belongs to (RUN/checkpoints/step-k), or empty.
fs::path run_of(const gpu::drafter_location& loc) {
  if (loc.kind != "checkpoint")
    return {};
  const auto run = loc.dir.parent_path().parent_path();
  return fs::exists(run / "config.toml") ? run : fs::path();
}

/// `key = ...` of the run's config.toml (the line as written), or "".
std::string config_line(const fs::path& run, const std::string& key) {
  std::ifstream f(run / "config.toml");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key + " =", 0) == 0)
      return line.substr(key.size() + 3);
  return "";
}

/// The newest τ the run measured (metrics.jsonl "eval" events), or null.
json last_eval(const fs::path& run) {
  std::ifstream f(run / "metrics.jsonl");
  std::string line;
  json found;
  while (std::getline(f, line)) {
    if (line.find("\"eval\"") == std::string::npos)
      continue;
    auto j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("event", "") == "eval" && j.contains("tau") && !j.contains("error"))
      found = j;
  }
  return found;
}

void write_card(const fs::path& out, const gpu::export_result& r) {
  const auto run = run_of(r.from);
  std::ostringstream s;
  s << "# DFlash drafter\n\n"
    << "A DFlash block-diffusion drafter (block size " << r.block_size << ", " << r.layers
    << " layers, " << r.parameters << " parameters) for speculative decoding with the target below, "
    << "trained and exported by Tandem " << build::version << " (" << build::git_commit << ").\n\n"
    << "| field | value |\n| --- | --- |\n"
    << "| target | `" << r.target_dir.string() << "` |\n"
    << "| target layers tapped | ";
  for (size_t i = 0; i < r.target_layer_ids.size(); ++i)
    s << (i ? ", " : "") << r.target_layer_ids[i];
  s << " |\n| mask token id | " << r.mask_token_id << " |\n"
    << "| exported from | `" << r.from.dir.string() << "` (" << r.from.kind << ") |\n";
  if (r.from.step >= 0)
    s << "| training steps | " << r.from.step << " |\n";
  if (!run.empty()) {
    const auto sources = config_line(run, "sources");
    const auto data = config_line(run, "dataset");
    if (!sources.empty())
      s << "| data (sources) | `" << sources << "` |\n";
    if (!data.empty())
      s << "| data (prepared) | `" << data << "` |\n";
  }
  const auto ev = run.empty() ? json() : last_eval(run);
  if (ev.is_object())
    s << "| tau measured | " << ev["tau"].dump() << " at step " << ev.value("step", -1)
      << " (speculative decoding on held-out prompts during training) |\n";
  else
    s << "| tau measured | not measured in the run; `tandem eval --drafter " << out.string()
      << " --target TARGET --prompts FILE` measures it |\n";
  s << "\nLoad it with the `dflash` package (`DFlashDraftModel.from_pretrained`), SGLang or vLLM "
       "as a DFlash draft model next to the target named above.\n";
  std::ofstream f(out / "README.md");
  f << s.str();
  if (!f)
    throw gpu::error(errc::bad_input, "cannot write " + (out / "README.md").string());
}

} // namespace

void add_export(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<gpu::export_options>();
  auto* cmd = app.add_subcommand(
    "export", "Write a drafter checkpoint (or a run's newest) in the z-lab DFlash layout that "
              "SGLang, vLLM and the dflash package load, with a model card");
  cmd->add_option("source", o->source, "Checkpoint folder, or run folder (its newest checkpoint "
                                       "that verifies)")->required();
  cmd->add_option("--out", o->out, "Output folder (config.json, model.safetensors, README.md)")->required();
  cmd->add_option("--target", o->target, "The target (default: the one the checkpoint was trained "
                                         "against); refused when its shape differs")
    ->check(CLI::ExistingDirectory);
  cmd->add_option("--dtype", o->dtype, "bfloat16, float16 or float32")->capture_default_str();
  auto overwrite = std::make_shared<bool>(false);
  cmd->add_flag("--overwrite", *overwrite, "Write into an --out folder that is not empty (its config.json, "
                                           "model.safetensors and README.md are replaced)");
  cmd->callback([o, overwrite, &exit_code] {
    try {
      std::error_code ec;
      if (!*overwrite && fs::is_directory(o->out, ec) && !fs::is_empty(o->out, ec))
        throw gpu::error(errc::bad_input, "--out " + o->out.string() + " is not empty (a model, a checkpoint, "
                                          "an earlier export?); choose an empty or new folder, or pass --overwrite");
      if (fs::exists(o->out, ec) && !fs::is_directory(o->out, ec))
        throw gpu::error(errc::bad_input, "--out " + o->out.string() + " exists and is not a folder");
      const auto r = gpu::export_drafter(*o);
      if (!r.from.skipped.empty())
        std::fprintf(stderr, "tandem export: warning: exported %s; newer checkpoints did not verify: %s\n",
                     r.from.dir.c_str(), r.from.skipped.c_str());
      write_card(o->out, r);
      std::printf("tandem export: %s (%s%s) -> %s: %lld parameters, block size %lld, %lld layers, "
                  "target %s\n",
                  r.from.dir.c_str(), r.from.kind.c_str(),
                  r.from.step >= 0 ? (", step " + std::to_string(r.from.step)).c_str() : "",
                  o->out.c_str(), static_cast<long long>(r.parameters),
                  static_cast<long long>(r.block_size), static_cast<long long>(r.layers),
                  r.target_dir.c_str());
      exit_code = 0;
    } catch (const gpu::error& e) {
      std::fprintf(stderr, "tandem export: %s\n", unprefixed(e.what(), "tandem export: ").c_str());
      exit_code = e.code() == errc::bad_input ? 2 : 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem export: %s\n", unprefixed(e.what(), "tandem export: ").c_str());
      exit_code = 1;
    }
  });
}

} // namespace tandem::cli
