#include "gpu/device/runtime.hpp"

#include <torch/headeronly/version.h>
#include <ATen/ATen.h>
#include <torch/cuda.h>

#ifdef TANDEM_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
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

std::string context_error(int32_t device) {
#ifdef TANDEM_HAVE_CUDA
  if (device < 0)
    return "";
  // Sticky errors (CUDA's "the context cannot be used any more" class):
  // every later call in the process returns them.  A transient one (an
  // invalid launch configuration, an allocation that failed) is not among
  // them and leaves the context usable.
  auto sticky = [](cudaError_t e) {
    switch (e) {
      case cudaErrorIllegalAddress:
      case cudaErrorLaunchFailure:
      case cudaErrorHardwareStackError:
      case cudaErrorIllegalInstruction:
      case cudaErrorMisalignedAddress:
      case cudaErrorInvalidAddressSpace:
      case cudaErrorInvalidPc:
      case cudaErrorAssert:
      case cudaErrorLaunchTimeout:
      case cudaErrorECCUncorrectable:
      case cudaErrorContextIsDestroyed:
      case cudaErrorDevicesUnavailable:
        return true;
      default:
        return false;
    }
  };
  int before = 0;
  cudaGetDevice(&before);
  std::string what;
  auto check = [&](cudaError_t e) {
    if (what.empty() && e != cudaSuccess && sticky(e))
      what = cudaGetErrorString(e);
    return e == cudaSuccess;
  };
  if (check(cudaSetDevice(device))) {
    cudaStream_t s = nullptr;
    if (check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking))) {
      check(cudaStreamSynchronize(s));
      cudaStreamDestroy(s);
    }
    cudaEvent_t e = nullptr;
    if (check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming))) {
      check(cudaEventQuery(e));
      cudaEventDestroy(e);
    }
  }
  cudaSetDevice(before);
  return what;
#else
  (void)device;
  return "";
#endif
}

void set_memory_fraction(int32_t device, double fraction) {
#ifdef TANDEM_HAVE_CUDA
  if (device < 0 || fraction >= 1.0)
    return;
  // The allocator sets up its per-device state on the first allocation.
  (void)at::empty({1}, at::TensorOptions().device(at::kCUDA, static_cast<c10::DeviceIndex>(device)));
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(device));
#else
  (void)device;
  (void)fraction;
#endif
}

} // namespace tandem::gpu
