// Communication layer of the GPU engine: the NCCL communicator of one rank
// (gpu/nccl/communicator.hpp), the flat gradient bucket with on-device norm
// and clip (gpu/nccl/flat_bucket.hpp) and peer-to-peer feature copies within
// a node (gpu/transport/peer.hpp).
//
// nccl_cpu.* / peer_cpu.*  run everywhere (no GPU needed).
// nccl.*  / peer.*         need CUDA devices (1 or 2, said per test) and NCCL;
//                          they report SKIPPED otherwise.  On a 2-GPU host:
//   build/bin/gpu_tests --gtest_filter='nccl*:peer*'
// Rank threads are guarded by a watchdog: a hang that the communicator's own
// timeouts fail to end aborts the process with a message naming the ranks,
// rather than hanging silently.  NCCL_DEBUG=WARN (or INFO) adds NCCL's view.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/engine/graph.hpp"
#include "gpu/device/error.hpp"
#include "gpu/nccl/communicator.hpp"
#include "gpu/nccl/flat_bucket.hpp"
#include "gpu/pch.hpp"
#include "gpu/device/runtime.hpp"
#include "gpu/transport/peer.hpp"
#include "gpu/transport/tensors.hpp"
#include "tests/gpu/fixtures.hpp"

#ifdef TANDEM_HAVE_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/cuda/Sleep.h>
#include <cuda_runtime_api.h>
#endif

namespace nccl = tandem::gpu::nccl;
namespace transport = tandem::gpu::transport;
using tandem::errc;
using tandem::gpu::error;
using namespace std::chrono_literals;

namespace {

using tandem::test::contains;
using tandem::test::expect_error;
using tandem::gpu::test::seconds_since;
using tandem::gpu::test::steady;

std::vector<at::Tensor> random_tensors(const std::vector<std::vector<int64_t>>& shapes,
                                       uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  std::vector<at::Tensor> out;
  for (const auto& s : shapes)
    out.push_back(at::randn(s, gen, at::TensorOptions().dtype(at::kFloat)));
  return out;
}

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts)
    out.push_back(t.clone());
  return out;
}

double reference_norm(const std::vector<at::Tensor>& ts) {
  double sum = 0;
  for (const auto& t : ts)
    sum += t.to(at::kDouble).pow(2).sum().item<double>();
  return std::sqrt(sum);
}

int64_t round_up(int64_t n, int64_t m) {
  return (n + m - 1) / m * m;
}

} // namespace

// ─── CPU: flat bucket, norm, clip, error paths ───────────────────────────────

TEST(nccl_cpu, flat_bucket_views_share_storage_and_cover_grads_in_order) {
  const std::vector<std::vector<int64_t>> shapes = {{3, 5}, {7}, {2, 2, 2}, {}, {0}, {33}};
  auto grads = random_tensors(shapes, 11);
  const auto before = clones(grads);
  nccl::flat_bucket bucket(grads);

  ASSERT_EQ(bucket.views().size(), shapes.size());
  ASSERT_EQ(bucket.offsets().size(), shapes.size());
  int64_t expected_numel = 0;
  for (const auto& g : before)
    expected_numel += round_up(g.numel(), nccl::flat_bucket::default_alignment);
  EXPECT_EQ(bucket.numel(), expected_numel);
  EXPECT_EQ(bucket.flat().dim(), 1);
  EXPECT_EQ(bucket.flat().scalar_type(), at::kFloat);
  EXPECT_TRUE(bucket.flat().is_contiguous());

  auto covered = at::zeros({bucket.numel()}, at::kBool);
  const auto* base = static_cast<const char*>(bucket.flat().data_ptr());
  for (size_t i = 0; i < shapes.size(); ++i) {
    SCOPED_TRACE("gradient " + std::to_string(i));
    const auto& g = grads[i];
    EXPECT_TRUE(g.is_same(bucket.views()[i])) << "grads[i] must be replaced by the view";
    EXPECT_EQ(g.sizes(), before[i].sizes());
    EXPECT_TRUE(g.is_contiguous());
    EXPECT_TRUE(at::equal(g, before[i])) << "values are kept";
    EXPECT_TRUE(g.is_alias_of(bucket.flat())) << "the view shares the bucket's storage";
    EXPECT_EQ(bucket.offsets()[i] % nccl::flat_bucket::default_alignment, 0);
    if (i > 0) {
      EXPECT_GE(bucket.offsets()[i], bucket.offsets()[i - 1] + before[i - 1].numel())
        << "views follow the list order without overlapping";
    }
    if (g.numel() > 0) {
      EXPECT_EQ(static_cast<const char*>(g.data_ptr()), base + bucket.offsets()[i] * 4);
    }
    covered.narrow(0, bucket.offsets()[i], g.numel()).fill_(true);
  }
  EXPECT_EQ(bucket.flat().masked_select(covered.logical_not()).abs().sum().item<float>(), 0.f)
    << "padding is zero";

  // One write through the flat buffer reaches every gradient (one all-reduce
  // covers them all), and zero_() is one kernel over everything.
  bucket.flat().fill_(2.f);
  for (const auto& g : grads)
    EXPECT_TRUE(at::equal(g, at::full_like(g, 2.f)));
  bucket.zero_();
  for (const auto& g : grads)
    EXPECT_EQ(g.abs().sum().item<float>(), 0.f);

  std::vector<at::Tensor> none;
  nccl::flat_bucket empty(none);
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(empty.numel(), 0);
}

