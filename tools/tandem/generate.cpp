// `tandem generate`: the decoding half of `tandem prepare --regenerate`.
// Decodes prompts (token ids from `tandem prepare --prompts-out`) with the
// target alone, in batches, and appends one JSON line per prompt to --out as
// its batch ends, so an interrupted run resumes where it stopped.  The first
// line identifies the prompts and options; a run with others refuses the file.
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "gpu/decode/eval.hpp"
#include "gpu/device/error.hpp"
#include "gpu/device/runtime.hpp"

namespace tandem::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct generate_args {
  gpu::generate_options o;
  std::string prompts, out, device = "auto";
  bool quiet = false;
};

/// The target's files as they are now: FNV-1a 64 over config.json's bytes
/// and each weights file's name, size and modification time (hashing 16 GB
/// of weights would take longer than a resume saves).  Other weights at the
/// same path give another fingerprint.
std::string target_fingerprint(const fs::path& dir) {
  uint64_t h = 1469598103934665603ull;
  auto mix_bytes = [&h](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      h ^= static_cast<const unsigned char*>(p)[i];
      h *= 1099511628211ull;
    }
  };
  {
    std::ifstream f(dir / "config.json", std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    mix_bytes(text.data(), text.size());
  }
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto name = e.path().filename().string();
    if (name.size() > 12 && (name.rfind(".safetensors") == name.size() - 12
                             || name.find(".safetensors.index.json") != std::string::npos))
      files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    struct stat st {};
    if (::stat(f.c_str(), &st) != 0)
      continue;
    const auto name = f.filename().string();
    mix_bytes(name.data(), name.size());
    const int64_t fields[] = {static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec),
                              static_cast<int64_t>(st.st_mtim.tv_nsec)};
    mix_bytes(fields, sizeof fields);
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

/// What ties an --out file to its prompts and decoding options: its first
/// line.  A resumed run must match it, so a file of other prompts or options
/// is never taken for finished work.
json identity(const generate_args& a) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64 over the prompts' ids and lengths
  auto mix = [&h](uint64_t v) {
    for (int b = 0; b < 8; ++b) {
      h ^= (v >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (const auto& p : a.o.prompts) {
    mix(p.size());
    for (auto id : p)
      mix(static_cast<uint64_t>(id));
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  std::error_code ec;
  auto target = fs::weakly_canonical(a.o.target_dir, ec);
  return json{{"format", "tandem.generated.v1"},
              {"prompts", a.o.prompts.size()},
              {"prompts_fnv1a64", hex},
              {"target", (ec ? a.o.target_dir : target).string()},
              {"target_files", target_fingerprint(a.o.target_dir)},
              {"max_new_tokens", a.o.max_new_tokens},
              {"temperature", a.o.temperature},
              {"top_p", a.o.top_p},
              {"top_k", a.o.top_k},
              {"seed", a.o.seed},
              {"stop_ids", a.o.stop_ids},
              {"dtype", a.o.dtype}};
}

/// The indices already in `out` (complete lines only; a torn last line from
/// a killed run is dropped and the file rewritten without it).  A new or
/// empty file gets the identity header.
std::set<size_t> finished(const fs::path& out, const json& id) {
  std::set<size_t> done;
  const auto prompts = id["prompts"].get<size_t>();
  std::ifstream f(out);
  std::vector<std::string> keep;
  std::string line;
  bool torn = false, header = false;
  if (f && std::getline(f, line)) {
    auto h = json::parse(line, nullptr, false);
    if (h.is_discarded() || !h.is_object() || h.value("format", "") != "tandem.generated.v1")
      throw gpu::error(errc::bad_input, out.string() + " exists and was not written by tandem "
                                        "generate (no tandem.generated.v1 first line); delete it "
                                        "or choose another --out");
    // A header and no generation yet (a run that failed before its first batch):
    // nothing to resume, so the new options simply replace it.
    std::string next;
    const bool empty = !std::getline(f, next);
    for (const auto& [key, value] : id.items()) {
      if (empty || (key == "target_files" && !h.contains(key)))  // (a header written before it was recorded)
        continue;
      if (key == "target_files" && h[key] != value)
        throw gpu::error(errc::bad_input,
                         out.string() + " holds generations of " + h.value("target", std::string("the target"))
                           + " as its files were then: its config.json or weights have changed since (size or "
                             "modification time); delete it or choose another --out to generate with the "
                             "target as it is now");
      if (!h.contains(key) || h[key] != value)
        throw gpu::error(errc::bad_input,
                         out.string() + " holds generations of other prompts or options ('" + key
                           + "' is " + (h.contains(key) ? h[key].dump() : "missing") + " there, "
                           + value.dump() + " now); delete it or choose another --out");
    }
    header = !empty && h == id;
    for (bool first = true; !empty && (first || std::getline(f, line)); first = false) {
      if (first)
        line = next;
      auto j = json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("index") || !j["index"].is_number_unsigned()
          || j["index"].get<size_t>() >= prompts) {
        torn = true;
        continue;
      }
      done.insert(j["index"].get<size_t>());
      keep.push_back(line);
    }
  }
  f.close();
  if (torn || !header) {
    std::ofstream w(out, std::ios::trunc);
    w << id.dump() << "\n";
    for (const auto& l : keep)
      w << l << "\n";
    if (!w)
      throw gpu::error(errc::bad_input, "cannot write " + out.string());
  }
  return done;
}

int run_generate(generate_args& a) {
  // Started by tandem prepare --regenerate: end with it, even when it is killed.
  if (const char* env = std::getenv("TANDEM_DIE_WITH_PARENT"); env && std::string(env) == "1") {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() == 1)  // the parent died before the line above
      return 1;
  }
  // The options first: a typo must not stamp --out with them.
  gpu::check_sampling(a.o.temperature, a.o.top_p, a.o.top_k, "generate");
  std::ifstream f(a.prompts);
  if (!f)
    throw gpu::error(errc::bad_input, "cannot read " + a.prompts);
  std::string line;
  int64_t n = 0;
  while (std::getline(f, line)) {
    ++n;
    auto j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      throw gpu::error(errc::bad_input, a.prompts + ":" + std::to_string(n) + ": not a JSON object");
    if (n == 1) {
      if (j.value("format", "") != "tandem.prompts.v1")
        throw gpu::error(errc::bad_input, a.prompts + ": line 1 is not a tandem.prompts.v1 header "
                                                      "(write the file with tandem prepare --prompts-out)");
      if (a.o.stop_ids.empty())
        a.o.stop_ids = j.value("stop_ids", std::vector<int64_t>{});
      continue;
    }
    if (!j.contains("ids") || !j["ids"].is_array())
      throw gpu::error(errc::bad_input, a.prompts + ":" + std::to_string(n) + ": no 'ids' array");
    for (const auto& id : j["ids"])
      if (!id.is_number_integer())
        throw gpu::error(errc::bad_input, a.prompts + ":" + std::to_string(n) + ": 'ids' holds " + id.dump()
                                            + ", not an integer token id");
    a.o.prompts.push_back(j["ids"].get<std::vector<int64_t>>());
  }
  a.o.device = parse_device(a.device);
  const auto total = a.o.prompts.size();
  const auto before = finished(a.out, identity(a));
  if (!before.empty() && !a.quiet)
    std::fprintf(stderr, "generate: %zu of %zu prompts already in %s; resuming\n", before.size(),
                 total, a.out.c_str());
  std::ofstream out(a.out, std::ios::app);
  if (!out)
    throw gpu::error(errc::bad_input, "cannot write " + a.out);
  size_t count = before.size(), limited = 0;
  int64_t tokens = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const bool tty = isatty(STDERR_FILENO);
  size_t shown = 0;
  const double seconds = gpu::generate(
    a.o,
    [&](size_t i, const std::vector<int64_t>& t, bool hit_limit) {
      out << json{{"index", i}, {"tokens", t}, {"hit_limit", hit_limit}}.dump() << "\n";
      out.flush();
      ++count;
      tokens += static_cast<int64_t>(t.size());
      limited += hit_limit;
      if (a.quiet)
        return;
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (tty || count == total || count * 10 / total != shown * 10 / total)
        std::fprintf(stderr, "%sgenerate: %zu/%zu prompts, %lld tokens, %.0f tokens/s%s", tty ? "\r" : "",
                     count, total, static_cast<long long>(tokens), el > 0 ? tokens / el : 0.0,
                     tty && count != total ? "" : "\n");
      shown = count;
    },
    [&](size_t i) { return before.count(i) > 0; });
  out.close();
  if (!out)
    throw gpu::error(errc::bad_input, "cannot write " + a.out);
  json report{{"prompts", total},
              {"generated", count - before.size()},
              {"tokens", tokens},
              {"seconds", seconds},
              {"tokens_per_s", seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0},
              {"hit_limit", limited}};
  std::printf("%s\n", report.dump().c_str());
  return 0;
}

} // namespace

