#include "gpu/transport/nccl.hpp"

#include <algorithm>
#include <utility>

#include "gpu/device/error.hpp"
#include "gpu/nccl/flat_bucket.hpp"
#include "gpu/device/shape_text.hpp"
#include "gpu/transport/tensors.hpp"

#ifdef TANDEM_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace tandem::gpu::transport {

// ─── specs (no device needed) ───────────────────────────────────────────────

int64_t tensor_spec::numel() const {
  int64_t n = 1;
  for (auto d : shape)
    n *= d;
  return n;
}

int64_t tensor_spec::bytes() const {
  return dtype == at::ScalarType::Undefined
           ? 0
           : numel() * static_cast<int64_t>(c10::elementSize(dtype));
}

bool operator==(const tensor_spec& a, const tensor_spec& b) {
  return a.dtype == b.dtype && a.shape == b.shape;
}

bool operator!=(const tensor_spec& a, const tensor_spec& b) {
  return !(a == b);
}

std::string to_string(const tensor_spec& s) {
  return shape_text(s.shape) + " " + c10::toString(s.dtype);
}

std::vector<tensor_spec> specs_of(const std::vector<at::Tensor>& tensors) {
  std::vector<tensor_spec> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (!t.defined())
      out.push_back({});
    else
      out.push_back({t.sizes().vec(), t.scalar_type()});
  }
  return out;
}

std::vector<tensor_spec> specs_of(handle h) {
  return specs_of(peek(h)->tensors);  // no copy, no wait
}

std::vector<tensor_spec> batch_specs(const batch_desc& desc, int64_t max_docs) {
  if (max_docs < 1)
    throw error(errc::bad_input, "transport: batch " + std::to_string(desc.batch_id)
                                   + ": max_docs must be ≥ 1, got " + std::to_string(max_docs));
  return {{{desc.rows, desc.seq_len}, at::kInt},
          {{desc.rows, desc.seq_len}, at::kByte},
          {{desc.rows, max_docs}, at::kLong}};
}

std::vector<tensor_spec> feature_specs(const features_desc& desc, at::ScalarType dtype) {
  return {{desc.shape, dtype}};
}

std::vector<tensor_spec> feature_specs(const features_desc& desc) {
  if (desc.dtype == "bfloat16")
    return feature_specs(desc, at::kBFloat16);
  if (desc.dtype == "float16")
    return feature_specs(desc, at::kHalf);
  if (desc.dtype == "float32")
    return feature_specs(desc, at::kFloat);
  throw error(errc::bad_input, "transport: features of batch " + std::to_string(desc.batch_id)
                                 + " name dtype '" + desc.dtype
                                 + "', not one of bfloat16, float16, float32");
}

void check_specs(const std::vector<tensor_spec>& specs, const std::string& what) {
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& s = specs[i];
    if (s.dtype == at::ScalarType::Undefined)
      throw error(errc::bad_input, what + ": tensor " + std::to_string(i) + " "
                                     + shape_text(s.shape) + " has no dtype");
    if (std::any_of(s.shape.begin(), s.shape.end(), [](int64_t d) { return d < 0; }))
      throw error(errc::bad_input, what + ": tensor " + std::to_string(i) + " " + to_string(s)
                                     + " has a negative size");
  }
}

void check_matches(const std::vector<tensor_spec>& held, const std::vector<tensor_spec>& expected,
                   const std::string& what) {
  if (held.size() != expected.size())
    throw error(errc::bad_input, what + ": the payload holds " + std::to_string(held.size())
                                   + " tensors, the receiver expects " + std::to_string(expected.size()));
  for (size_t i = 0; i < held.size(); ++i) {
    if (held[i] == expected[i])
      continue;
    const char* differs = held[i].shape != expected[i].shape
                            ? (held[i].dtype != expected[i].dtype ? "shape and dtype" : "shape")
                            : "dtype";
    throw error(errc::bad_input, what + ": tensor " + std::to_string(i) + " is "
                                   + to_string(held[i]) + ", the receiver expects "
                                   + to_string(expected[i]) + " (" + differs + " differ)");
  }
}

// ─── NCCL send/recv ─────────────────────────────────────────────────────────

#ifdef TANDEM_HAVE_CUDA

namespace {

using steady = std::chrono::steady_clock;

/// What is left of the call's deadline, at least 1 ms (0 would mean the
/// communicator's default to nccl::collective_options).
std::chrono::milliseconds left(steady::time_point deadline) {
  const auto d = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now());
  return std::max(d, std::chrono::milliseconds(1));
}