TEST(nccl_cpu, flat_bucket_of_param_grads_keeps_views_through_backward) {
  auto init = random_tensors({{4, 3}, {3}, {5, 4}}, 5);
  auto w1 = init[0].clone().requires_grad_(true);
  auto w2 = init[1].clone().requires_grad_(true);
  const auto x = init[2];
  std::vector<at::Tensor> params{w1, w2};
  auto bucket = nccl::flat_bucket::of_param_grads(params);  // undefined grads start at zero
  ASSERT_TRUE(w1.grad().defined());
  EXPECT_EQ(w1.grad().abs().sum().item<float>(), 0.f);

  auto loss = [&](const at::Tensor& a, const at::Tensor& b) { return (x.mm(a) + b).pow(2).sum(); };
  loss(w1, w2).backward();
  auto r1 = init[0].clone().requires_grad_(true);
  auto r2 = init[1].clone().requires_grad_(true);
  loss(r1, r2).backward();

  EXPECT_TRUE(w1.grad().is_alias_of(bucket.flat())) << "autograd must accumulate in place";
  EXPECT_TRUE(w2.grad().is_alias_of(bucket.flat()));
  EXPECT_TRUE(at::allclose(w1.grad(), r1.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(w2.grad(), r2.grad(), 1e-5, 1e-6));

  loss(w1, w2).backward();  // accumulates: twice the gradient
  EXPECT_TRUE(at::allclose(w1.grad(), 2 * r1.grad(), 1e-5, 1e-6));
  bucket.zero_();
  EXPECT_EQ(w1.grad().abs().sum().item<float>(), 0.f);
  EXPECT_TRUE(w1.grad().is_alias_of(bucket.flat()));
}

TEST(nccl_cpu, flat_bucket_rejects_what_it_cannot_hold) {
  std::vector<at::Tensor> bf16{at::ones({3}, at::kBFloat16)};
  auto m = expect_error(errc::bad_input, [&] { nccl::flat_bucket b(bf16); });
  EXPECT_TRUE(contains(m, "float32")) << m;
  std::vector<at::Tensor> undefined{at::ones({3}), at::Tensor()};
  expect_error(errc::bad_input, [&] { nccl::flat_bucket b(undefined); });
  std::vector<at::Tensor> ok{at::ones({3})};
  expect_error(errc::bad_input, [&] { nccl::flat_bucket b(ok, 0); });
}

TEST(nccl_cpu, global_norm_and_clip_match_reference) {
  const auto ts = random_tensors({{17, 3}, {100}, {1}, {2, 2, 5}}, 23);
  const double ref = reference_norm(ts);

  const auto norm = nccl::global_norm(ts);
  EXPECT_EQ(norm.scalar_type(), at::kFloat);
  EXPECT_EQ(norm.dim(), 0);
  EXPECT_NEAR(norm.item<double>(), ref, 1e-5 * ref);

  // The norm of the flat bucket equals the norm of its views (zero padding).
  auto grads = clones(ts);
  nccl::flat_bucket bucket(grads);
  EXPECT_NEAR(nccl::global_norm({bucket.flat()}).item<double>(), ref, 1e-5 * ref);

  // Active clip: every tensor scaled by max / (norm + 1e-6).
  const double max_norm = 0.5 * ref;
  auto clipped = clones(ts);
  auto coef = nccl::clip_(clipped, max_norm, norm);
  const double expected_coef = max_norm / (ref + 1e-6);
  EXPECT_NEAR(coef.item<double>(), expected_coef, 1e-6);
  for (size_t i = 0; i < ts.size(); ++i)
    EXPECT_TRUE(at::allclose(clipped[i], ts[i] * expected_coef, 1e-5, 1e-7)) << "tensor " << i;
  EXPECT_NEAR(reference_norm(clipped), max_norm, 1e-5 * max_norm);

  // Inactive clip (norm below max): bit-identical.
  auto untouched = clones(ts);
  EXPECT_EQ(nccl::clip_(untouched, 10 * ref, norm).item<float>(), 1.f);
  for (size_t i = 0; i < ts.size(); ++i)
    EXPECT_TRUE(at::equal(untouched[i], ts[i]));
  // max_norm ≤ 0 disables clipping.
  EXPECT_EQ(nccl::clip_(untouched, 0.0, norm).item<float>(), 1.f);
  EXPECT_TRUE(at::equal(untouched[0], ts[0]));

  expect_error(errc::bad_input, [] { nccl::global_norm({}); });
}

TEST(nccl_cpu, element_types_map_and_reject) {
  EXPECT_EQ(nccl::element_type_of(at::kFloat), nccl::element_type::f32);
  EXPECT_EQ(nccl::element_type_of(at::kBFloat16), nccl::element_type::bf16);
  EXPECT_EQ(nccl::element_type_of(at::kHalf), nccl::element_type::f16);
  EXPECT_EQ(nccl::element_type_of(at::kLong), nccl::element_type::i64);
  EXPECT_EQ(nccl::element_type_of(at::kByte), nccl::element_type::u8);
  EXPECT_EQ(nccl::element_size(nccl::element_type::bf16), 2u);
  EXPECT_EQ(nccl::element_size(nccl::element_type::f64), 8u);
  EXPECT_STREQ(nccl::to_string(nccl::element_type::f32), "f32");
  EXPECT_STREQ(nccl::to_string(nccl::reduce_op::avg), "avg");
  expect_error(errc::bad_input, [] { nccl::element_type_of(at::kBool); });
}

TEST(nccl_cpu, communicator_fails_clearly_without_nccl_or_device) {
  const auto rt = tandem::gpu::query_runtime();
  if (!nccl::available()) {
    EXPECT_EQ(nccl::version(), "");
    auto m = expect_error(errc::device_unavailable, [] { nccl::new_unique_id(); });
    EXPECT_TRUE(contains(m, "without NCCL")) << m;
    m = expect_error(errc::device_unavailable, [] {
      nccl::communicator c(nccl::unique_id_bytes(nccl::unique_id_size), 0, 1, 0, 1s);
    });
    EXPECT_TRUE(contains(m, "without NCCL")) << m;
    return;
  }
  EXPECT_EQ(nccl::version(), rt.nccl_version);
  EXPECT_FALSE(nccl::version().empty());
  const nccl::unique_id_bytes fake(nccl::unique_id_size, 0);

  auto m = expect_error(errc::bad_input, [&] { nccl::communicator c(fake, 2, 2, 0, 1s); });
  EXPECT_TRUE(contains(m, "rank 2 of 2")) << m;
  m = expect_error(errc::bad_input, [] { nccl::communicator c(nccl::unique_id_bytes(5), 0, 1, 0, 1s); });
  EXPECT_TRUE(contains(m, "5 bytes")) << m;
  expect_error(errc::bad_input, [&] { nccl::communicator c(fake, 0, 1, 0, 0ms); });
  // A device this process does not have (on a GPU-less host: any device).
  const int missing = static_cast<int>(rt.devices.size());
  m = expect_error(errc::device_unavailable,
                   [&] { nccl::communicator c(fake, 0, 1, missing, 1s); });
  EXPECT_TRUE(contains(m, "no such CUDA device")) << m;
  EXPECT_TRUE(contains(m, "cuda:" + std::to_string(missing))) << m;
#ifdef TANDEM_HAVE_CUDA
  if (torch::cuda::is_available()) {
    // The refused communicator must leave no CUDA error pending on this
    // thread (its destructor once switched to the missing device unchecked,
    // and the next cudaMalloc here threw "invalid device ordinal").
    const auto e = cudaPeekAtLastError();
    EXPECT_EQ(e, cudaSuccess) << "pending: " << cudaGetErrorString(e);
    if (e != cudaSuccess)
      cudaGetLastError();
  }
#endif
}

#ifdef TANDEM_HAVE_CUDA

TEST(peer_cpu, copies_reject_cpu_tensors_clearly) {
  // Streams are only named here (no CUDA call), so this runs without a GPU.
  const c10::cuda::CUDAStream s(c10::cuda::CUDAStream::UNCHECKED,
                                c10::Stream(c10::Stream::DEFAULT, at::Device(at::kCUDA, 0)));
  auto m = expect_error(errc::bad_input, [&] {
    transport::copy_into(at::ones({4}), nullptr, at::ones({4}), s, s);
  });
  EXPECT_TRUE(contains(m, "must be a CUDA tensor")) << m;
  m = expect_error(errc::bad_input, [&] {
    transport::fetch(at::ones({4}), nullptr, at::Device(at::kCUDA, 0), s, s);
  });
  EXPECT_TRUE(contains(m, "must be a CUDA tensor")) << m;
  EXPECT_TRUE(transport::enable_peer_access(3, 3)) << "a device always reaches itself";
  EXPECT_STREQ(transport::to_string(transport::copy_path::staged), "staged");
}

// ─── GPU ─────────────────────────────────────────────────────────────────────

namespace {

at::Device cuda(int i) {
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(i));
}

at::TensorOptions f32_on(int i) {
  return at::TensorOptions().dtype(at::kFloat).device(cuda(i));
}

nccl::collective_options waited(std::chrono::milliseconds timeout = 60s) {
  nccl::collective_options o;
  o.timeout = timeout;
  o.wait = true;
  return o;
}

/// DESIGN.md §1: captures are serialised in a process (LibTorch's generator
/// registration race); the tests hold this lock from capture_begin to end.
std::mutex& capture_mutex() {
  static std::mutex m;
  return m;
}
/// One thread per rank (tests/gpu/fixtures.hpp), named for this test's hang message.
void on_ranks(int world, const std::function<void(int)>& body,
              std::chrono::seconds limit = std::chrono::seconds(240)) {
  tandem::gpu::test::on_ranks("nccl_test", world, body, limit);
}

/// The rank's device current and a side stream of it current (as in a
/// drafter actor), for the scope of one rank's body.
struct rank_scope {
  explicit rank_scope(int r)
      : device(static_cast<c10::DeviceIndex>(r)),
        stream(c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(r))),
        on_stream(stream) {}
  c10::cuda::CUDAGuard device;
  c10::cuda::CUDAStream stream;
  c10::cuda::CUDAStreamGuard on_stream;
};

