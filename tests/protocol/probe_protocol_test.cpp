// Probe protocol on CAF's deterministic scheduler, with a fake backend.
// Asserts the exact message traffic of messages/probe.hpp.
#define CAF_SUITE probe_protocol

#include <memory>
#include <stdexcept>

#include "dsl.hpp"

#include "actors/probe.hpp"
#include "gpu/device/error.hpp"
#include "messages/errors.hpp"
#include "messages/registry.hpp"

using namespace tandem;

namespace {

struct config : caf::actor_system_config {
  config() {
    register_messages(*this);
  }
};

struct fixture : test_coordinator_fixture<config> {
  std::shared_ptr<int> calls = std::make_shared<int>(0);

  /// A backend that answers like a GPU without touching one.
  probe_fn fake_ok() {
    return [calls = calls](int32_t device) {
      ++*calls;
      probe_report r;
      r.device = device;
      r.backend = "fake";
      r.device_name = "fake-device";
      r.max_abs_error = 1e-6;
      return r;
    };
  }
};

} // namespace

CAF_TEST_FIXTURE_SCOPE(probe_protocol_tests, fixture)

CAF_TEST(a probe answers its sender with the backend report) {
  auto probe = spawn_probe<caf::no_spawn_options>(sys, fake_ok());
  self->send(probe, probe_atom::value, int32_t{3});
  expect((probe_atom, int32_t), from(self).to(probe).with(_, 3));
  expect((probe_report), from(probe).to(self).with(_));
  CAF_CHECK_EQUAL(*calls, 1);
  auto report = request<probe_report>(probe, probe_atom::value, int32_t{5});
  CAF_CHECK_EQUAL(report.device, 5);
  CAF_CHECK_EQUAL(report.backend, "fake");
  CAF_CHECK_EQUAL(*calls, 2);
}

CAF_TEST(a backend error becomes a tandem error with its context) {
  auto probe = spawn_probe<caf::no_spawn_options>(sys, [](int32_t device) -> probe_report {
    throw gpu::error(errc::device_unavailable,
                     "cuda:" + std::to_string(device) + " requested, this host has 1");
  });
  auto rh = self->request(probe, caf::infinite, probe_atom::value, int32_t{7});
  run();
  bool got_error = false;
  rh.receive([](const probe_report&) { CAF_FAIL("expected an error"); },
             [&](const caf::error& err) {
               got_error = true;
               CAF_CHECK_EQUAL(err.category(), error_category);
               CAF_CHECK_EQUAL(err.code(), static_cast<uint8_t>(errc::device_unavailable));
               auto text = sys.render(err);
               CAF_CHECK(text.find("device_unavailable") != std::string::npos);
               CAF_CHECK(text.find("cuda:7") != std::string::npos);
             });
  CAF_CHECK(got_error);
}

CAF_TEST(any other exception becomes device_failure) {
  auto probe = spawn_probe<caf::no_spawn_options>(
    sys, [](int32_t) -> probe_report { throw std::runtime_error("CUDA error: illegal address"); });
  auto rh = self->request(probe, caf::infinite, probe_atom::value, int32_t{0});
  run();
  rh.receive([](const probe_report&) { CAF_FAIL("expected an error"); },
             [&](const caf::error& err) {
               CAF_CHECK_EQUAL(err.code(), static_cast<uint8_t>(errc::device_failure));
               CAF_CHECK(sys.render(err).find("illegal address") != std::string::npos);
             });
}

CAF_TEST(an unexpected message is answered with unexpected_message) {
  auto probe = spawn_probe<caf::no_spawn_options>(sys, fake_ok());
  auto dynamic = caf::actor_cast<caf::actor>(probe);
  auto rh = self->request(dynamic, caf::infinite, std::string("hello"));
  run();
  rh.receive([](const caf::message&) { CAF_FAIL("expected an error"); },
             [&](const caf::error& err) {
               CAF_CHECK_EQUAL(err.code(), static_cast<uint8_t>(errc::unexpected_message));
             });
  CAF_CHECK_EQUAL(*calls, 0);
}

CAF_TEST(shutdown ends the probe) {
  auto probe = spawn_probe<caf::no_spawn_options>(sys, fake_ok());
  self->monitor(probe);
  self->send(probe, shutdown_atom::value);
  expect((shutdown_atom), from(self).to(probe));
  expect((caf::down_msg), from(probe).to(self));
}

CAF_TEST(probe_report survives serialization) {
  probe_report r;
  r.device = 2;
  r.backend = "cuda";
  r.device_name = "NVIDIA H200";
  r.thread_id = "140000";
  r.max_abs_error = 3.5e-6;
  r.elapsed_ms = 0.25;
  r.custom_kernel = true;
  auto back = roundtrip(r);
  CAF_CHECK_EQUAL(back.device, 2);
  CAF_CHECK_EQUAL(back.device_name, "NVIDIA H200");
  CAF_CHECK_EQUAL(back.max_abs_error, 3.5e-6);
  CAF_CHECK_EQUAL(back.custom_kernel, true);
}

CAF_TEST_FIXTURE_SCOPE_END()
