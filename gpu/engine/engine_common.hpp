#pragma once
/// What the engines share (gpu/ only, torch): device and dtype options,
/// private generators, scoped current device.

#include <optional>
#include <string>

#include <vector>

#include "gpu/device/error.hpp"
#include "gpu/pch.hpp"
#include "gpu/transport/transport.hpp"

namespace tandem::gpu::detail {

/// −1 → the CPU; n ≥ 0 → CUDA device n, checked to exist.  Throws
/// gpu::error(device_unavailable) naming `who` otherwise.
at::Device engine_device(int32_t index, const std::string& who);

/// "auto" (bfloat16 on CUDA, float32 on the CPU), "float32" or "bfloat16".
/// Throws gpu::error(bad_input) naming `who` for anything else.
at::ScalarType engine_dtype(const std::string& name, const at::Device& device,
                            const std::string& who);

/// "float32", "bfloat16", "float16".
std::string dtype_name(at::ScalarType t);

/// A new generator of `device`'s kind, seeded: never the process-wide
/// default one (DESIGN.md §4).
at::Generator private_generator(const at::Device& device, uint64_t seed);

/// The generator's full state as lowercase hex, and back.  set_generator_state
/// throws gpu::error(bad_input) naming `where` for malformed text or a state
/// of the wrong size for this kind of generator.
std::string generator_state_hex(at::Generator& gen);
void set_generator_state(at::Generator& gen, const std::string& hex, const std::string& where);

/// Makes `device` current on this thread for the scope (no-op on the CPU).
class device_scope {
public:
  explicit device_scope(const at::Device& device);

private:
#ifdef TANDEM_HAVE_CUDA
  std::optional<c10::cuda::CUDAGuard> guard_;
#endif
};

/// Checks a batch payload {tokens [B, S] integers, loss_mask [B, S],
/// doc_lengths [B, K]}; throws gpu::error(bad_input) naming `who` and `h`.
void check_batch_payload(const std::vector<at::Tensor>& t, transport::handle h,
                         const std::string& who);

/// Out of device memory: the allocator's sentence (what it tried to
/// allocate, what the device holds and has free), without the backtrace.
std::string out_of_memory_text(const c10::OutOfMemoryError& e);

/// A LibTorch error out of an engine's work (`doing`: "target engine: the
/// forward") as Tandem's, without LibTorch's backtrace.  The CPU allocator's
/// failure (c10's DefaultCPUAllocator throws a plain c10::Error, not an
/// OutOfMemoryError: "can't allocate memory: you tried to allocate N bytes")
/// is the shapes', as a device's out-of-memory is: `out_of_memory` (bad_input
/// unless said), "<doing> ran out of host memory: …; <out_of_memory_hint>".
/// Anything else is device_failure, "<doing> failed: …".
[[noreturn]] void throw_engine_error(const c10::Error& e, const std::string& doing,
                                     errc out_of_memory = errc::bad_input);

/// What lowers the memory a run needs, for the error that names an
/// out-of-memory (config keys, docs/config.md).
inline constexpr const char* out_of_memory_hint =
  "the shapes do not fit this device: lower data.seq_len, data.rows or data.anchors (or "
  "drafter.layers), put the target and the drafter on separate GPUs (placement.*), or raise "
  "runtime.gpu_memory_fraction if it is below 1";

/// splitmix64: derives independent seeds from one user seed.
uint64_t mix_seed(uint64_t seed, uint64_t stream);

} // namespace tandem::gpu::detail
