// Payloads shared between processes of one host (gpu/transport/transport.hpp,
// share_with_host): a forked child publishes CPU tensors with scope::host,
// the parent acquires them by handle from the segment, bit-equal; release
// unlinks it; a damaged or missing segment is an error, never a crash; the
// sweep removes a dead process's segments.

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gpu/device/error.hpp"
#include "gpu/pch.hpp"
#include "gpu/transport/tensors.hpp"

namespace tandem::gpu {
namespace {

std::string segment_path(transport::handle h) {
  return "/dev/shm/tandem-" + std::to_string(::getuid()) + "-" + std::to_string(h >> 32) + "-"
         + std::to_string(static_cast<uint32_t>(h));
}

/// Runs `child` in a forked process that writes its handle into a pipe and
/// waits for a byte before it releases (1) or exits without releasing (0).
struct child_process {
  pid_t pid = -1;
  int to_child = -1, from_child = -1;
  transport::handle handle = 0;
  void start(bool release_at_end) {
    int up[2], down[2];
    ASSERT_EQ(::pipe(up), 0);
    ASSERT_EQ(::pipe(down), 0);
    pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(up[0]);
      ::close(down[1]);
      transport::share_with_host(true);
      transport::payload p;
      p.tensors = {at::arange(12, at::kInt).reshape({3, 4}), at::linspace(0, 1, 7, at::kFloat),
                   at::ones({2, 2, 2}, at::kBFloat16)};
      const auto h = transport::publish(std::move(p), transport::scope::host);
      (void)!::write(up[1], &h, sizeof h);
      char c = 0;
      (void)!::read(down[0], &c, 1);
      if (release_at_end)
        transport::release(h);
      ::_exit(0);
    }
    ::close(up[1]);
    ::close(down[0]);
    to_child = down[1];
    from_child = up[0];
    ASSERT_EQ(::read(from_child, &handle, sizeof handle), static_cast<ssize_t>(sizeof handle));
  }
  int finish() {
    char c = 1;
    (void)!::write(to_child, &c, 1);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(to_child);
    ::close(from_child);
    return status;
  }
};

TEST(TransportShm, AnotherProcessAcquiresTheSameBytesAndReleaseUnlinks) {
  child_process child;
  child.start(true);
  ASSERT_EQ(child.handle >> 32, static_cast<uint64_t>(child.pid));
  EXPECT_TRUE(std::filesystem::exists(segment_path(child.handle)));
  auto t = transport::acquire(child.handle, at::kCPU);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_TRUE(at::equal(t[0], at::arange(12, at::kInt).reshape({3, 4})));
  EXPECT_TRUE(at::equal(t[1], at::linspace(0, 1, 7, at::kFloat)));
  EXPECT_EQ(t[2].scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(t[2], at::ones({2, 2, 2}, at::kBFloat16)));
  // Copy-on-write: the consumer's writes stay its own.
  t[0].zero_();
  auto again = transport::acquire(child.handle, at::kCPU);
  EXPECT_TRUE(at::equal(again[0], at::arange(12, at::kInt).reshape({3, 4})));
  EXPECT_EQ(child.finish(), 0);
  EXPECT_FALSE(std::filesystem::exists(segment_path(child.handle)));
  // The mapping outlives the unlink.
  EXPECT_TRUE(at::equal(again[1], at::linspace(0, 1, 7, at::kFloat)));
  try {
    transport::acquire(child.handle, at::kCPU);
    FAIL() << "a released segment was acquired";
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find("process " + std::to_string(child.pid)), std::string::npos) << e.what();
  }
}

TEST(TransportShm, ADamagedSegmentIsAnErrorAndTheSweepRemovesADeadProcesssSegments) {
  child_process child;
  child.start(false);  // exits without releasing: its segment is an orphan
  EXPECT_EQ(child.finish(), 0);
  const auto path = segment_path(child.handle);
  ASSERT_TRUE(std::filesystem::exists(path));
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    const uint32_t count = 1000;
    f.write(reinterpret_cast<const char*>(&count), sizeof count);
  }
  try {
    transport::acquire(child.handle, at::kCPU);
    FAIL() << "a damaged segment was acquired";
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find("damaged header"), std::string::npos) << e.what();
  }
  EXPECT_GE(transport::sweep_orphan_segments(), 1u);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(TransportShm, ProcessScopeAndSharingOffStayLocal) {
  transport::share_with_host(false);
  transport::payload p;
  p.tensors = {at::ones({4})};
  const auto h = transport::publish(std::move(p), transport::scope::host);
  EXPECT_EQ(h >> 32, 0u);  // a plain counter
  EXPECT_TRUE(transport::release(h));
  transport::share_with_host(true);
  transport::payload q;
  q.tensors = {at::ones({4})};
  const auto h2 = transport::publish(std::move(q), transport::scope::process);
  EXPECT_FALSE(std::filesystem::exists(segment_path(h2)));
  EXPECT_EQ(transport::acquire(h2, at::kCPU)[0].sum().item<float>(), 4.0f);
  EXPECT_TRUE(transport::release(h2));
  transport::share_with_host(false);
}

} // namespace
} // namespace tandem::gpu
