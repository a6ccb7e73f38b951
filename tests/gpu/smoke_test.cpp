// A detached CAF actor runs LibTorch (and Tandem's own CUDA kernel) on the
// device it owns and replies.  The CUDA cases report SKIPPED on a host
// without a GPU; the CPU case runs everywhere.
#include <chrono>
#include <set>
#include <sstream>
#include <thread>

#include <caf/all.hpp>
#include <gtest/gtest.h>

#include "actors/probe.hpp"
#include "gpu/device/probe.hpp"
#include "gpu/device/runtime.hpp"
#include "messages/errors.hpp"
#include "messages/registry.hpp"

using namespace tandem;

namespace {

struct config : caf::actor_system_config {
  config() {
    register_messages(*this);
  }
};

std::string this_thread_text() {
  std::ostringstream os;
  os << std::this_thread::get_id();
  return os.str();
}

probe_report probe_via_actor(caf::actor_system& sys, int32_t device) {
  caf::scoped_actor self{sys};
  auto probe = spawn_probe<caf::detached>(sys);
  probe_report out;
  self->request(probe, std::chrono::seconds(120), probe_atom::value, device)
    .receive([&](const probe_report& r) { out = r; },
             [&](const caf::error& err) { ADD_FAILURE() << sys.render(err); });
  self->send(probe, shutdown_atom::value);
  return out;
}

} // namespace

TEST(smoke, detached_actor_runs_libtorch_on_cpu) {
  config cfg;
  caf::actor_system sys{cfg};
  auto r = probe_via_actor(sys, cpu_device);
  EXPECT_EQ(r.backend, "cpu");
  EXPECT_LE(r.max_abs_error, gpu::probe_tolerance);
  EXPECT_NE(r.thread_id, this_thread_text()) << "probe must run on its own thread";
}

TEST(smoke, detached_actor_per_gpu_runs_libtorch_and_tandem_kernel) {
  auto rt = gpu::query_runtime();
  if (rt.devices.empty())
    GTEST_SKIP() << "SKIPPED: no CUDA device visible (cuda_driver=" << rt.cuda_driver << ")";
  config cfg;
  caf::actor_system sys{cfg};
  std::set<std::string> threads;
  for (const auto& d : rt.devices) {
    auto r = probe_via_actor(sys, d.index);
    EXPECT_EQ(r.backend, "cuda");
    EXPECT_EQ(r.device, d.index);
    EXPECT_TRUE(r.custom_kernel);
    EXPECT_LE(r.max_abs_error, gpu::probe_tolerance);
    EXPECT_NE(r.thread_id, this_thread_text());
    threads.insert(r.thread_id);
    std::printf("cuda:%d %s: max |error| %.3e, %.3f ms, actor thread %s\n", d.index,
                r.device_name.c_str(), r.max_abs_error, r.elapsed_ms, r.thread_id.c_str());
  }
}

TEST(smoke, probe_of_missing_gpu_is_a_clear_error) {
  config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto probe = spawn_probe<caf::detached>(sys);
  bool got_error = false;
  self->request(probe, std::chrono::seconds(60), probe_atom::value, int32_t{64})
    .receive([&](const probe_report&) { ADD_FAILURE() << "cuda:64 cannot exist"; },
             [&](const caf::error& err) {
               got_error = true;
               EXPECT_EQ(err.code(), static_cast<uint8_t>(errc::device_unavailable));
               EXPECT_NE(sys.render(err).find("cuda:64"), std::string::npos) << sys.render(err);
             });
  self->send(probe, shutdown_atom::value);
  EXPECT_TRUE(got_error);
}
