#pragma once
/// The benchmark harness behind `tandem bench`.  Torch-free facade: one JSON
/// line per case (schema in docs/bench.md), emitted as each case finishes.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tandem::gpu {

struct bench_options {
  std::vector<std::string> cases;  ///< empty: all
  std::string size = "auto";       ///< "tiny", "8b", or "auto" (8b on a GPU, tiny on the CPU)
  int warmup = 3;                  ///< untimed runs first
  int iters = 10;                  ///< timed runs
  int32_t device = -2;             ///< CUDA ordinal; -1 = CPU; -2 = cuda:0 if present
  std::string git_commit;          ///< recorded in every line
  std::string dataset;             ///< prefetch_pack: a prepared dataset (default: synthetic)
  double seconds = 3.0;            ///< prefetch_pack: how long to pack
  bool reference = false;          ///< drafter_step: also run the PyTorch reference
  std::string python;              ///< drafter_step --reference: the interpreter
  std::string reference_script;    ///< drafter_step --reference: bench/reference_step.py
  int profile_steps = 3;           ///< drafter_step (both modes), target_forward (eager), target_decode (as timed): runs profiled for kernel_ms; 0: none
  std::string trace_dir;           ///< also save those runs' Chrome trace there ("": don't)
  int64_t docs = 4;                ///< target_forward: documents a row (equal lengths)
  int64_t rows = 0;                ///< target_forward: rows a forward (0: the size's, 4 at 8b, 2 tiny)
  int64_t block = 0;               ///< drafter_step, drafter_step_eager, dflash_attention, target_decode's cycle: block size Bs (0: 16)
};

/// Names of the cases `run_bench` knows.
std::vector<std::string> bench_case_names();

/// Runs the selected cases; throws gpu::error(bad_input) for an unknown case
/// or size.
void run_bench(const bench_options& opts, const std::function<void(const std::string&)>& emit);

} // namespace tandem::gpu
