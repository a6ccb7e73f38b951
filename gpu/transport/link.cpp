#include "gpu/transport/link.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>

#include "gpu/device/error.hpp"
#include "gpu/nccl/communicator.hpp"
#include "gpu/nccl/flat_bucket.hpp"
#include "gpu/transport/nccl.hpp"
#include "gpu/transport/tensors.hpp"

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tandem::gpu::transport {

// ─── process-wide settings ──────────────────────────────────────────────────

namespace {

struct settings {
  std::mutex mutex;
  std::string host;
  bool force = false;
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

settings& the_settings() {
  static settings s;
  return s;
}

std::string own_host() {
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) != 0)
    return "unknown";
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  return std::string(name) + " boot " + (boot.empty() ? std::string("unknown") : boot.substr(0, 8));
}

} // namespace

const std::string& host_identity() {
  auto& s = the_settings();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.host.empty())
    s.host = own_host();
  return s.host;  // set once per process before the actors start (tandem node, tandem run)
}

void set_host_identity(std::string host) {
  auto& s = the_settings();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.host = std::move(host);
}

void name_nccl_host(const std::string& process, bool per_process) {
  static const bool users = std::getenv("NCCL_HOSTID") != nullptr;  // the first call sees the user's
  if (users)
    return;
  const auto id = per_process ? host_identity() + "/" + process : host_identity();
  ::setenv("NCCL_HOSTID", id.c_str(), 1);
}

void force_links(bool on) {
  auto& s = the_settings();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.force = on;
}

bool forcing_links() {
  auto& s = the_settings();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.force;
}

void set_link_timeout(std::chrono::milliseconds timeout) {
  auto& s = the_settings();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.timeout = timeout;
}

std::chrono::milliseconds link_timeout() {
  auto& s = the_settings();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.timeout;
}

namespace {

struct stats_box {
  std::mutex mutex;
  link_stats s;
};

stats_box& the_stats() {
  static stats_box b;
  return b;
}

template <class F>
void count(F&& f) {
  auto& b = the_stats();
  std::lock_guard<std::mutex> lock(b.mutex);
  f(b.s);
}

} // namespace

link_stats links_cost() {
  auto& b = the_stats();
  std::lock_guard<std::mutex> lock(b.mutex);
  return b.s;
}

// ─── the wire's dtypes ──────────────────────────────────────────────────────

namespace {

[[maybe_unused]] std::string wire_dtype(at::ScalarType t) {
  switch (t) {
    case at::kInt: return "int32";
    case at::kByte: return "uint8";
    case at::kLong: return "int64";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kFloat: return "float32";
    default: return "";
  }
}

[[maybe_unused]] at::ScalarType scalar_type(const std::string& name, const std::string& what) {
  if (name == "int32") return at::kInt;
  if (name == "uint8") return at::kByte;
  if (name == "int64") return at::kLong;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  if (name == "float32") return at::kFloat;
  throw error(errc::bad_input, what + ": dtype '" + name
                                 + "' is not one of int32, uint8, int64, bfloat16, float16, float32");
}

} // namespace

// ─── the link ───────────────────────────────────────────────────────────────

#ifdef TANDEM_HAVE_CUDA

struct link::impl {
  std::unique_ptr<nccl::communicator> comm;
  int32_t device = -1;
  std::chrono::milliseconds timeout{0};
  /// Sends (rank 0) or receives (rank 1), on a stream of the link's own (not
  /// LibTorch's pool, whose streams other work shares): a send waiting for a
  /// receive that never comes holds up nothing else.
  cudaStream_t raw = nullptr;
  std::optional<c10::cuda::CUDAStream> stream;
  int64_t bytes = 0;
  double receive_ms = 0;
  int peer() const { return 1 - comm->rank(); }
  ~impl() {
    comm.reset();  // aborted unless closed: what is stuck on the stream ends
    if (raw)
      cudaStreamDestroy(raw);  // released once its work is done
  }
};

link::link(const std::vector<uint8_t>& id, int rank, int32_t device, std::chrono::milliseconds timeout,
           const std::string& name)
    : impl_(std::make_unique<impl>()) {
  if (device < 0)
    throw error(errc::device_unavailable, name + ": an NCCL link needs a CUDA device; CPU processes "
                                                 "exchange payloads through shared memory, on one host only");
  if (rank != 0 && rank != 1)
    throw error(errc::bad_input, name + ": a link's rank is 0 or 1, got " + std::to_string(rank));
  impl_->device = device;
  impl_->timeout = timeout;
  nccl::communicator_options o;
  o.timeout = timeout;
  o.name = name;
  impl_->comm = std::make_unique<nccl::communicator>(id, rank, 2, device, o);
  c10::cuda::CUDAGuard on_device(static_cast<c10::DeviceIndex>(device));
  if (cudaStreamCreateWithFlags(&impl_->raw, cudaStreamNonBlocking) != cudaSuccess)
    throw error(errc::device_failure, name + ": cannot create the link's stream on cuda:" + std::to_string(device));
  impl_->stream = c10::cuda::getStreamFromExternal(impl_->raw, static_cast<c10::DeviceIndex>(device));
  // NCCL connects a pair lazily, at its first transfer, with both sides
  // taking part: do it here, where both are waiting for each other, so that
  // a later send is enqueued without the peer's help.
  c10::cuda::CUDAStreamGuard on_stream(*impl_->stream);
  auto one = at::zeros({1}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device));
  nccl::collective_options c;
  c.wait = true;
  if (rank == 0)
    nccl::send(*impl_->comm, one, 1, c);
  else
    nccl::recv(*impl_->comm, one, 0, c);
  count([](link_stats& st) { ++st.links; });
}

