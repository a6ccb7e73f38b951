#include "gpu/engine/engine_common.hpp"

#include <mutex>

#include "gpu/device/error.hpp"
#include "gpu/device/shape_text.hpp"

#ifdef TANDEM_HAVE_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace tandem::gpu::detail {

void check_batch_payload(const std::vector<at::Tensor>& t, transport::handle h,
                         const std::string& who) {
  const auto where = who + ": batch payload " + std::to_string(h);
  if (t.size() != 3)
    throw error(errc::bad_input, where + " has " + std::to_string(t.size())
                                   + " tensors, expected {tokens, loss_mask, doc_lengths}");
  if (t[0].dim() != 2 || !at::isIntegralType(t[0].scalar_type(), /*includeBool=*/false))
    throw error(errc::bad_input, where + ": tokens must be [B, S] integers, got "
                                   + shape_text(t[0].sizes()) + " "
                                   + c10::toString(t[0].scalar_type()));
  if (t[1].sizes() != t[0].sizes())
    throw error(errc::bad_input, where + ": loss_mask has shape " + shape_text(t[1].sizes())
                                   + ", tokens " + shape_text(t[0].sizes()));
  if (t[2].dim() != 2 || t[2].size(0) != t[0].size(0))
    throw error(errc::bad_input, where + ": doc_lengths must be [B, K] with B = "
                                   + std::to_string(t[0].size(0)) + ", got "
                                   + shape_text(t[2].sizes()));
}

at::Device engine_device(int32_t index, const std::string& who) {
  if (index < 0)
    return at::Device(at::kCPU);
#ifdef TANDEM_HAVE_CUDA
  if (!torch::cuda::is_available())
    throw error(errc::device_unavailable, who + ": CUDA device " + std::to_string(index)
                                            + " asked for, but no CUDA device is available");
  const auto count = static_cast<int32_t>(torch::cuda::device_count());
  if (index >= count)
    throw error(errc::device_unavailable, who + ": CUDA device " + std::to_string(index)
                                            + " asked for, this host has " + std::to_string(count));
  // cuDNN's SDPA backend can allocate device memory on its first use inside
  // a graph capture, and the capture then fails
  // (CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED): seen on the
  // H200 when several drafter engines of one process captured their first
  // graphs on the tiny fixture (gpu.graph.eight_engines_…), once the target
  // no longer ran cuDNN first.  Tandem's own kernels cover the mainline
  // attention; the SDPA fallbacks use the flash / memory-efficient / math
  // backends, which capture.
  static std::once_flag no_cudnn_sdpa;
  std::call_once(no_cudnn_sdpa, [] { at::globalContext().setSDPUseCuDNN(false); });
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
#else
  throw error(errc::device_unavailable, who + ": CUDA device " + std::to_string(index)
                                          + " asked for, but Tandem was built without CUDA");
#endif
}

at::ScalarType engine_dtype(const std::string& name, const at::Device& device,
                            const std::string& who) {
  if (name == "auto")
    return device.is_cuda() ? at::kBFloat16 : at::kFloat;
  if (name == "float32")
    return at::kFloat;
  if (name == "bfloat16")
    return at::kBFloat16;
  throw error(errc::bad_input, who + ": dtype '" + name
                                 + "' is not one of auto, float32, bfloat16");
}

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: return c10::toString(t);
  }
}

at::Generator private_generator(const at::Device& device, uint64_t seed) {
  at::Generator gen;
#ifdef TANDEM_HAVE_CUDA
  if (device.is_cuda())
    gen = at::cuda::detail::createCUDAGenerator(device.index());
  else
#endif
    gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
  return gen;
}

std::string generator_state_hex(at::Generator& gen) {
  at::Tensor state;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    state = gen.get_state();
  }
  state = state.to(at::kCPU).contiguous();
  static const char digits[] = "0123456789abcdef";
  const auto* p = state.data_ptr<uint8_t>();
  std::string out;
  out.reserve(2 * state.numel());
  for (int64_t i = 0; i < state.numel(); ++i) {
    out.push_back(digits[p[i] >> 4]);
    out.push_back(digits[p[i] & 15]);
  }
  return out;
}

void set_generator_state(at::Generator& gen, const std::string& hex, const std::string& where) {
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw error(errc::bad_input, where + ": not hexadecimal");
  };
  if (hex.size() % 2 != 0)
    throw error(errc::bad_input, where + ": odd number of hex digits");
  auto bytes = at::empty({static_cast<int64_t>(hex.size() / 2)}, at::kByte);
  auto* p = bytes.data_ptr<uint8_t>();
  for (size_t i = 0; i < hex.size() / 2; ++i)
    p[i] = static_cast<uint8_t>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  at::Tensor current;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    current = gen.get_state();
  }
  if (current.numel() != bytes.numel())
    throw error(errc::bad_input, where + ": " + std::to_string(bytes.numel())
                                   + " bytes of generator state, this device's generator has "
                                   + std::to_string(current.numel())
                                   + " (a checkpoint of another device kind?)");
  try {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(bytes);
  } catch (const c10::Error& e) {
    throw error(errc::bad_input, where + ": rejected by the generator: " + e.what_without_backtrace());
  }
}

device_scope::device_scope(const at::Device& device) {
#ifdef TANDEM_HAVE_CUDA
  if (device.is_cuda())
    guard_.emplace(device.index());
#else
  (void)device;
#endif
}

uint64_t mix_seed(uint64_t seed, uint64_t stream) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (stream + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::string out_of_memory_text(const c10::OutOfMemoryError& e) {
  std::string text = e.what_without_backtrace();
  // The allocator appends advice about PYTORCH_CUDA_ALLOC_CONF, which a
  // Tandem user does not set: keep its first two sentences.
  if (auto cut = text.find(" If reserved but unallocated"); cut != std::string::npos)
    text.resize(cut);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' '))
    text.pop_back();
  return text;
}

void throw_engine_error(const c10::Error& e, const std::string& doing, errc out_of_memory) {
  const std::string text = e.what_without_backtrace();
  if (text.find("can't allocate memory") != std::string::npos)
    throw error(out_of_memory, doing + " ran out of host memory: " + text + "; " + out_of_memory_hint);
  throw error(errc::device_failure, doing + " failed: " + text);
}

} // namespace tandem::gpu::detail
