#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/probe.hpp"
#include "commands.hpp"
#include "gpu/device/runtime.hpp"
#include "messages/registry.hpp"

namespace tandem::cli {

namespace {

struct doctor_options {
  std::vector<int32_t> devices;  ///< empty: every GPU, or the CPU when none
  bool cpu = false;
  double timeout_s = 120;
  bool json = false;
};

int run_doctor(const doctor_options& opts) {
  auto rt = gpu::query_runtime();
  std::vector<int32_t> devices = opts.devices;
  if (devices.empty())
    for (const auto& d : rt.devices)
      devices.push_back(d.index);
  if (opts.cpu || devices.empty())
    devices.push_back(cpu_device);
  std::vector<int32_t> once;  // --device 0 --device 0 probes device 0 once
  for (auto d : devices)
    if (std::find(once.begin(), once.end(), d) == once.end())
      once.push_back(d);
  devices = std::move(once);

  caf::actor_system_config cfg;
  register_messages(cfg);
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
    std::chrono::duration<double>(opts.timeout_s));
  int failures = 0;
  for (auto device : devices) {
    auto probe = spawn_probe<caf::detached>(sys);
    const auto where = device == cpu_device ? std::string("cpu") : "cuda:" + std::to_string(device);
    self->request(probe, timeout, probe_atom::value, device)
      .receive(
        [&](const probe_report& r) {
          if (opts.json) {
            nlohmann::json j{{"device", where},           {"ok", true},
                             {"name", r.device_name},     {"actor_thread", r.thread_id},
                             {"max_abs_error", r.max_abs_error}, {"elapsed_ms", r.elapsed_ms},
                             {"custom_kernel", r.custom_kernel}};
            std::printf("%s\n", j.dump().c_str());
          } else {
            std::printf("ok    %-8s %-20s actor thread %s, max |error| %.2e, %.3f ms%s\n",
                        where.c_str(), r.device_name.c_str(), r.thread_id.c_str(),
                        r.max_abs_error, r.elapsed_ms,
                        r.custom_kernel ? ", Tandem CUDA kernel ran" : "");
          }
        },
        [&](const caf::error& err) {
          ++failures;
          if (opts.json)
            std::printf("%s\n", nlohmann::json{{"device", where}, {"ok", false},
                                               {"error", sys.render(err)}}
                                  .dump()
                                  .c_str());
          else
            std::printf("FAIL  %-8s %s\n", where.c_str(), sys.render(err).c_str());
        });
    self->send(probe, shutdown_atom::value);
  }
  if (!opts.json)
    std::printf("%zu device(s) probed, %d failed\n", devices.size(), failures);
  return failures == 0 ? 0 : 1;
}

} // namespace

void add_doctor(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
    "doctor", "Check this host end to end: per device, a detached actor runs LibTorch and a "
              "Tandem CUDA kernel and replies");
  auto opts = std::make_shared<doctor_options>();
  cmd->add_option("--device", opts->devices, "CUDA ordinals to probe (-1: the CPU); default: all")
    ->check(number_at_least(-1));
  cmd->add_flag("--cpu", opts->cpu, "Probe the CPU as well");
  cmd->add_option("--timeout", opts->timeout_s, "Seconds to wait for each probe (0.001 to 86400)")
    ->capture_default_str()
    ->check(CLI::Validator(
      [](std::string& text) -> std::string {
        double v = 0;
        if (auto why = read_finite_number(text, v); !why.empty())
          return why;
        return v >= 0.001 && v <= 86400 ? std::string() : "must be from 0.001 to 86400 seconds, got " + text;
      },
      "SECONDS"));
  cmd->add_flag("--json", opts->json, "JSON lines instead of text");
  cmd->callback([opts, &exit_code] { exit_code = run_doctor(*opts); });
}

} // namespace tandem::cli
