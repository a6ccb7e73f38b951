#include <cstdio>

#include <nlohmann/json.hpp>

#include "build_info.hpp"
#include "commands.hpp"
#include "resources.hpp"
#include "gpu/device/runtime.hpp"

namespace tandem::cli {

namespace {

nlohmann::json info_json() {
  auto rt = gpu::query_runtime();
  nlohmann::json devices = nlohmann::json::array();
  for (const auto& d : rt.devices)
    devices.push_back({{"index", d.index},
                       {"name", d.name},
                       {"compute_capability", std::to_string(d.compute_major) + "."
                                                + std::to_string(d.compute_minor)},
                       {"memory_gib", d.memory_gib}});
  return {
    {"tandem", build::version},
    {"git_commit", build::git_commit},
    {"build_type", build::build_type},
    {"caf", build::caf_version},
    {"libtorch", rt.torch_version},
    {"cuda_compiled", rt.cuda_compiled},
    {"cuda_architectures", build::cuda_architectures},
    {"cuda_runtime", rt.cuda_runtime},
    {"cuda_driver", rt.cuda_driver},
    {"torch_cuda_available", rt.torch_cuda},
    {"nccl", rt.nccl_version},
    {"resources", resource_root().string()},
    {"python", prepare_python()},
    {"devices", devices},
  };
}

} // namespace

void add_info(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("info", "Print versions, build options and visible devices");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "One JSON object instead of text");
  cmd->callback([json, &exit_code] {
    auto j = info_json();
    if (*json) {
      std::printf("%s\n", j.dump().c_str());
    } else {
      for (auto& [key, value] : j.items())
        if (key != "devices")
          std::printf("%-22s %s\n", key.c_str(),
                      value.is_string() ? value.get<std::string>().c_str() : value.dump().c_str());
      if (j["devices"].empty())
        std::printf("%-22s none (CPU only)\n", "devices");
      for (auto& d : j["devices"])
        std::printf("%-22s cuda:%d %s (sm %s, %.0f GiB)\n", "device",
                    d["index"].get<int>(), d["name"].get<std::string>().c_str(),
                    d["compute_capability"].get<std::string>().c_str(),
                    d["memory_gib"].get<double>());
    }
    exit_code = 0;
  });
}

} // namespace tandem::cli