/// The tensor's bytes as one flat Byte tensor (a view; `t` is contiguous):
/// the wire format, whatever the dtype.
at::Tensor bytes_view(const at::Tensor& t) {
  return t.reshape({-1}).view(at::kByte);
}

void check_peer(const nccl::communicator& comm, int peer, const std::string& what) {
  if (peer < 0 || peer >= comm.world() || peer == comm.rank())
    throw error(errc::bad_input, what + ": peer " + std::to_string(peer)
                                   + (peer == comm.rank()
                                        ? " is this rank itself (within a process use "
                                          "acquire / the peer copy)"
                                        : " is not a rank of a world of " + std::to_string(comm.world())));
}

void check_usable(const nccl::communicator& comm, const std::string& what) {
  if (!comm.usable())
    throw error(errc::device_failure, what + ": the communicator is not usable ("
                                        + (comm.failure().empty() ? "closed" : comm.failure()) + ")");
}

void check_stream(const nccl::communicator& comm, const c10::cuda::CUDAStream& s, const char* role,
                  const std::string& what) {
  if (s.device_index() != comm.device())
    throw error(errc::bad_input, what + ": the " + role + " is on cuda:"
                                   + std::to_string(s.device_index())
                                   + ", the communicator on cuda:" + std::to_string(comm.device()));
}

/// Runs one NCCL call of tensor `i` of transfer `op`; an error names the
/// transfer and the tensor: "<rank>: <op>, tensor 2 [4, 8] BFloat16: <NCCL's
/// error, without the rank again>".
template <class F>
void per_tensor(const nccl::communicator& comm, const std::string& op, size_t i,
                const at::Tensor& t, F&& call) {
  try {
    call();
  } catch (const error& e) {
    std::string inner = e.what();
    const auto prefix = comm.describe() + ": ";
    if (inner.compare(0, prefix.size(), prefix) == 0)
      inner.erase(0, prefix.size());
    throw error(e.code(), prefix + op + ", tensor " + std::to_string(i) + " "
                            + to_string(tensor_spec{t.sizes().vec(), t.scalar_type()}) + ": "
                            + inner);
  }
}

/// Receives into `dst` (contiguous, on comm's device) on `copy_stream`, which
/// is already ordered after everything the receive depends on.
std::shared_ptr<at::cuda::CUDAEvent> recv_all(nccl::communicator& comm, int peer,
                                              const std::vector<at::Tensor>& dst,
                                              const c10::cuda::CUDAStream& copy_stream,
                                              const c10::cuda::CUDAStream& compute_stream,
                                              const transfer_options& options,
                                              steady::time_point deadline, const std::string& op) {
  c10::cuda::CUDAStreamGuard on_copy(copy_stream);
  for (size_t i = 0; i < dst.size(); ++i) {
    const auto& t = dst[i];
    if (t.numel() == 0)
      continue;
    per_tensor(comm, op, i, t, [&] {
      nccl::collective_options o;
      o.timeout = left(deadline);
      nccl::recv(comm, bytes_view(t), peer, o);
    });
    // Whoever drops the last reference first, the memory is not reused
    // before the receive, nor before the consumer's reads on its stream.
    c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), copy_stream);
    c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), compute_stream);
  }
  auto done = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
  done->record(copy_stream);
  done->block(compute_stream);
  if (options.wait)
    comm.wait(copy_stream.stream(), left(deadline), op);
  return done;
}

/// "NCCL rank 0 of 2 on cuda:0 (transport): recv_payload from rank 1".
std::string with_rank(const nccl::communicator& comm, const std::string& op) {
  return comm.describe() + ": " + op;
}

} // namespace

