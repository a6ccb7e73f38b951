// CUDA payloads between processes (gpu/transport/transport.hpp,
// share_with_host): a child process (this binary again, exec'd, so that no
// CUDA context crosses a fork) publishes CUDA tensors with scope::host; the
// parent acquires them by handle through CUDA IPC on cuda:0 — bit-equal,
// ordered by the producer's IPC event, each allocation opened once — and the
// child's release unlinks the segment.  Also the cost per payload on the
// host (publish, map), the figure issue 18 bounds at 2% of a step.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "gpu/device/error.hpp"
#include "gpu/pch.hpp"
#include "gpu/transport/tensors.hpp"
#include "tests/gpu/fixtures.hpp"

namespace tandem::gpu {
namespace {

namespace fs = std::filesystem;

/// The child's side: TANDEM_IPC_DIR names the folder where it writes its
/// handles (one per line, then "end") and waits for "done".
TEST(TransportIpc, ChildPublishes) {
  const char* dir = std::getenv("TANDEM_IPC_DIR");
  if (!dir)
    GTEST_SKIP() << "SKIPPED: the child half of TransportIpc.ParentAcquires (it runs it)";
  transport::share_with_host(true);
  std::ofstream out(fs::path(dir) / "handles.tmp");
  std::vector<transport::handle> hs;
  for (int i = 0; i < 20; ++i) {
    transport::payload p;
    auto a = at::arange(4096 * 8, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, 0)).reshape({4096, 8}) + i;
    auto b = at::full({3, 5}, i, at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA, 0));
    p.tensors = {a, b};
    p.ready = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
    p.ready->record(c10::cuda::getCurrentCUDAStream(0));
    hs.push_back(transport::publish(std::move(p), transport::scope::host));
    out << hs.back() << "\n";
  }
  out.close();
  fs::rename(fs::path(dir) / "handles.tmp", fs::path(dir) / "handles");
  ASSERT_TRUE(test::wait_for_file(fs::path(dir) / "done", 120));
  for (auto h : hs)
    transport::release(h);
  const auto c = transport::sharing_cost();
  std::ofstream(fs::path(dir) / "child_cost") << c.publish_ms / std::max<uint64_t>(c.published, 1) << "\n";
}

TEST(TransportIpc, ParentAcquires) {
  TANDEM_REQUIRE_GPUS(1);
  const auto dir = fs::temp_directory_path() / ("tandem-ipc-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::setenv("TANDEM_IPC_DIR", dir.c_str(), 1);
    const std::string self = fs::read_symlink("/proc/self/exe").string();
    ::execl(self.c_str(), self.c_str(), "--gtest_filter=TransportIpc.ChildPublishes", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ASSERT_TRUE(test::wait_for_file(dir / "handles", 120)) << "the child published nothing";
  std::vector<transport::handle> hs;
  std::ifstream in(dir / "handles");
  for (transport::handle h; in >> h;)
    hs.push_back(h);
  ASSERT_EQ(hs.size(), 20u);
  transport::share_with_host(true);
  const auto before = transport::sharing_cost();
  for (size_t i = 0; i < hs.size(); ++i) {
    auto t = transport::acquire(hs[i], at::Device(at::kCUDA, 0));
    ASSERT_EQ(t.size(), 2u);
    auto want = at::arange(4096 * 8, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, 0)).reshape({4096, 8})
                + static_cast<int64_t>(i);
    EXPECT_TRUE(at::equal(t[0], want)) << "payload " << i;
    EXPECT_TRUE(at::equal(t[1], at::full({3, 5}, static_cast<int64_t>(i),
                                         at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA, 0))));
  }
  c10::cuda::getCurrentCUDAStream(0).synchronize();
  const auto after = transport::sharing_cost();
  EXPECT_EQ(after.ipc_mapped - before.ipc_mapped, 20u);
  // The child's caching allocator hands out few distinct allocations: each
  // is opened once here, not once per payload.
  EXPECT_LT(after.ipc_opened - before.ipc_opened, 20u);
  std::ofstream(dir / "done") << "1\n";
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  double child_publish_ms = 0;
  std::ifstream(dir / "child_cost") >> child_publish_ms;
  std::printf("cuda ipc: publish %.3f ms/payload (child), map %.3f ms/payload (parent), %llu allocations opened for "
              "20 payloads\n",
              child_publish_ms, (after.map_ms - before.map_ms) / 20.0,
              static_cast<unsigned long long>(after.ipc_opened - before.ipc_opened));
  // Released: the segments are gone.
  for (auto h : hs)
    EXPECT_THROW(transport::acquire(h, at::Device(at::kCUDA, 0)), error);
  fs::remove_all(dir);
}

} // namespace
} // namespace tandem::gpu
