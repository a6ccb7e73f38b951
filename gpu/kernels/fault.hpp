#pragma once
/// Real CUDA errors on demand, for the fault kinds of `tandem run --fault`
/// (cuda_error, cuda_sticky) that test the restore tiers (DESIGN.md §3).
/// No LibTorch here: plain streams.

#include <cuda_runtime_api.h>

namespace tandem::gpu::kernels {

/// Launches a kernel of 4096 threads a block on `stream`: the launch itself
/// fails with cudaErrorInvalidConfiguration, a non-sticky error (cleared by
/// cudaGetLastError; the context stays usable).  Returns the launch's code.
cudaError_t launch_invalid_configuration(cudaStream_t stream);

/// Launches a kernel that stores to an address no allocation holds: the
/// launch succeeds, and the stream's next synchronisation fails with
/// cudaErrorIllegalAddress, a sticky error that poisons the context for
/// the rest of the process.  Returns the launch's code.
cudaError_t launch_illegal_store(cudaStream_t stream);

} // namespace tandem::gpu::kernels
