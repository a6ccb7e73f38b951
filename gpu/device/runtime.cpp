#include "gpu/device/runtime.hpp"

#include <torch/headeronly/version.h>
#include <torch/cuda.h>

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef TANDEM_HAVE_NCCL
#include <nccl.h>
#endif

namespace tandem::gpu {

runtime_info query_runtime() {
  runtime_info info;
  info.torch_version = std::to_string(TORCH_VERSION_MAJOR) + "."
                       + std::to_string(TORCH_VERSION_MINOR) + "."
                       + std::to_string(TORCH_VERSION_PATCH);
#ifdef TANDEM_HAVE_CUDA
  info.cuda_compiled = true;
  cudaRuntimeGetVersion(&info.cuda_runtime);
  if (cudaDriverGetVersion(&info.cuda_driver) != cudaSuccess)
    info.cuda_driver = 0;
#endif
  info.torch_cuda = torch::cuda::is_available();
#ifdef TANDEM_HAVE_NCCL
  int v = 0;
  if (ncclGetVersion(&v) == ncclSuccess) {
    // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
    info.nccl_version = std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100)
                        + "." + std::to_string(v % 100);
  }
#endif
  if (!info.torch_cuda)
    return info;
  const auto count = static_cast<int32_t>(torch::cuda::device_count());
  for (int32_t i = 0; i < count; ++i) {
    device_info d;
    d.index = i;
#ifdef TANDEM_HAVE_CUDA
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) {
      d.name = prop.name;
      d.compute_major = prop.major;
      d.compute_minor = prop.minor;
      d.memory_gib = static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
    }
#else
    d.name = "cuda:" + std::to_string(i);
#endif
    info.devices.push_back(d);
  }
  return info;
}

} // namespace tandem::gpu
