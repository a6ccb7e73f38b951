#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "build_info.hpp"
#include "commands.hpp"
#include "resources.hpp"
#include "bench/bench.hpp"
#include "gpu/device/error.hpp"

namespace tandem::cli {

void add_bench(CLI::App& app, int& exit_code) {
  std::string cases_help = "Cases to run (default: all):";
  for (const auto& c : gpu::bench_case_names())
    cases_help += " " + c;
  auto* cmd = app.add_subcommand(
    "bench", "Run the benchmark suite: one JSON line per case (docs/bench.md)");
  auto opts = std::make_shared<gpu::bench_options>();
  cmd->add_option("cases", opts->cases, cases_help);
  cmd->add_option("--size", opts->size, "Shapes: tiny, 8b (Qwen3-8B), 14b (Qwen3-14B), or auto (8b on a GPU)")
    ->capture_default_str();
  cmd->add_option("--warmup", opts->warmup, "Untimed runs before timing")->capture_default_str()
    ->check(non_negative);
  cmd->add_option("--iters", opts->iters, "Timed runs (median and MAD are reported)")
    ->capture_default_str()->check(at_least_one);
  cmd->add_option("--dataset", opts->dataset,
                  "prefetch_pack: a dataset from `tandem prepare` (default: a synthetic one)")
    ->check(CLI::ExistingDirectory);
  cmd->add_option("--seconds", opts->seconds, "prefetch_pack: seconds of packing")
    ->capture_default_str()->check(positive);
  cmd->add_flag("--reference", opts->reference,
                "drafter_step: also time the PyTorch reference (bench/reference_step.py, "
                "run with TANDEM_PYTHON or the build's python)");
  cmd->add_option("--profile-steps", opts->profile_steps,
                  "drafter_step and target_forward (eager runs) and target_decode (its steps as timed): "
                  "runs profiled after timing for the per-kernel-class GPU time (kernel_ms); 0 turns it off")
    ->capture_default_str()->check(non_negative);
  cmd->add_option("--trace", opts->trace_dir,
                  "drafter_step, target_forward: save the profiled runs' Chrome trace in this folder");
  cmd->add_option("--docs", opts->docs,
                  "target_forward: documents a row, of equal lengths (its graphs, eager and mask lines)")
    ->capture_default_str()->check(at_least_one);
  cmd->add_option("--rows", opts->rows,
                  "target_forward: rows a forward (default: the size's, 4 at 8b, 2 at tiny; the one-GPU "
                  "pipeline forwards one)")
    ->check(at_least_one);
  cmd->add_option("--block-size", opts->block,
                  "drafter_step, drafter_step_eager, dflash_attention, target_decode's speculative cycle: "
                  "the drafter's block size (default 16; --reference passes it on)")
    ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  auto device = std::make_shared<std::string>();
  cmd->add_option("--device", *device, "cpu, cuda, cuda:N, auto, or a CUDA ordinal (-1: the CPU); default: "
                                       "cuda:0 if present");
  cmd->callback([opts, device, &exit_code] {
    if (!device->empty()) {
      try {
        size_t used = 0;
        const int n = std::stoi(*device, &used);
        if (used != device->size() || n < -1)
          throw std::invalid_argument(*device);
        opts->device = n;
      } catch (const std::exception&) {
        try {
          opts->device = parse_device(*device);
        } catch (const gpu::error& e) {
          std::fprintf(stderr, "tandem bench: %s, nor a CUDA ordinal (0, 1, ...; -1: the CPU)\n", e.what());
          exit_code = 2;
          return;
        }
      }
    }
    opts->git_commit = build::git_commit;
    const char* env = std::getenv("TANDEM_PYTHON");
    opts->python = env && *env ? env : build::python;
    opts->reference_script = resource("bench/reference_step.py").string();
    try {
      gpu::run_bench(*opts, [](const std::string& line) {
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
      });
      exit_code = 0;
    } catch (const gpu::error& e) {
      std::fprintf(stderr, "tandem bench: %s\n", e.what());
      exit_code = 2;
    }
  });
}

} // namespace tandem::cli