/// `read()` (a device-to-host read) with `stream` current: the read is
/// ordered after the work on that stream.  The default (legacy) stream is
/// not ordered with pool streams (created non-blocking), so a plain
/// `.cpu()` after work on a pool stream can read stale memory.
at::Tensor on_stream(const c10::cuda::CUDAStream& stream, const std::function<at::Tensor()>& read) {
  c10::cuda::CUDAStreamGuard on(stream);
  return read();
}

/// A runtime error left pending by a call that was not checked would
/// surface later in an unrelated place (the caching allocator checks
/// cudaGetLastError before every cudaMalloc).  Fails, names it, clears it.
void expect_no_pending_cuda_error(const char* where) {
  const auto e = cudaPeekAtLastError();
  EXPECT_EQ(e, cudaSuccess) << where << ": a CUDA error is pending: " << cudaGetErrorName(e)
                            << " (" << cudaGetErrorString(e) << ")";
  if (e != cudaSuccess)
    cudaGetLastError();
}

/// ~0.5 s of GPU time at H200 clocks: long enough that an unordered copy
/// would be caught, short enough for a test.
constexpr int64_t kSpinCycles = 1'000'000'000;

} // namespace

TEST(nccl, unique_id_is_128_bytes_and_fresh) {
  TANDEM_REQUIRE_NCCL();
  TANDEM_REQUIRE_GPUS(1);
  const auto a = nccl::new_unique_id();
  const auto b = nccl::new_unique_id();
  EXPECT_EQ(a.size(), nccl::unique_id_size);
  EXPECT_EQ(b.size(), nccl::unique_id_size);
  EXPECT_NE(a, b);
  std::printf("NCCL %s\n", nccl::version().c_str());
}

