// capture_stress DEVICE THREADS: one fresh process of the concurrent-capture
// stress test (tests/gpu/graph_test.cpp runs it 20 times).  THREADS threads,
// each the owner of one drafter engine on cuda:DEVICE (as drafter actors on
// one GPU are), build their engines, run the eager warm-up step, wait for
// each other, then all capture their first graph at the same moment and
// replay it.  Prints one JSON line; exit 0 when every thread succeeded,
// every engine captured exactly once, the captures never overlapped, and
// all threads computed the same losses (same seeds, same inputs; within
// 1e-3 relative: cuBLAS on different streams need not sum in one order).
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gpu/engine/batch.hpp"
#include "gpu/engine/drafter_engine.hpp"
#include "gpu/engine/graph.hpp"
#include "gpu/engine/target_engine.hpp"
#include "gpu/pch.hpp"
#include "gpu/transport/tensors.hpp"

using namespace tandem::gpu;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: capture_stress FIXTURES_DIR DEVICE THREADS\n");
    return 2;
  }
  const std::filesystem::path target_dir = std::filesystem::path(argv[1]) / "qwen3_tiny";
  const int device = std::atoi(argv[2]);
  const int threads = std::atoi(argv[3]);

  // One batch and its features, shared read-only by every engine.
  auto g = at::make_generator<at::CPUGeneratorImpl>(7);
  data::packed_batch b;
  b.tokens = at::randint(0, 500, {2, 96}, g, at::kLong).to(at::kInt);
  b.doc_lengths = at::full({2, 1}, 96, at::kLong);
  b.loss_mask = at::ones({2, 96}, at::kByte);
  b.real_tokens = 2 * 96;
  target_engine target({target_dir, device, "auto", {}});
  auto batch = publish_batch(b);
  auto features = target.forward(batch);
  const auto target_captures = captures_in_process();  // the target's graph (packed forward), if any

  std::atomic<int> ready{0};
  std::vector<std::string> errors(static_cast<size_t>(threads));
  std::vector<std::vector<double>> losses(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      auto& err = errors[static_cast<size_t>(t)];
      try {
        drafter_engine_options o;
        o.target_dir = target_dir;
        o.device = device;
        o.layers = 1;
        o.block_size = 8;
        o.mask_token_id = 511;
        o.anchors = 8;
        o.chunk_rows = 32;
        o.seed = 3;
        o.lr = 1e-3;
        drafter_engine engine(o);
        losses[static_cast<size_t>(t)].push_back(engine.train_step(batch, features).loss);  // eager warm-up
        ++ready;
        while (ready.load() < threads)
          std::this_thread::yield();
        for (int i = 0; i < 3; ++i)  // capture, then replays
          losses[static_cast<size_t>(t)].push_back(engine.train_step(batch, features).loss);
      } catch (const std::exception& e) {
        err = e.what();
        ++ready;
      }
    });
  for (auto& th : pool)
    th.join();
  transport::release(features);
  transport::release(batch);

  int failed = 0;
  for (int t = 0; t < threads; ++t)
    if (!errors[static_cast<size_t>(t)].empty()) {
      ++failed;
      std::fprintf(stderr, "thread %d: %s\n", t, errors[static_cast<size_t>(t)].c_str());
    }
  bool same = true;
  for (int t = 1; t < threads; ++t) {
    const auto& l = losses[static_cast<size_t>(t)];
    same = same && l.size() == losses[0].size();
    for (size_t i = 0; same && i < l.size(); ++i)
      same = std::abs(l[i] - losses[0][i]) <= 1e-3 * std::abs(losses[0][i]);
  }
  const auto captures = captures_in_process() - target_captures;  // the drafters
  const auto overlap = max_concurrent_captures();
  std::printf("{\"threads\": %d, \"failed\": %d, \"captures\": %lld, \"max_concurrent_captures\": %lld, "
              "\"same_losses\": %s, \"loss_last\": %.6f}\n",
              threads, failed, static_cast<long long>(captures), static_cast<long long>(overlap),
              same ? "true" : "false", losses[0].empty() ? 0.0 : losses[0].back());
  return failed == 0 && captures == threads && overlap == 1 && same ? 0 : 1;
}
