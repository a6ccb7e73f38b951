#pragma once
/// What this process can compute on: versions and devices.
/// Torch-free facade (actors/ and tools/ include it).

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::gpu {

struct device_info {
  int32_t index = 0;
  std::string name;            ///< "NVIDIA H200"
  int32_t compute_major = 0;   ///< 9 for Hopper
  int32_t compute_minor = 0;
  double memory_gib = 0;       ///< total device memory
};

struct runtime_info {
  std::string torch_version;      ///< LibTorch compiled against (TORCH_VERSION)
  bool cuda_compiled = false;     ///< Tandem's own CUDA code paths built in
  bool torch_cuda = false;        ///< LibTorch has CUDA support
  int32_t cuda_runtime = 0;       ///< cudaRuntimeGetVersion, e.g. 13000
  int32_t cuda_driver = 0;        ///< cudaDriverGetVersion; 0 = no driver
  std::string nccl_version;       ///< "2.28.9", or "" when not built with NCCL
  std::vector<device_info> devices;  ///< empty on a host without GPUs
};

/// Queries the runtime. Never throws for a missing driver or GPU: an empty
/// device list is the answer then.
runtime_info query_runtime();

} // namespace tandem::gpu