TEST(nccl, init_times_out_when_a_rank_never_joins) {
  TANDEM_REQUIRE_NCCL();
  TANDEM_REQUIRE_GPUS(1);
  const auto id = nccl::new_unique_id();
  nccl::communicator_options o;
  o.timeout = 5s;
  o.name = "never_joins";
  on_ranks(1, [&](int) {
    rank_scope scope(0);
    const auto t0 = steady::now();
    auto m = expect_error(errc::timeout, [&] { nccl::communicator c(id, 0, 2, 0, o); });
    const double s = seconds_since(t0);
    std::printf("rank 0 alone, world 2: %.2f s: %s\n", s, m.c_str());
    EXPECT_GE(s, 4.9);
    EXPECT_LT(s, 5.0 + o.abort_timeout.count() / 1000.0 + 3.0);
    EXPECT_TRUE(contains(m, "NCCL rank 0 of 2 on cuda:0 (never_joins)")) << m;
    EXPECT_TRUE(contains(m, "init did not complete within 5000 ms")) << m;
  });
}

TEST(nccl, init_with_wrong_world_size_times_out) {
  TANDEM_REQUIRE_NCCL();
  TANDEM_REQUIRE_GPUS(2);
  const auto id = nccl::new_unique_id();
  on_ranks(2, [&](int r) {
    rank_scope scope(r);
    const auto t0 = steady::now();
    // Both ranks believe the world has 3 ranks: the third never comes.
    auto m = expect_error(errc::timeout, [&] { nccl::communicator c(id, r, 3, r, 5s); });
    const double s = seconds_since(t0);
    std::printf("rank %d, world 3 of 2: %.2f s: %s\n", r, s, m.c_str());
    EXPECT_LT(s, 5.0 + nccl::communicator_options{}.abort_timeout.count() / 1000.0 + 3.0);
    EXPECT_TRUE(contains(m, "rank " + std::to_string(r) + " of 3")) << m;
    EXPECT_TRUE(contains(m, "init did not complete")) << m;
  });
}

TEST(nccl, all_reduce_sum_and_avg_are_exact) {
  TANDEM_REQUIRE_NCCL();
  TANDEM_REQUIRE_GPUS(2);
  const auto id = nccl::new_unique_id();
  const int64_t n = (int64_t{1} << 20) + 3;  // odd on purpose; values stay exact in fp32
  on_ranks(2, [&](int r) {
    rank_scope scope(r);
    nccl::communicator comm(id, r, 2, r, 60s);
    EXPECT_TRUE(comm.usable());
    EXPECT_EQ(comm.rank(), r);
    EXPECT_EQ(comm.world(), 2);
    const auto k = at::arange(n, f32_on(r));
    auto x = k * static_cast<float>(r + 1);  // k and 2k
    nccl::all_reduce(comm, x, nccl::reduce_op::sum, waited());
    EXPECT_TRUE(at::equal(x.cpu(), (k * 3).cpu())) << "rank " << r << ": sum";
    auto y = k * static_cast<float>(2 * (r + 1));  // 2k and 4k
    nccl::all_reduce(comm, y, nccl::reduce_op::avg, waited());
    EXPECT_TRUE(at::equal(y.cpu(), (k * 3).cpu())) << "rank " << r << ": avg";
    // bf16 (the model's dtype), small integers are exact.
    auto z = at::full({1000}, static_cast<float>(r + 1), f32_on(r)).to(at::kBFloat16);
    nccl::all_reduce(comm, z, nccl::reduce_op::sum, waited());
    EXPECT_TRUE(at::equal(z.cpu(), at::full({1000}, 3.f).to(at::kBFloat16))) << "bf16";
    EXPECT_TRUE(comm.close(60s)) << comm.failure();
    EXPECT_FALSE(comm.usable());
  });
}

