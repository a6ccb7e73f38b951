#pragma once
/// parallel_for: `fn(i)` for every i in [0, n) on up to `threads` threads
/// (the caller's among them), each taking the next index; the first
/// exception thrown is rethrown once all are done.  For the large host
/// copies of checkpoints (gpu/io/safetensors.cpp, gpu/engine/checkpoint_io.cpp),
/// where one core cannot keep up with the memory (a 12.6 GB drafter state
/// written into a tmpfs is bound by first-touch page faults, which scale
/// with cores).

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem::gpu::io {

/// Threads for the large host copies: half the cores, 2 to 8.
inline size_t copy_threads() {
  return std::clamp<size_t>(std::thread::hardware_concurrency() / 2, 2, 8);
}

template <class F>
void parallel_for(size_t n, size_t threads, F&& fn) {
  std::atomic<size_t> next{0};
  std::exception_ptr first;
  std::mutex m;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(m);
        if (!first)
          first = std::current_exception();
        next = n;  // stop handing out work
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < std::min(threads, n); ++t)
    pool.emplace_back(work);
  work();
  for (auto& t : pool)
    t.join();
  if (first)
    std::rethrow_exception(first);
}

} // namespace tandem::gpu::io