link::~link() = default;  // the communicator's destructor aborts it unless closed

std::vector<payload_spec> link::check(const std::vector<handle>& handles) const {
  std::vector<payload_spec> out;
  for (auto h : handles) {
    payload_spec p;
    std::shared_ptr<const payload> held;
    try {
      held = peek(h);
    } catch (const error& e) {
      throw error(e.code(), describe() + ": " + e.what());
    }
    for (size_t i = 0; i < held->tensors.size(); ++i) {
      const auto& t = held->tensors[i];
      const auto d = t.defined() ? wire_dtype(t.scalar_type()) : std::string();
      if (d.empty())
        throw error(errc::bad_input, describe() + ": handle " + std::to_string(h) + ", tensor "
                                       + std::to_string(i) + ": "
                                       + (t.defined() ? "dtype " + std::string(c10::toString(t.scalar_type()))
                                                          + " does not travel on a link"
                                                      : std::string("undefined")));
      p.tensors.push_back({t.sizes().vec(), d});
    }
    out.push_back(std::move(p));
  }
  return out;
}

namespace {

std::vector<tensor_spec> tensor_specs(const payload_spec& p, const std::string& what) {
  std::vector<tensor_spec> out;
  for (const auto& t : p.tensors)
    out.push_back({t.shape, scalar_type(t.dtype, what)});
  check_specs(out, what);
  return out;
}

int64_t tensor_bytes(const payload_spec& p) {
  int64_t n = 0;
  for (const auto& t : p.tensors)
    n += tensor_spec{t.shape, scalar_type(t.dtype, "link")}.bytes();
  return n;
}

} // namespace

void link::send(const std::vector<handle>& handles, const std::vector<payload_spec>& specs) {
  if (handles.size() != specs.size())
    throw error(errc::bad_input, describe() + ": " + std::to_string(handles.size()) + " handles, "
                                   + std::to_string(specs.size()) + " specs");
  transfer_options o;
  o.timeout = impl_->timeout;
  o.wait = false;  // the peer receives after our answer: never block the host on it
  for (size_t i = 0; i < handles.size(); ++i) {
    const auto what = describe() + ": handle " + std::to_string(handles[i]);
    const auto expected = tensor_specs(specs[i], what);
    send_payload(*impl_->comm, impl_->peer(), handles[i], expected, *impl_->stream, o);
    int64_t n = 0;
    for (const auto& s : expected)
      n += s.bytes();
    impl_->bytes += n;
    count([n](link_stats& st) { st.bytes_sent += n; });
  }
  count([](link_stats& st) { ++st.pulls_sent; });
}

std::vector<handle> link::receive(const std::vector<payload_spec>& specs) {
  const auto t0 = std::chrono::steady_clock::now();
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(impl_->device));
  transfer_options o;
  o.timeout = impl_->timeout;
  o.wait = false;
  std::vector<received_payload> got;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto expected = tensor_specs(specs[i], describe() + ": payload " + std::to_string(i));
    got.push_back(recv_payload(*impl_->comm, impl_->peer(), expected, device, *impl_->stream,
                               *impl_->stream, o));
    for (const auto& s : expected)
      impl_->bytes += s.bytes();
  }
  // Bounded: a producer that died after answering ends here, not in a step.
  impl_->comm->wait(impl_->stream->stream(), impl_->timeout,
                    "receiving " + std::to_string(specs.size()) + " payloads");
  std::vector<handle> out;
  for (auto& g : got) {
    payload p;
    p.tensors = std::move(g.tensors);
    p.ready = std::move(g.done);
    out.push_back(publish(std::move(p)));
  }
  const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  impl_->receive_ms += ms;
  int64_t n = 0;
  for (const auto& p : specs)
    n += static_cast<int64_t>(tensor_bytes(p));
  count([n, ms](link_stats& st) {
    ++st.pulls_received;
    st.bytes_received += n;
    st.receive_ms += ms;
  });
  return out;
}

bool link::usable() const { return impl_->comm && impl_->comm->usable(); }
std::string link::describe() const { return impl_->comm ? impl_->comm->describe() : std::string("NCCL link"); }
int64_t link::bytes() const { return impl_->bytes; }
double link::receive_ms() const { return impl_->receive_ms; }

#else

struct link::impl {};

link::link(const std::vector<uint8_t>&, int, int32_t, std::chrono::milliseconds, const std::string& name) {
  throw error(errc::device_unavailable, name + ": NCCL links need a build with CUDA and NCCL");
}
link::~link() = default;
std::vector<payload_spec> link::check(const std::vector<handle>&) const { return {}; }
void link::send(const std::vector<handle>&, const std::vector<payload_spec>&) {}
std::vector<handle> link::receive(const std::vector<payload_spec>&) { return {}; }
bool link::usable() const { return false; }
std::string link::describe() const { return "NCCL link"; }
int64_t link::bytes() const { return 0; }
double link::receive_ms() const { return 0; }

#endif

} // namespace tandem::gpu::transport
