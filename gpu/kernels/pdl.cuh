#pragma once
/// Programmatic dependent launch (Hopper): a kernel launched with
/// launch_pdl may begin while the kernel before it on the stream is still
/// finishing; it must call pdl_wait() before it touches anything that kernel
/// writes (griddepcontrol.wait: the previous grid has completed and its
/// writes are visible).  What it does before the wait may only read memory
/// nothing on the stream writes (e.g. weights).  pdl_trigger() lets the next
/// such kernel start launching.  Used by the decode GEMV (decode_gemv.cu),
/// whose weight loads need nothing from the kernel before; on the decode
/// step's other kernels it measured slower (docs/bench.md, target_decode).
/// TANDEM_PDL=0 in the environment launches plainly (the instructions are
/// then no-ops).  Device code and launches; .cu only.

#include <cstdlib>
#include <cstring>
#include <utility>

#include <cuda_runtime_api.h>

namespace tandem::gpu::kernels {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// Whether launch_pdl asks for programmatic serialization (TANDEM_PDL ≠ 0).
inline bool pdl_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("TANDEM_PDL");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

template <typename... Params, typename... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

} // namespace tandem::gpu::kernels
