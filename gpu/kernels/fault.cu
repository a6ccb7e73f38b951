#include "gpu/kernels/fault.hpp"

#include <cstdint>

namespace tandem::gpu::kernels {

namespace {

__global__ void nothing() {}

__global__ void store_to(float* where) {
  *where = 1.0f;
}

} // namespace

cudaError_t launch_invalid_configuration(cudaStream_t stream) {
  nothing<<<dim3(1), dim3(4096), 0, stream>>>();  // more threads a block than any device allows
  return cudaGetLastError();
}

cudaError_t launch_illegal_store(cudaStream_t stream) {
  // Low addresses are never mapped in a CUDA context.
  store_to<<<1, 1, 0, stream>>>(reinterpret_cast<float*>(uintptr_t{0x100}));
  return cudaGetLastError();
}

} // namespace tandem::gpu::kernels
