#include "gpu/engine/target_engine.hpp"

#include <optional>

#include "gpu/engine/batch.hpp"
#include "gpu/engine/engine_common.hpp"
#include "gpu/engine/target_forward.hpp"
#include "gpu/device/error.hpp"
#include "gpu/models/qwen3.hpp"
#include "gpu/pch.hpp"
#include "gpu/transport/tensors.hpp"

namespace tandem::gpu {

struct target_engine::impl {
  at::Device device{at::kCPU};
  at::ScalarType dtype = at::kFloat;
  std::optional<qwen3_target> target;
  target_info info;
  std::optional<target_forward_runner> runner;

  explicit impl(const target_engine_options& o) {
    const std::string who = "target engine (" + o.dir.string() + ")";
    device = detail::engine_device(o.device, who);
    dtype = detail::engine_dtype(o.dtype, device, who);
    detail::device_scope scope(device);
    target.emplace(qwen3_target::load(o.dir, device, dtype, o.tap_ids));
    const auto& c = target->config();
    info.vocab_size = c.vocab_size;
    info.hidden_size = c.hidden_size;
    info.num_layers = c.num_hidden_layers;
    info.tap_ids = target->tap_ids();
    info.dtype = detail::dtype_name(dtype);
    info.device = device.is_cuda() ? device.index() : -1;
    runner.emplace(*target, device, "");  // TANDEM_TARGET_PATH picks the mode
    info.path = runner->path();
  }
};

target_engine::target_engine(const target_engine_options& opts) {
  try {
    impl_ = std::make_unique<impl>(opts);
  } catch (const c10::OutOfMemoryError& e) {
    throw error(errc::bad_input, "target engine (" + opts.dir.string() + "): out of device memory while loading "
                                   "the target: " + detail::out_of_memory_text(e) + "; " + detail::out_of_memory_hint);
  } catch (const c10::Error& e) {
    detail::throw_engine_error(e, "target engine (" + opts.dir.string() + "): loading the target");
  }
}
target_engine::~target_engine() = default;
target_engine::target_engine(target_engine&&) noexcept = default;
target_engine& target_engine::operator=(target_engine&&) noexcept = default;

const target_info& target_engine::info() const {
  return impl_->info;
}

transport::handle target_engine::forward(transport::handle batch) {
  auto& m = *impl_;
  detail::device_scope scope(m.device);
  at::NoGradGuard no_grad;
  auto t = transport::acquire(batch, m.device);
  detail::check_batch_payload(t, batch, "target engine");
  at::Tensor taps;
  try {
    taps = m.runner->taps(t[0].to(at::kLong), t[2].to(m.device, at::kLong));
  } catch (const c10::OutOfMemoryError& e) {
    // Every forward has the same shapes: running out is the shapes', on the
    // first batch as on any other.
    throw error(errc::bad_input, "target engine: the forward ran out of device memory: " + detail::out_of_memory_text(e)
                                   + "; " + detail::out_of_memory_hint);
  } catch (const c10::Error& e) {
    detail::throw_engine_error(e, "target engine: the forward");  // the CPU's allocator: as the device's above
  }
  transport::payload p;
  p.tensors = {taps};
#ifdef TANDEM_HAVE_CUDA
  if (m.device.is_cuda()) {
    p.ready = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
    p.ready->record(c10::cuda::getCurrentCUDAStream(m.device.index()));
  }
#endif
  return transport::publish(std::move(p), transport::scope::host);
}

} // namespace tandem::gpu
