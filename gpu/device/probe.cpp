#include "gpu/device/probe.hpp"

#include <chrono>
#include <sstream>
#include <thread>

#include "gpu/device/error.hpp"
#include "gpu/pch.hpp"

#ifdef TANDEM_HAVE_CUDA
#include "gpu/kernels/scale_add.hpp"
#endif

namespace tandem::gpu {
namespace {

constexpr int64_t probe_n = 256;
constexpr double scale = 0.5;
constexpr double shift = 0.25;

std::string this_thread_text() {
  std::ostringstream os;
  os << std::this_thread::get_id();
  return os.str();
}

/// Inputs from a private generator: the global CPU generator is shared by
/// every thread of the process (DESIGN.md §4), so actors never draw from it.
std::pair<at::Tensor, at::Tensor> probe_inputs() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(20261130);
  auto opts = at::TensorOptions().dtype(at::kDouble);
  auto a = at::rand({probe_n, probe_n}, gen, opts) * 2 - 1;
  auto b = at::rand({probe_n, probe_n}, gen, opts) * 2 - 1;
  return {a, b};
}

} // namespace

probe_report run_probe(int32_t device) {
  at::NoGradGuard no_grad;
  probe_report report;
  report.device = device;
  report.thread_id = this_thread_text();
  auto [a, b] = probe_inputs();
  auto reference = a.matmul(b) * scale + shift;  // float64, on the host
  at::Tensor result;

  if (device == cpu_device) {
    report.backend = "cpu";
    report.device_name = "cpu";
    auto t0 = std::chrono::steady_clock::now();
    result = a.to(at::kFloat).matmul(b.to(at::kFloat)) * scale + shift;
    report.elapsed_ms
      = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  } else {
#ifdef TANDEM_HAVE_CUDA
    const auto count = static_cast<int32_t>(torch::cuda::device_count());
    if (device < 0 || device >= count)
      throw error(errc::device_unavailable, "cuda:" + std::to_string(device)
                                              + " requested, this host has "
                                              + std::to_string(count) + " CUDA device(s)");
    report.backend = "cuda";
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    report.device_name = at::cuda::getDeviceProperties(device)->name;
    auto stream = c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(device));
    c10::cuda::CUDAStreamGuard stream_guard(stream);
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    auto dev = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device));
    auto a_d = a.to(at::kFloat).to(dev);
    auto b_d = b.to(at::kFloat).to(dev);
    start.record(stream);
    auto product = a_d.matmul(b_d);
    auto out = at::empty_like(product);
    auto rc = kernels::scale_add(out.data_ptr<float>(), product.data_ptr<float>(),
                                 static_cast<float>(scale), static_cast<float>(shift),
                                 product.numel(), stream.stream());
    if (rc != cudaSuccess)
      throw error(errc::device_failure,
                  std::string("scale_add kernel launch failed: ") + cudaGetErrorString(rc));
    stop.record(stream);
    stream.synchronize();
    report.elapsed_ms = start.elapsed_time(stop);
    report.custom_kernel = true;
    result = out.cpu();
#else
    throw error(errc::device_unavailable,
                "cuda:" + std::to_string(device) + " requested, Tandem was built without CUDA");
#endif
  }
  report.max_abs_error = (result.to(at::kDouble) - reference).abs().max().item<double>();
  if (!(report.max_abs_error <= probe_tolerance))
    throw error(errc::wrong_result, report.backend + " probe off by "
                                      + std::to_string(report.max_abs_error) + " (tolerance "
                                      + std::to_string(probe_tolerance) + ")");
  return report;
}

} // namespace tandem::gpu
