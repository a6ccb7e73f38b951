#pragma once
/// Inputs shared by the GPU engine tests (graph_test.cpp,
/// data_parallel_test.cpp): the parity fixtures' tiny Qwen3 target and a
/// learnable synthetic batch; and on_ranks, the NCCL tests' one thread per
/// rank (nccl_test.cpp, transport_nccl_test.cpp).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/engine/batch.hpp"
#include "gpu/device/error.hpp"
#include "gpu/nccl/communicator.hpp"
#include "gpu/pch.hpp"
#include "messages/errors.hpp"
#include "tests/unit/expect_error.hpp"

namespace tandem::gpu::test {

/// Waits up to `seconds` for file `f` to exist (a child process's answer
/// in the two-process transport tests); false when it never came.
inline bool wait_for_file(const std::filesystem::path& f, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!std::filesystem::exists(f)) {
    if (std::chrono::steady_clock::now() > until)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

/// The parity fixtures' tiny Qwen3 (V 512, D 64, 8 layers; tests/parity/FIXTURES.md).
inline std::filesystem::path tiny_target_dir() {
  return std::filesystem::path(TANDEM_FIXTURES_DIR) / "qwen3_tiny";
}

/// Rows of a repeated random phrase (learnable), two documents in row 0.
inline data::packed_batch phrase_batch(int64_t rows, int64_t seq, uint64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto phrase = at::randint(0, 500, {10}, g, at::kLong);
  data::packed_batch b;
  b.tokens = phrase.repeat({rows, seq / 10 + 1}).narrow(1, 0, seq).contiguous().to(at::kInt);
  b.doc_lengths = at::zeros({rows, 2}, at::kLong);
  b.doc_lengths[0][0] = seq / 2;
  b.doc_lengths[0][1] = seq - seq / 2;
  for (int64_t r = 1; r < rows; ++r)
    b.doc_lengths[r][0] = seq;
  b.loss_mask = at::ones({rows, seq}, at::kByte);
  b.real_tokens = rows * seq;
  return b;
}

inline bool have_cuda() {
  return torch::cuda::is_available();
}

/// CUDA devices this process sees (0 without a GPU).
inline int cuda_devices() {
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

/// A private CPU generator (never the process-wide one: DESIGN.md §4).
inline at::Generator gen(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

/// ‖ours − ref‖ / ‖ref‖ in float64 on the CPU.
inline double rel_err(const at::Tensor& ours, const at::Tensor& ref) {
  auto a = ours.to(at::kCPU, at::kDouble), b = ref.to(at::kCPU, at::kDouble);
  return ((a - b).norm() / b.norm().clamp_min(1e-30)).item<double>();
}

using steady = std::chrono::steady_clock;

inline double seconds_since(steady::time_point t0) {
  return std::chrono::duration<double>(steady::now() - t0).count();
}

/// Runs body(rank) on one thread per rank, as one GPU actor per device
/// would.  Exceptions become test failures naming the rank; a rank still
/// running after `limit` aborts the process with a message naming `who`
/// (a hang the communicators' own timeouts did not end) instead of hanging.
inline void on_ranks(const char* who, int world, const std::function<void(int)>& body,
                     std::chrono::seconds limit) {
  std::vector<std::string> errors(world);
  auto done = std::make_unique<std::atomic<bool>[]>(world);
  std::mutex m;
  std::condition_variable cv;
  int finished = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    done[r] = false;
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const tandem::gpu::error& e) {
        errors[r] = "gpu::error(" + tandem::to_string(e.code()) + "): " + e.what();
      } catch (const std::exception& e) {
        errors[r] = std::string("exception: ") + e.what();
      }
      done[r] = true;
      {
        std::lock_guard<std::mutex> l(m);
        ++finished;
      }
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> l(m);
    if (!cv.wait_for(l, limit, [&] { return finished == world; })) {
      std::string stuck;
      for (int r = 0; r < world; ++r)
        if (!done[r])
          stuck += " " + std::to_string(r);
      std::fprintf(stderr,
                   "%s: rank(s)%s still running after %lld s: a hang that the communicators' "
                   "timeouts did not end. Aborting the process instead of hanging (rerun with "
                   "NCCL_DEBUG=INFO for NCCL's view).\n",
                   who, stuck.c_str(), static_cast<long long>(limit.count()));
      std::fflush(stderr);
      std::abort();
    }
  }
  for (auto& t : threads)
    t.join();
  for (int r = 0; r < world; ++r)
    EXPECT_TRUE(errors[r].empty()) << "rank " << r << " threw " << errors[r];
}

} // namespace tandem::gpu::test

/// In a TEST body: SKIPPED (never passed) on a host with fewer than n GPUs.
#define TANDEM_REQUIRE_GPUS(n)                                                               \
  do {                                                                                       \
    if (tandem::gpu::test::cuda_devices() < (n))                                             \
      GTEST_SKIP() << "SKIPPED: needs " << (n) << " CUDA device(s), this host has "          \
                   << tandem::gpu::test::cuda_devices();                                     \
  } while (0)

/// In a TEST body: SKIPPED in a build without NCCL.
#define TANDEM_REQUIRE_NCCL()                                                                \
  do {                                                                                       \
    if (!tandem::gpu::nccl::available())                                                     \
      GTEST_SKIP() << "SKIPPED: built without NCCL";                                         \
  } while (0)
