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

/// "" while CUDA device `device`'s context in this process still works;
/// else the sticky error that poisoned it ("an illegal memory access was
/// encountered"), after which no CUDA call on it can succeed again in this
/// process (errc::device_lost).  Asks with calls that cannot block on other
/// threads' work (an empty stream of its own); on the thread that owns the
/// device.  "" on the CPU (device < 0) and without CUDA.
std::string context_error(int32_t device);

/// Limits the caching allocator on `device` to `fraction` of its memory
/// (runtime.gpu_memory_fraction; ≥ 1: no limit).  No-op on the CPU.
void set_memory_fraction(int32_t device, double fraction);

} // namespace tandem::gpu