TEST(nccl, all_reduce_captured_in_cuda_graph_replays_exactly) {
  TANDEM_REQUIRE_NCCL();
  TANDEM_REQUIRE_GPUS(2);
  const auto id = nccl::new_unique_id();
  const int64_t n = (int64_t{1} << 20) + 3;
  on_ranks(2, [&](int r) {
    rank_scope scope(r);
    nccl::communicator comm(id, r, 2, r, 60s);
    const auto k = at::arange(n, f32_on(r));
    auto buf = at::zeros({n}, f32_on(r));  // the graph's static buffer
    // Warm-up: the same collective eagerly, so NCCL connects its peers
    // outside the capture (see communicator.hpp).
    nccl::all_reduce(comm, buf, nccl::reduce_op::sum, waited());
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    {
      std::lock_guard<std::mutex> lock(capture_mutex());
      graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      nccl::all_reduce(comm, buf, nccl::reduce_op::sum);
      graph->capture_end();
    }
    for (int it = 0; it < 10; ++it) {
      // rank r: (r+1)·k + 10·it + r   →   sum: 3k + 20·it + 1
      buf.copy_(k * static_cast<float>(r + 1) + static_cast<float>(10 * it + r));
      graph->replay();
      comm.wait(scope.stream.stream(), 60s, "replay " + std::to_string(it));
      const auto expected = k * 3 + static_cast<float>(20 * it + 1);
      EXPECT_TRUE(at::equal(buf.cpu(), expected.cpu())) << "rank " << r << ", replay " << it;
    }
    // DESIGN.md §4: graphs that captured collectives go before the communicator.
    graph.reset();
    EXPECT_TRUE(comm.close(60s)) << comm.failure();
  });
}

TEST(nccl, all_reduce_in_engine_captured_step_replays_exactly) {
  // The same through the engines' graph wrapper (gpu/engine/graph.hpp: the
  // process capture lock, ThreadLocal mode, its own side stream).
  TANDEM_REQUIRE_NCCL();
  TANDEM_REQUIRE_GPUS(2);
  const auto id = nccl::new_unique_id();
  const int64_t n = 4099;
  on_ranks(2, [&](int r) {
    c10::cuda::CUDAGuard device(static_cast<c10::DeviceIndex>(r));
    nccl::communicator comm(id, r, 2, r, 60s);
    auto step = std::make_unique<tandem::gpu::captured_step>(cuda(r));
    c10::cuda::CUDAStreamGuard on_step(step->stream());
    const auto k = at::arange(n, f32_on(r));
    auto buf = at::zeros({n}, f32_on(r));
    // Warm-up, waited: nothing of NCCL may be pending on the stream when
    // capture() synchronises it under the process lock.
    nccl::all_reduce(comm, buf, nccl::reduce_op::avg, waited());
    step->capture([&] { nccl::all_reduce(comm, buf, nccl::reduce_op::avg); }, {});
    for (int it = 0; it < 10; ++it) {
      // rank r: 2(r+1)·k + 2·it   →   avg: 3k + 2·it
      buf.copy_(k * static_cast<float>(2 * (r + 1)) + static_cast<float>(2 * it));
      step->replay();
      comm.wait(step->stream().stream(), 60s, "captured_step replay " + std::to_string(it));
      EXPECT_TRUE(at::equal(buf.cpu(), (k * 3 + static_cast<float>(2 * it)).cpu()))
        << "rank " << r << ", replay " << it;
    }
    step.reset();  // the graph before the communicator
    EXPECT_TRUE(comm.close(60s)) << comm.failure();
  });
}

