// Real CUDA errors for the fault kinds cuda_error and cuda_sticky
// (gpu/kernels/fault.hpp) and gpu::context_error, which tells the two apart:
// a non-sticky error leaves the context usable; a sticky one (an illegal
// address) loses it for the process.  The sticky case poisons its process,
// so it runs in a child: this binary again, filtered to that test, with
// TANDEM_STICKY_CHILD set.  SKIPPED without a CUDA device.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "gpu/device/runtime.hpp"
#include "gpu/pch.hpp"

#ifdef TANDEM_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>

#include "gpu/kernels/fault.hpp"
#endif

namespace {

bool have_cuda() {
#ifdef TANDEM_HAVE_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

} // namespace

TEST(cuda_faults, a_non_sticky_error_leaves_the_context_usable) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
#ifdef TANDEM_HAVE_CUDA
  auto stream = c10::cuda::getCurrentCUDAStream(0).stream();
  // The launch itself is refused (CUDA 13 says cudaErrorInvalidValue).
  EXPECT_NE(tandem::gpu::kernels::launch_invalid_configuration(stream), cudaSuccess);
  EXPECT_EQ(tandem::gpu::context_error(0), "");
  auto t = at::ones({4}, at::TensorOptions().device(at::kCUDA, 0)) * 2;
  EXPECT_EQ(t.sum().item<float>(), 8.0f);
#endif
}

TEST(cuda_faults, a_sticky_error_is_a_lost_context) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
#ifdef TANDEM_HAVE_CUDA
  if (std::getenv("TANDEM_STICKY_CHILD")) {
    // The child: poison this process's context and report what is seen.
    auto stream = c10::cuda::getCurrentCUDAStream(0).stream();
    const auto launch = tandem::gpu::kernels::launch_illegal_store(stream);
    const auto sync = cudaStreamSynchronize(stream);
    const auto lost = tandem::gpu::context_error(0);
    std::printf("child: launch %s, sync %s, context_error '%s'\n", cudaGetErrorString(launch),
                cudaGetErrorString(sync), lost.c_str());
    std::fflush(stdout);
    std::_Exit(launch == cudaSuccess && sync == cudaErrorIllegalAddress && !lost.empty() ? 0 : 1);
  }
  char self[4096] = {};
  const auto n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(n, 0);
  const std::string cmd = std::string("TANDEM_STICKY_CHILD=1 '") + self
                          + "' --gtest_filter=cuda_faults.a_sticky_error_is_a_lost_context";
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc)) << cmd;
  EXPECT_EQ(WEXITSTATUS(rc), 0) << "the child did not see a lost context: " << cmd;
  // This process's context is untouched.
  EXPECT_EQ(tandem::gpu::context_error(0), "");
#endif
}
