#include "gpu/nccl/flat_bucket.hpp"

#include <string>

#include "gpu/device/error.hpp"
#include "gpu/device/shape_text.hpp"

namespace tandem::gpu::nccl {

namespace {

int64_t round_up(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

void check_for_collective(const communicator& comm, const at::Tensor& t, const char* what) {
#ifndef TANDEM_HAVE_CUDA
  throw error(errc::device_unavailable,
              std::string("nccl: ") + what + ": Tandem was built without CUDA");
#endif
  if (!t.defined() || !t.is_cuda())
    throw error(errc::bad_input, comm.describe() + ": " + what + ": needs a CUDA tensor, got "
                                   + (t.defined() ? t.device().str() : std::string("undefined")));
  if (t.device().index() != comm.device())
    throw error(errc::bad_input, comm.describe() + ": " + what + ": tensor on " + t.device().str()
                                   + ", communicator on cuda:" + std::to_string(comm.device()));
  if (!t.is_contiguous())
    throw error(errc::bad_input, comm.describe() + ": " + what + ": tensor " + shape_text(t.sizes())
                                   + " is not contiguous");
}

cuda_stream current_stream(const at::Tensor& t) {
#ifdef TANDEM_HAVE_CUDA
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
#else
  (void)t;
  throw error(errc::device_unavailable, "nccl: Tandem was built without CUDA");
#endif
}

} // namespace

flat_bucket::flat_bucket(std::vector<at::Tensor>& grads, int64_t alignment) {
  if (alignment < 1)
    throw error(errc::bad_input, "flat_bucket: alignment must be ≥ 1 element");
  if (grads.empty())
    return;
  for (size_t i = 0; i < grads.size(); ++i) {
    const auto& g = grads[i];
    const auto where = "flat_bucket: gradient " + std::to_string(i);
    if (!g.defined())
      throw error(errc::bad_input, where + " is undefined");
    if (g.scalar_type() != at::kFloat)
      throw error(errc::bad_input, where + " " + shape_text(g.sizes()) + " is "
                                     + std::string(c10::toString(g.scalar_type()))
                                     + ", the bucket holds float32 (the fp32 gradients of the "
                                       "masters)");
    if (g.device() != grads[0].device())
      throw error(errc::bad_input, where + " is on " + g.device().str() + ", gradient 0 on "
                                     + grads[0].device().str() + " (one bucket per device)");
  }
  int64_t total = 0;
  offsets_.reserve(grads.size());
  for (const auto& g : grads) {
    offsets_.push_back(total);
    total += round_up(g.numel(), alignment);
  }
  at::NoGradGuard no_grad;
  flat_ = at::zeros({total}, at::TensorOptions().dtype(at::kFloat).device(grads[0].device()));
  views_.reserve(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    auto view = flat_.narrow(0, offsets_[i], grads[i].numel()).view(grads[i].sizes());
    view.copy_(grads[i]);
    views_.push_back(view);
    grads[i] = view;
  }
}

flat_bucket flat_bucket::of_param_grads(std::vector<at::Tensor>& params, int64_t alignment) {
  std::vector<at::Tensor> grads;
  grads.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined())
      throw error(errc::bad_input, "flat_bucket: parameter " + std::to_string(i) + " is undefined");
    auto g = params[i].grad();
    grads.push_back(g.defined() ? g : at::zeros_like(params[i]));
  }
  flat_bucket bucket(grads, alignment);
  for (size_t i = 0; i < params.size(); ++i)
    params[i].mutable_grad() = bucket.views_[i];
  return bucket;
}

void flat_bucket::zero_() {
  if (flat_.defined())
    flat_.zero_();
}

at::Tensor global_norm(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty())
    throw error(errc::bad_input, "global_norm: no tensors");
  at::NoGradGuard no_grad;
  auto norms = at::_foreach_norm(tensors, 2);
  return at::linalg_vector_norm(at::stack(norms), 2).to(at::kFloat);
}

at::Tensor clip_(const std::vector<at::Tensor>& tensors, double max_norm, const at::Tensor& norm) {
  if (!norm.defined() || norm.numel() != 1)
    throw error(errc::bad_input, "clip_: the norm must be a one-element tensor");
  at::NoGradGuard no_grad;
  if (max_norm <= 0)
    return at::ones({}, norm.options().dtype(at::kFloat));
  auto coef = at::clamp_max(max_norm / (norm.reshape({}).to(at::kFloat) + 1e-6), 1.0);
  if (!tensors.empty())
    at::_foreach_mul_(tensors, coef);
  return coef;
}

element_type element_type_of(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return element_type::f32;
    case at::kBFloat16: return element_type::bf16;
    case at::kHalf: return element_type::f16;
    case at::kDouble: return element_type::f64;
    case at::kInt: return element_type::i32;
    case at::kLong: return element_type::i64;
    case at::kByte: return element_type::u8;
    case at::kChar: return element_type::i8;
    default:
      throw error(errc::bad_input, std::string("nccl: no NCCL type for ") + c10::toString(type));
  }
}

void all_reduce(communicator& comm, const at::Tensor& tensor, reduce_op op,
                const collective_options& options) {
  check_for_collective(comm, tensor, "all_reduce");
  comm.all_reduce(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                  element_type_of(tensor.scalar_type()), op, current_stream(tensor), options);
}

void broadcast(communicator& comm, const at::Tensor& tensor, int root,
               const collective_options& options) {
  check_for_collective(comm, tensor, "broadcast");
  comm.broadcast(tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                 element_type_of(tensor.scalar_type()), root, current_stream(tensor), options);
}

void send(communicator& comm, const at::Tensor& tensor, int peer, const collective_options& options) {
  check_for_collective(comm, tensor, "send");
  comm.send(tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
            element_type_of(tensor.scalar_type()), peer, current_stream(tensor), options);
}

void recv(communicator& comm, const at::Tensor& tensor, int peer, const collective_options& options) {
  check_for_collective(comm, tensor, "recv");
  comm.recv(tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
            element_type_of(tensor.scalar_type()), peer, current_stream(tensor), options);
}

} // namespace tandem::gpu::nccl