TEST(nccl, flat_bucket_all_reduce_and_clip_match_cpu_reference) {
  TANDEM_REQUIRE_NCCL();
  TANDEM_REQUIRE_GPUS(2);
  const std::vector<std::vector<int64_t>> shapes = {{64, 33}, {7}, {3, 3, 3}, {1}, {4096}};
  const std::vector<std::vector<at::Tensor>> cpu_grads = {random_tensors(shapes, 100),
                                                           random_tensors(shapes, 200)};
  const double max_norm = 1.0;
  // Reference on the CPU: average of the ranks, norm in double, clip.
  std::vector<at::Tensor> ref;
  for (size_t i = 0; i < shapes.size(); ++i)
    ref.push_back((cpu_grads[0][i] + cpu_grads[1][i]) * 0.5f);
  const double ref_norm = reference_norm(ref);
  ASSERT_GT(ref_norm, max_norm) << "the case must exercise clipping";
  for (auto& t : ref)
    t = t * static_cast<float>(max_norm / (ref_norm + 1e-6));

  const auto id = nccl::new_unique_id();
  std::vector<std::vector<at::Tensor>> results(2);
  std::vector<double> norms(2);
  on_ranks(2, [&](int r) {
    rank_scope scope(r);
    nccl::communicator comm(id, r, 2, r, 60s);
    std::vector<at::Tensor> grads;
    for (const auto& g : cpu_grads[r])
      grads.push_back(g.to(cuda(r)));
    nccl::flat_bucket bucket(grads);
    nccl::all_reduce(comm, bucket.flat(), nccl::reduce_op::avg);  // one collective for all
    auto norm = nccl::global_norm(bucket.views());
    nccl::clip_(bucket.views(), max_norm, norm);
    comm.wait(scope.stream.stream(), 60s, "bucket all-reduce + clip");
    norms[r] = norm.item<double>();
    for (const auto& g : grads)
      results[r].push_back(g.cpu());
    EXPECT_TRUE(comm.close(60s)) << comm.failure();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NEAR(norms[r], ref_norm, 1e-5 * ref_norm) << "rank " << r;
    ASSERT_EQ(results[r].size(), shapes.size());
    for (size_t i = 0; i < shapes.size(); ++i)
      EXPECT_TRUE(at::allclose(results[r][i], ref[i], 1e-5, 1e-7))
        << "rank " << r << ", gradient " << i << ": max |diff| "
        << (results[r][i] - ref[i]).abs().max().item<float>();
  }
  for (size_t i = 0; i < shapes.size(); ++i)
    EXPECT_TRUE(at::equal(results[0][i], results[1][i])) << "replicas differ at gradient " << i;
}

TEST(nccl, broadcast_from_rank0_makes_replicas_equal) {
  TANDEM_REQUIRE_NCCL();
  TANDEM_REQUIRE_GPUS(2);
  const auto id = nccl::new_unique_id();
  const auto weights = random_tensors({{1000, 37}}, 7)[0];
  std::vector<at::Tensor> f32(2), bf16(2);
  on_ranks(2, [&](int r) {
    rank_scope scope(r);
    nccl::communicator comm(id, r, 2, r, 60s);
    auto a = r == 0 ? weights.to(cuda(r)) : at::full({1000, 37}, -1.f, f32_on(r));
    auto b = a.to(at::kBFloat16);
    nccl::broadcast(comm, a, 0);
    nccl::broadcast(comm, b, 0, waited());
    f32[r] = a.cpu();
    bf16[r] = b.cpu();
    EXPECT_TRUE(comm.close(60s)) << comm.failure();
  });
  EXPECT_TRUE(at::equal(f32[0], weights));
  EXPECT_TRUE(at::equal(f32[1], weights));
  EXPECT_TRUE(at::equal(bf16[0], bf16[1]));
  EXPECT_TRUE(at::equal(bf16[1], weights.to(at::kBFloat16)));
}

TEST(nccl, send_recv_moves_bytes) {
  TANDEM_REQUIRE_NCCL();
  TANDEM_REQUIRE_GPUS(2);
  const auto id = nccl::new_unique_id();
  const auto payload = at::arange(12345, at::kLong) * 3 - 7;
  at::Tensor received;
  on_ranks(2, [&](int r) {
    rank_scope scope(r);
    nccl::communicator comm(id, r, 2, r, 60s);
    if (r == 0) {
      nccl::send(comm, payload.to(cuda(0)), 1, waited());
    } else {
      auto buf = at::zeros({12345}, at::TensorOptions().dtype(at::kLong).device(cuda(1)));
      nccl::recv(comm, buf, 0, waited());
      received = buf.cpu();
    }
    EXPECT_TRUE(comm.close(60s)) << comm.failure();
  });
  ASSERT_TRUE(received.defined());
  EXPECT_TRUE(at::equal(received, payload));
}

TEST(nccl, collective_times_out_when_peer_never_calls_then_abort_works) {
  TANDEM_REQUIRE_NCCL();
  TANDEM_REQUIRE_GPUS(2);
  const auto id = nccl::new_unique_id();
  std::promise<void> gave_up;
  auto rank0_gave_up = gave_up.get_future().share();
  on_ranks(2, [&](int r) {
    rank_scope scope(r);
    nccl::communicator comm(id, r, 2, r, 60s);
    if (r == 1) {
      // Rank 1 never calls the collective.  Once rank 0 has given up, it
      // aborts too (NCCL ≥ 2.19: every rank of a node aborts the communicator).
      rank0_gave_up.wait();
      EXPECT_TRUE(comm.abort()) << "rank 1: ncclCommAbort did not return in time";
      return;
    }
    auto x = at::ones({4096}, f32_on(0));
    const auto t0 = steady::now();
    auto m = expect_error(errc::timeout, [&] {
      nccl::all_reduce(comm, x, nccl::reduce_op::sum, waited(5s));
    });
    const double s = seconds_since(t0);
    std::printf("rank 0 alone in all_reduce: %.2f s: %s\n", s, m.c_str());
    EXPECT_GE(s, 4.9);
    EXPECT_LT(s, 8.0) << "the error must come at the deadline, not after the abort";
    EXPECT_TRUE(contains(m, "NCCL rank 0 of 2 on cuda:0")) << m;
    EXPECT_TRUE(contains(m, "all_reduce_sum of 4096 f32")) << m;
    EXPECT_TRUE(contains(m, "within 5000 ms")) << m;
    EXPECT_FALSE(comm.usable());
    EXPECT_FALSE(comm.failure().empty());
    gave_up.set_value();
    EXPECT_TRUE(comm.abort()) << "rank 0: ncclCommAbort did not return in time";
    // The communicator refuses further work at once, clearly.
    auto again = expect_error(errc::device_failure, [&] {
      nccl::all_reduce(comm, x, nccl::reduce_op::sum, waited(5s));
    });
    EXPECT_TRUE(contains(again, "not usable")) << again;
    // The device itself is fine.
    EXPECT_EQ(at::ones({8}, f32_on(0)).sum().item<float>(), 8.f);
    EXPECT_FALSE(comm.close(1s)) << "a failed communicator does not close cleanly";
  });
}

TEST(nccl, abort_group_ends_a_blocked_init_at_once) {
  TANDEM_REQUIRE_NCCL();
  TANDEM_REQUIRE_GPUS(1);
  const auto id = nccl::new_unique_id();
  EXPECT_EQ(nccl::abort_group(id, "nobody yet"), 0u) << "no communicator of this id exists";
  on_ranks(1, [&](int) {
    rank_scope scope(0);
    // Rank 1 never comes; instead its failure is known after 1 s.
    std::atomic<bool> done{false};
    size_t aborted = 0;
    std::thread supervisor([&] {
      std::this_thread::sleep_for(1s);
      while (!done && (aborted = nccl::abort_group(id, "drafter 1 failed")) == 0)
        std::this_thread::sleep_for(10ms);
    });
    const auto t0 = steady::now();
    auto m = expect_error(errc::device_failure, [&] { nccl::communicator c(id, 0, 2, 0, 60s); });
    done = true;
    supervisor.join();
    const double s = seconds_since(t0);
    std::printf("rank 0 alone, world 2, group aborted after 1 s: %.2f s: %s\n", s, m.c_str());
    EXPECT_EQ(aborted, 1u);
    EXPECT_LT(s, 1.0 + nccl::communicator_options{}.abort_timeout.count() / 1000.0)
      << "the abort, not the 60 s deadline, must end the init";
    EXPECT_TRUE(contains(m, "aborted for its group: drafter 1 failed")) << m;
  });
  EXPECT_EQ(nccl::abort_group(id, "again"), 0u) << "a destroyed communicator leaves the registry";
}

TEST(nccl, abort_group_ends_a_blocked_collective_on_the_survivor) {
  TANDEM_REQUIRE_NCCL();
  TANDEM_REQUIRE_GPUS(2);
  const auto id = nccl::new_unique_id();
  std::promise<void> entering;
  auto rank0_entering = entering.get_future().share();
  on_ranks(2, [&](int r) {
    rank_scope scope(r);
    nccl::communicator comm(id, r, 2, r, 60s);
    if (r == 1) {
      // Rank 1 "fails" without calling the collective; its failure is
      // reported once rank 0 is inside it, and the group is aborted.
      rank0_entering.wait();
      std::this_thread::sleep_for(1s);
      EXPECT_EQ(nccl::abort_group(id, "drafter 1 threw in step 7"), 2u) << "both ranks are in this process";
      EXPECT_EQ(nccl::abort_group(id, "twice"), 0u) << "already aborted";
      EXPECT_FALSE(comm.usable());
      EXPECT_FALSE(comm.close(1s));
      return;
    }
    auto x = at::ones({4096}, f32_on(0));
    ASSERT_NE(comm.abort_flag(), nullptr);
    EXPECT_EQ(*comm.abort_flag(), 0) << "a live communicator's abort flag is down";
    entering.set_value();
    const auto t0 = steady::now();
    auto m = expect_error(errc::device_failure, [&] {
      nccl::all_reduce(comm, x, nccl::reduce_op::sum, waited(60s));
    });
    const double s = seconds_since(t0);
    std::printf("rank 0 in all_reduce, group aborted after 1 s: %.2f s: %s\n", s, m.c_str());
    EXPECT_LT(s, 1.0 + nccl::communicator_options{}.abort_timeout.count() / 1000.0)
      << "the abort, not the 60 s deadline, must end the wait";
    EXPECT_TRUE(contains(m, "NCCL rank 0 of 2 on cuda:0")) << m;
    EXPECT_TRUE(contains(m, "aborted for its group: drafter 1 threw in step 7")) << m;
    EXPECT_EQ(*comm.abort_flag(), 1) << "raised before the abort began";
    EXPECT_FALSE(comm.usable());
    EXPECT_FALSE(comm.close(1s)) << "an aborted communicator does not close cleanly";
    // The device itself is fine.
    EXPECT_EQ(at::ones({8}, f32_on(0)).sum().item<float>(), 8.f);
  });
}

TEST(peer, copy_is_byte_exact_and_ordered_by_events) {
  TANDEM_REQUIRE_GPUS(2);
  const int64_t n = int64_t{64} << 20;  // 64 MiB
  auto gen = at::detail::createCPUGenerator(3);
  const auto bytes = at::randint(0, 256, {n}, gen, at::TensorOptions().dtype(at::kByte));
  auto producer = c10::cuda::getStreamFromPool(false, 0);
  auto copy_stream = c10::cuda::getStreamFromPool(false, 1);
  auto compute = c10::cuda::getStreamFromPool(false, 1);
  const auto staged = bytes.to(cuda(0));
  auto dst = at::zeros({n}, at::TensorOptions().dtype(at::kByte).device(cuda(1)));
  torch::cuda::synchronize(0);
  torch::cuda::synchronize(1);

  at::Tensor src;
  auto ready = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
  {
    c10::cuda::CUDAStreamGuard on(producer);
    src = at::empty({n}, at::TensorOptions().dtype(at::kByte).device(cuda(0)));
    at::cuda::sleep(kSpinCycles);  // the producer is still busy...
    src.copy_(staged);             // ...before it writes the features
    ready->record(producer);
  }
  expect_no_pending_cuda_error("before copy_into");
  auto copy = transport::copy_into(src, ready, dst, copy_stream, compute);
  expect_no_pending_cuda_error("after copy_into");
  std::printf("cuda:0 → cuda:1: %s\n", transport::to_string(copy.path));
  EXPECT_NE(copy.path, transport::copy_path::same_device);
  ASSERT_TRUE(copy.done);
  EXPECT_FALSE(copy.done->query()) << "the copy finished before the producer's event";
  // Read on the consumer's compute stream (it waits on copy.done already).
  // Pool streams do not synchronise with the default stream, so a read
  // there would not be ordered after the copy.
  const auto seen = on_stream(compute, [&] { return dst.cpu(); });
  EXPECT_TRUE(at::equal(seen, bytes)) << "the consumer must see the producer's bytes";
  EXPECT_TRUE(copy.done->query());
}

TEST(peer, producer_buffer_reusable_after_consumer_event) {
  TANDEM_REQUIRE_GPUS(2);
  const int64_t n = int64_t{8} << 20;
  auto producer = c10::cuda::getStreamFromPool(false, 0);
  auto copy_stream = c10::cuda::getStreamFromPool(false, 1);
  auto compute = c10::cuda::getStreamFromPool(false, 1);
  auto src = at::full({n}, 7.f, f32_on(0));  // a producer's static buffer
  auto dst = at::zeros({n}, f32_on(1));
  torch::cuda::synchronize(0);
  torch::cuda::synchronize(1);
  auto ready = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
  ready->record(producer);
  {
    c10::cuda::CUDAStreamGuard on(copy_stream);
    at::cuda::sleep(kSpinCycles);  // a slow copy stream
  }
  auto copy = transport::copy_into(src, ready, dst, copy_stream, compute);
  expect_no_pending_cuda_error("after copy_into");
  // The producer's next step overwrites its buffer once the copy is done.
  copy.done->block(producer);
  {
    c10::cuda::CUDAStreamGuard on(producer);
    src.fill_(9.f);
  }
  // Each read on the stream that owns the buffer's last write.
  const auto seen = on_stream(compute, [&] { return dst.cpu(); });
  EXPECT_TRUE(at::equal(seen, at::full({n}, 7.f)))
    << "the producer overwrote its buffer before the consumer's copy";
  EXPECT_TRUE(at::equal(on_stream(producer, [&] { return src.cpu(); }), at::full({n}, 9.f)))
    << "the producer's own write must land after the copy";
}

TEST(peer, producer_tensor_kept_alive_until_copy_done) {
  TANDEM_REQUIRE_GPUS(2);
  const int64_t n = int64_t{8} << 20;
  auto producer = c10::cuda::getStreamFromPool(false, 0);
  auto copy_stream = c10::cuda::getStreamFromPool(false, 1);
  auto compute = c10::cuda::getStreamFromPool(false, 1);
  auto dst = at::zeros({n}, f32_on(1));
  torch::cuda::synchronize(1);
  {
    c10::cuda::CUDAStreamGuard on(copy_stream);
    at::cuda::sleep(kSpinCycles);
  }
  transport::device_copy copy;
  {
    c10::cuda::CUDAStreamGuard on(producer);
    auto src = at::full({n}, 5.f, f32_on(0));
    auto ready = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
    ready->record(producer);
    copy = transport::copy_into(src, ready, dst, copy_stream, compute);
  }  // the producer drops its last reference while the copy still waits
  {
    // Without the allocator knowing the copy stream uses it, this would get
    // the same memory and scribble over it before the copy.
    c10::cuda::CUDAStreamGuard on(producer);
    for (int i = 0; i < 4; ++i)
      at::empty({n}, f32_on(0)).fill_(-1.f);
  }
  const auto seen = on_stream(compute, [&] { return dst.cpu(); });
  EXPECT_TRUE(at::equal(seen, at::full({n}, 5.f)))
    << "the producer's freed buffer was reused before the copy read it";
}

TEST(peer, same_device_returns_the_same_storage) {
  TANDEM_REQUIRE_GPUS(1);
  auto producer = c10::cuda::getStreamFromPool(false, 0);
  auto compute = c10::cuda::getStreamFromPool(false, 0);
  at::Tensor src;
  auto ready = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
  {
    c10::cuda::CUDAStreamGuard on(producer);
    src = at::arange(1000, f32_on(0));
    ready->record(producer);
  }
  auto got = transport::fetch(src, ready, cuda(0), compute, compute);
  EXPECT_EQ(got.path, transport::copy_path::same_device);
  EXPECT_FALSE(got.done) << "no copy, no event";
  EXPECT_TRUE(got.tensor.is_same(src));
  EXPECT_EQ(got.tensor.data_ptr(), src.data_ptr());
  at::Tensor seen;
  {
    c10::cuda::CUDAStreamGuard on(compute);
    seen = got.tensor * 1;
  }
  EXPECT_TRUE(at::equal(seen.cpu(), at::arange(1000, at::kFloat)));
}

TEST(peer, acquire_from_another_gpu_copies_through_the_registry) {
  TANDEM_REQUIRE_GPUS(2);
  auto producer = c10::cuda::getStreamFromPool(false, 0);
  transport::payload p;
  {
    c10::cuda::CUDAStreamGuard on(producer);
    p.tensors = {at::arange(4096, f32_on(0)).view({64, 64}),
                 at::arange(10, at::TensorOptions().dtype(at::kLong).device(cuda(0)))};
    p.ready = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
    p.ready->record(producer);
  }
  const auto h = transport::publish(p);
  {
    c10::cuda::CUDAGuard device(1);
    c10::cuda::CUDAStreamGuard on(c10::cuda::getStreamFromPool(false, 1));
    auto got = transport::acquire(h, cuda(1));
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].device(), cuda(1));
    EXPECT_EQ(got[0].sizes(), (std::vector<int64_t>{64, 64}));
    EXPECT_TRUE(at::equal(got[0].cpu(), at::arange(4096, at::kFloat).view({64, 64})));
    EXPECT_TRUE(at::equal(got[1].cpu(), at::arange(10, at::kLong)));
  }
  EXPECT_TRUE(transport::release(h));
}

#else

TEST(nccl, gpu_cases) {
  GTEST_SKIP() << "SKIPPED: built without CUDA";
}

#endif
