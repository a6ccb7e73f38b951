// Payloads between two processes over an NCCL link (gpu/transport/link.hpp),
// as a target sends a drafter on another host what it pulls: a child process
// (this binary again, exec'd, so that no CUDA context crosses a fork) is the
// producer (rank 0), the parent the consumer (rank 1), both on cuda:0.  The
// child names another NCCL host (NCCL_HOSTID): NCCL refuses two ranks on one
// GPU of one host, and two hosts' ranks talk through its network transport
// (gpu/dev/nccl_hostid_probe.py), which is the cross-host path.
//   - a batch-like payload {int32, uint8, int64} from the CPU and features in
//     bf16 on the GPU arrive bit-equal, twenty times, in order;
//   - a check of an unknown handle is refused with bad_input and sends
//     nothing: the next payloads still match;
//   - the time to receive 503 MB (the taps of one 8B batch, 4 × 3072 × 5 ×
//     4096 bf16) is printed.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "gpu/device/error.hpp"
#include "gpu/nccl/communicator.hpp"
#include "gpu/pch.hpp"
#include "gpu/transport/link.hpp"
#include "gpu/transport/tensors.hpp"
#include "tests/gpu/fixtures.hpp"

namespace tandem::gpu {
namespace {

namespace fs = std::filesystem;

constexpr int payloads = 20;

/// Payload i: a batch {tokens int32 [4, 64], mask uint8 [4, 64], docs int64
/// [4, 3]} on the CPU, and features bf16 [4, 64, 40] on cuda:0.
std::vector<at::Tensor> batch_of(int i) {
  auto cpu = at::TensorOptions().device(at::kCPU);
  return {at::arange(256, cpu.dtype(at::kInt)).reshape({4, 64}) * (i + 1),
          (at::arange(256, cpu.dtype(at::kInt)).reshape({4, 64}) % (i + 2)).to(at::kByte),
          at::full({4, 3}, int64_t{1} << (32 + i % 20), cpu.dtype(at::kLong))};
}

at::Tensor features_of(int i) {
  return (at::arange(4 * 64 * 40, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, 0)).reshape({4, 64, 40})
          / 7.0 + i).to(at::kBFloat16);
}

std::vector<payload_spec> specs_for_test() {
  return {{{{{4, 64}, "int32"}, {{4, 64}, "uint8"}, {{4, 3}, "int64"}}}, {{{{4, 64, 40}, "bfloat16"}}}};
}

std::vector<uint8_t> read_id(const fs::path& f) {
  std::ifstream in(f, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

/// The child's side: TANDEM_LINK_DIR holds the id; it joins as rank 0 and
/// sends, then waits for "done".
TEST(TransportLink, ChildSends) {
  const char* dir = std::getenv("TANDEM_LINK_DIR");
  if (!dir)
    GTEST_SKIP() << "SKIPPED: the child half of TransportLink.ParentReceives (it runs it)";
  const auto id = read_id(fs::path(dir) / "id");
  transport::link l(id, 0, 0, std::chrono::seconds(60), "test producer");
  // Refused before any NCCL call: the pair stays in step.
  EXPECT_THROW(l.check({987654321}), error);
  for (int i = 0; i < payloads; ++i) {
    transport::payload b;
    b.tensors = batch_of(i);
    transport::payload f;
    f.tensors = {features_of(i)};
    f.ready = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
    f.ready->record(c10::cuda::getCurrentCUDAStream(0));
    std::vector<transport::handle> hs{transport::publish(std::move(b)), transport::publish(std::move(f))};
    const auto specs = l.check(hs);
    ASSERT_EQ(specs.size(), 2u);
    EXPECT_EQ(specs[0].tensors[2].dtype, "int64");
    l.send(hs, specs);
    for (auto h : hs)
      transport::release(h);  // the allocator keeps the memory until the send is done
  }
  {
    transport::payload big;
    big.tensors = {at::ones({4, 3072, 5 * 4096}, at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA, 0))};
    auto h = transport::publish(std::move(big));
    l.send({h}, l.check({h}));
    transport::release(h);
  }
  ASSERT_TRUE(test::wait_for_file(fs::path(dir) / "done", 120));
  EXPECT_TRUE(l.usable());
}

TEST(TransportLink, ParentReceives) {
  TANDEM_REQUIRE_GPUS(1);
  TANDEM_REQUIRE_NCCL();
  const auto dir = fs::temp_directory_path() / ("tandem-link-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto id = nccl::new_unique_id();
  std::ofstream(dir / "id", std::ios::binary).write(reinterpret_cast<const char*>(id.data()),
                                                    static_cast<std::streamsize>(id.size()));
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::setenv("TANDEM_LINK_DIR", dir.c_str(), 1);
    ::setenv("NCCL_HOSTID", "tandem-link-test-producer", 1);
    const std::string self = fs::read_symlink("/proc/self/exe").string();
    ::execl(self.c_str(), self.c_str(), "--gtest_filter=TransportLink.ChildSends", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  {
    transport::link l(id, 1, 0, std::chrono::seconds(60), "test consumer");
    for (int i = 0; i < payloads; ++i) {
      const auto hs = l.receive(specs_for_test());
      ASSERT_EQ(hs.size(), 2u);
      auto b = transport::acquire(hs[0], at::Device(at::kCUDA, 0));
      auto f = transport::acquire(hs[1], at::Device(at::kCUDA, 0));
      const auto want = batch_of(i);
      ASSERT_EQ(b.size(), 3u);
      for (size_t k = 0; k < 3; ++k)
        EXPECT_TRUE(at::equal(b[k].cpu(), want[k])) << "payload " << i << ", batch tensor " << k;
      EXPECT_TRUE(at::equal(f[0], features_of(i))) << "payload " << i << ", features";
      for (auto h : hs)
        transport::release(h);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const auto big = l.receive({{{{{4, 3072, 5 * 4096}, "bfloat16"}}}});
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    auto t = transport::acquire(big[0], at::Device(at::kCUDA, 0));
    EXPECT_EQ(t[0].sum(at::kFloat).item<float>(), static_cast<float>(4 * 3072 * 5 * 4096));
    transport::release(big[0]);
    std::printf("nccl link: 503.3 MB received in %.1f ms (%.2f GB/s; NCCL's network transport between two "
                "\"hosts\" on one GPU)\n", ms, 503.3 / ms);
    const auto c = transport::links_cost();
    EXPECT_EQ(c.pulls_received, static_cast<uint64_t>(payloads + 1));
    std::ofstream(dir / "done") << "1\n";
    int status = 0;
    ::waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
  fs::remove_all(dir);
}

} // namespace
} // namespace tandem::gpu