std::shared_ptr<at::cuda::CUDAEvent> send_payload(nccl::communicator& comm, int peer, handle h,
                                                  const std::vector<tensor_spec>& expected,
                                                  const c10::cuda::CUDAStream& stream,
                                                  const transfer_options& options) {
  const auto deadline = steady::now() + options.timeout;
  const auto op = "send_payload of handle " + std::to_string(h) + " to rank " + std::to_string(peer);
  const auto what = with_rank(comm, op);
  // Every check before the first NCCL call: a refused send leaves the pair of
  // ranks in step (the consumer posts no recv when told of the error).
  check_peer(comm, peer, what);
  check_stream(comm, stream, "send stream", what);
  check_usable(comm, what);
  std::vector<tensor_spec> held;
  try {
    held = specs_of(h);
  } catch (const error& e) {
    throw error(e.code(), what + ": " + e.what());
  }
  check_matches(held, expected, what);

  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(comm.device()));
  c10::cuda::CUDAGuard on_device(device.index());
  c10::cuda::CUDAStreamGuard on_stream(stream);
  // The stream waits on the payload's ready event; the payload's tensors on
  // this device come back as they are, known to the allocator as used on
  // `stream`; others are copied here first.
  auto tensors = acquire(h, device);
  for (auto& t : tensors)
    if (!t.is_contiguous())
      t = t.contiguous();  // a copy on `stream`, row-major as the receiver allocates
  check_matches(specs_of(tensors), expected, what);  // the registry is immutable: a formality

  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (t.numel() == 0)
      continue;
    per_tensor(comm, op, i, t, [&] {
      nccl::collective_options o;
      o.timeout = left(deadline);
      nccl::send(comm, bytes_view(t), peer, o);
    });
  }
  auto sent = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
  sent->record(stream);
  if (options.wait)
    comm.wait(stream.stream(), left(deadline), op);
  return sent;
}

received_payload recv_payload(nccl::communicator& comm, int peer,
                              const std::vector<tensor_spec>& specs, const at::Device& device,
                              const c10::cuda::CUDAStream& copy_stream,
                              const c10::cuda::CUDAStream& compute_stream,
                              const transfer_options& options) {
  const auto deadline = steady::now() + options.timeout;
  const auto op = "recv_payload from rank " + std::to_string(peer);
  const auto what = with_rank(comm, op);
  check_peer(comm, peer, what);
  if (!device.is_cuda() || !device.has_index() || device.index() != comm.device())
    throw error(errc::bad_input, what + ": the consumer's device is " + device.str()
                                   + ", the communicator's cuda:" + std::to_string(comm.device()));
  check_stream(comm, copy_stream, "copy stream", what);
  check_stream(comm, compute_stream, "compute stream", what);
  check_specs(specs, what);
  check_usable(comm, what);

  c10::cuda::CUDAGuard on_device(device.index());
  received_payload out;
  out.tensors.reserve(specs.size());
  {
    // Allocated on the copy stream: the blocks' earlier users are ordered on it.
    c10::cuda::CUDAStreamGuard on_copy(copy_stream);
    for (const auto& s : specs)
      out.tensors.push_back(at::empty(s.shape, at::TensorOptions().dtype(s.dtype).device(device)));
  }
  out.done = recv_all(comm, peer, out.tensors, copy_stream, compute_stream, options, deadline, op);
  return out;
}

std::shared_ptr<at::cuda::CUDAEvent> recv_into(nccl::communicator& comm, int peer,
                                               const std::vector<at::Tensor>& dst,
                                               const c10::cuda::CUDAStream& copy_stream,
                                               const c10::cuda::CUDAStream& compute_stream,
                                               const transfer_options& options) {
  const auto deadline = steady::now() + options.timeout;
  const auto op = "recv_into from rank " + std::to_string(peer);
  const auto what = with_rank(comm, op);
  check_peer(comm, peer, what);
  check_stream(comm, copy_stream, "copy stream", what);
  check_stream(comm, compute_stream, "compute stream", what);
  for (size_t i = 0; i < dst.size(); ++i) {
    const auto& t = dst[i];
    const auto where = what + ": destination " + std::to_string(i);
    if (!t.defined() || !t.is_cuda() || t.device().index() != comm.device())
      throw error(errc::bad_input, where + " is "
                                     + (t.defined() ? "on " + t.device().str() : std::string("undefined"))
                                     + ", the communicator on cuda:" + std::to_string(comm.device()));
    if (!t.is_contiguous())
      throw error(errc::bad_input, where + " " + shape_text(t.sizes()) + " is not contiguous");
  }
  check_usable(comm, what);

  c10::cuda::CUDAGuard on_device(static_cast<c10::DeviceIndex>(comm.device()));
  // Earlier readers of the reused destination finish before it is overwritten.
  at::cuda::CUDAEvent readers_done(cudaEventDisableTiming);
  readers_done.record(compute_stream);
  readers_done.block(copy_stream);
  return recv_all(comm, peer, dst, copy_stream, compute_stream, options, deadline, op);
}

#endif

} // namespace tandem::gpu::transport