void add_generate(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<generate_args>();
  auto* cmd = app.add_subcommand(
    "generate", "Decode prompts with the target alone, in batches (the decoding half of "
                "tandem prepare --regenerate); resumes an interrupted --out");
  cmd->add_option("--target", a->o.target_dir, "The target (Hugging Face Qwen3 folder)")->required()
    ->check(CLI::ExistingDirectory);
  cmd->add_option("--prompts", a->prompts, "Prompts from tandem prepare --prompts-out")
    ->required()->check(CLI::ExistingFile);
  cmd->add_option("--out", a->out, "JSON lines: a header (the prompts' fingerprint and the options), then {index, tokens, hit_limit} per prompt as its batch ends")
    ->required()->check(in_existing_folder);
  cmd->add_option("--max-new-tokens", a->o.max_new_tokens, "New tokens per prompt at most")
    ->capture_default_str()->check(at_least_one);
  cmd->add_option("--temperature", a->o.temperature, "0: greedy")->capture_default_str()
    ->check(non_negative);
  cmd->add_option("--top-p", a->o.top_p, "Nucleus sampling, in (0, 1]")->capture_default_str()
    ->check(top_p_range);
  cmd->add_option("--top-k", a->o.top_k, "Top-k sampling (0: off)")->capture_default_str()
    ->check(non_negative);
  cmd->add_option("--batch", a->o.batch, "Prompts decoded together")->capture_default_str()
    ->check(at_least_one);
  cmd->add_option("--device", a->device, "cpu, cuda, cuda:N, or auto")->capture_default_str();
  cmd->add_option("--dtype", a->o.dtype, "auto, float32, bfloat16")->capture_default_str();
  cmd->add_option("--seed", a->o.seed, "Seed of the sampling generator")->capture_default_str()
    ->check(non_negative);
  cmd->add_flag("--quiet", a->quiet, "No progress lines");
  cmd->callback([a, &exit_code] {
    try {
      exit_code = run_generate(*a);
    } catch (const gpu::error& e) {
      std::fprintf(stderr, "tandem generate: %s\n", unprefixed(e.what(), "generate: ").c_str());
      // Bad input, and a device this host lacks (--device cuda:3): the command line's (2).
      exit_code = e.code() == errc::bad_input || e.code() == errc::device_unavailable ? 2 : 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem generate: %s\n", e.what());
      exit_code = 1;
    }
  });
}

} // namespace tandem::cli
