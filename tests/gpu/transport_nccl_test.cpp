// Feature transport across nodes by NCCL send/recv (gpu/transport/nccl.hpp).
//
// transport_nccl_cpu.*  specs and their checks; runs everywhere (no GPU).
// transport_nccl.*      2 CUDA devices and NCCL, one thread per rank, each
//                       its own device and communicator rank (rank 0 the
//                       producer, rank 1 the consumer), as two actors on two
//                       nodes would be; SKIPPED otherwise.  On a 2-GPU host:
//   build/bin/gpu_tests --gtest_filter='transport_nccl*'
// Rank threads are guarded by a watchdog: a hang that the timeouts fail to end
// aborts the process with a message naming the ranks, instead of hanging.
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

#include "gpu/engine/batch.hpp"
#include "gpu/device/error.hpp"
#include "gpu/nccl/communicator.hpp"
#include "gpu/pch.hpp"
#include "gpu/transport/nccl.hpp"
#include "gpu/transport/tensors.hpp"
#include "tests/gpu/fixtures.hpp"

namespace nccl = tandem::gpu::nccl;
namespace transport = tandem::gpu::transport;
using tandem::errc;
using tandem::gpu::error;
using transport::tensor_spec;
using namespace std::chrono_literals;

namespace {

using tandem::test::contains;
using tandem::test::expect_error;
using tandem::gpu::test::seconds_since;
using tandem::gpu::test::steady;

/// The test's payload: what a prefetch and a target publish for one batch.
struct payload_shape {
  int64_t rows = 4, seq = 512, width = 3 * 1024;
};

std::vector<tensor_spec> specs_for(const payload_shape& p) {
  return {{{p.rows, p.seq}, at::kInt},               // tokens
          {{p.rows, p.seq}, at::kByte},              // loss mask
          {{p.rows, p.seq, p.width}, at::kBFloat16}};  // taps
}

/// Round `k`'s known values, on the CPU (its own generator: DESIGN.md §4).
std::vector<at::Tensor> values(const payload_shape& p, int k) {
  auto g = at::detail::createCPUGenerator(1000 + static_cast<uint64_t>(k));
  return {at::randint(0, 151936, {p.rows, p.seq}, g, at::TensorOptions().dtype(at::kInt)),
          at::randint(0, 2, {p.rows, p.seq}, g, at::TensorOptions().dtype(at::kByte)),
          at::randn({p.rows, p.seq, p.width}, g, at::TensorOptions().dtype(at::kFloat))
            .to(at::kBFloat16)};
}

/// Bit-for-bit equality, whatever the dtype.
bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes())
    return false;
  auto bytes = [](const at::Tensor& t) { return t.cpu().contiguous().reshape({-1}).view(at::kByte); };
  return at::equal(bytes(a), bytes(b));
}

} // namespace

// ─── CPU: specs ──────────────────────────────────────────────────────────────

TEST(transport_nccl_cpu, specs_of_a_published_payload_match_the_descriptors) {
  const auto b = tandem::gpu::test::phrase_batch(3, 40, 7);  // doc_lengths [3, 2]
  const auto h = tandem::gpu::publish_batch(b);
  tandem::batch_desc desc;
  desc.batch_id = 12;
  desc.rows = 3;
  desc.seq_len = 40;
  desc.handle = h;
  const auto held = transport::specs_of(h);
  ASSERT_EQ(held.size(), 3u);
  EXPECT_EQ(held, transport::batch_specs(desc, 2));
  EXPECT_EQ(transport::to_string(held[0]), "[3, 40] Int");
  EXPECT_EQ(transport::to_string(held[2]), "[3, 2] Long");
  EXPECT_EQ(held[1].bytes(), 3 * 40);
  EXPECT_EQ(held[2].bytes(), 3 * 2 * 8);
  transport::check_matches(held, transport::batch_specs(desc, 2), "batch");  // no throw

  auto m = expect_error(errc::bad_input,
                        [&] { transport::check_matches(held, transport::batch_specs(desc, 16), "batch 12"); });
  EXPECT_TRUE(contains(m, "batch 12: tensor 2 is [3, 2] Long, the receiver expects [3, 16] Long"))
    << m;
  EXPECT_TRUE(contains(m, "(shape differ)")) << m;
  expect_error(errc::bad_input, [&] { transport::batch_specs(desc, 0); });
  EXPECT_TRUE(transport::release(h));

  tandem::features_desc f;
  f.shape = {3, 40, 192};
  const auto taps = transport::feature_specs(f, at::kBFloat16);
  ASSERT_EQ(taps.size(), 1u);
  EXPECT_EQ(taps[0].bytes(), 3 * 40 * 192 * 2);
  EXPECT_EQ(transport::to_string(taps[0]), "[3, 40, 192] BFloat16");
  // The descriptor's own dtype (the target fills it in).
  f.dtype = "float32";
  EXPECT_EQ(transport::to_string(transport::feature_specs(f)[0]), "[3, 40, 192] Float");
  f.dtype = "int8";
  auto bad = expect_error(errc::bad_input, [&] { transport::feature_specs(f); });
  EXPECT_TRUE(contains(bad, "dtype 'int8'")) << bad;
}

TEST(transport_nccl_cpu, checks_name_what_differs) {
  const payload_shape p{2, 8, 16};
  const auto expected = specs_for(p);
  auto fewer = expected;
  fewer.pop_back();
  auto m = expect_error(errc::bad_input, [&] { transport::check_matches(fewer, expected, "x"); });
  EXPECT_TRUE(contains(m, "x: the payload holds 2 tensors, the receiver expects 3")) << m;

  auto wrong_dtype = expected;
  wrong_dtype[2].dtype = at::kFloat;
  m = expect_error(errc::bad_input, [&] { transport::check_matches(wrong_dtype, expected, "x"); });
  EXPECT_TRUE(contains(m, "tensor 2 is [2, 8, 16] Float, the receiver expects [2, 8, 16] BFloat16"))
    << m;
  EXPECT_TRUE(contains(m, "(dtype differ)")) << m;

  auto both = expected;
  both[0] = {{2, 9}, at::kLong};
  m = expect_error(errc::bad_input, [&] { transport::check_matches(both, expected, "x"); });
  EXPECT_TRUE(contains(m, "tensor 0 is [2, 9] Long")) << m;
  EXPECT_TRUE(contains(m, "(shape and dtype differ)")) << m;

  transport::check_specs(expected, "ok");  // no throw
  m = expect_error(errc::bad_input, [] { transport::check_specs({{{2, -1}, at::kInt}}, "y"); });
  EXPECT_TRUE(contains(m, "y: tensor 0 [2, -1] Int has a negative size")) << m;
  m = expect_error(errc::bad_input, [] { transport::check_specs({{}, {{3}, at::ScalarType::Undefined}}, "y"); });
  EXPECT_TRUE(contains(m, "y: tensor 0 [] has no dtype")) << m;

  // The producer's view of its own payload: shapes and dtypes, no data touched.
  transport::payload pl;
  pl.tensors = values(p, 0);
  pl.tensors.push_back(at::ones({3, 4}).t());  // non-contiguous: a spec still
  const auto h = transport::publish(pl);
  auto held = transport::specs_of(h);
  ASSERT_EQ(held.size(), 4u);
  EXPECT_EQ(std::vector<tensor_spec>(held.begin(), held.begin() + 3), expected);
  EXPECT_EQ(transport::to_string(held[3]), "[4, 3] Float");
  EXPECT_TRUE(transport::release(h));
  m = expect_error(errc::bad_input, [&] { transport::specs_of(h); });
  EXPECT_TRUE(contains(m, "unknown handle " + std::to_string(h))) << m;
}

#ifdef TANDEM_HAVE_CUDA

// ─── GPU ─────────────────────────────────────────────────────────────────────

namespace {

at::Device cuda(int i) {
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(i));
}

constexpr int producer_rank = 0;
constexpr int consumer_rank = 1;
/// One thread per rank (tests/gpu/fixtures.hpp), named for this test's hang message.
void on_ranks(int world, const std::function<void(int)>& body,
              std::chrono::seconds limit = std::chrono::seconds(120)) {
  tandem::gpu::test::on_ranks("transport_nccl_test", world, body, limit);
}

/// `read()` with `stream` current: ordered after the work on that stream
/// (pool streams do not synchronise with the legacy default stream).
at::Tensor on_stream(const c10::cuda::CUDAStream& stream, const std::function<at::Tensor()>& read) {
  c10::cuda::CUDAStreamGuard on(stream);
  return read();
}

nccl::communicator_options comm_options() {
  nccl::communicator_options o;
  o.timeout = 60s;
  o.name = "transport";
  return o;
}

transport::transfer_options enqueue_only(std::chrono::milliseconds timeout = 60s) {
  transport::transfer_options o;
  o.timeout = timeout;
  o.wait = false;
  return o;
}

transport::transfer_options waited(std::chrono::milliseconds timeout = 60s) {
  transport::transfer_options o;
  o.timeout = timeout;
  o.wait = true;
  return o;
}

/// The producer's side of one good transfer of `vals` (used after the
/// refused calls, to show that the pair of ranks is still in step).
void send_once(nccl::communicator& comm, const std::vector<at::Tensor>& vals,
               const std::vector<tensor_spec>& specs, const c10::cuda::CUDAStream& stream) {
  transport::payload pl;
  {
    c10::cuda::CUDAStreamGuard on(stream);
    for (const auto& v : vals)
      pl.tensors.push_back(v.to(cuda(comm.device())));
    pl.ready = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
    pl.ready->record(stream);
  }
  const auto h = transport::publish(pl);
  transport::send_payload(comm, consumer_rank, h, specs, stream, waited());
  EXPECT_TRUE(transport::release(h));
}

} // namespace

TEST(transport_nccl, payload_moves_bitwise_and_producer_reuses_buffers_after_send_event) {
  TANDEM_REQUIRE_GPUS(2);
  TANDEM_REQUIRE_NCCL();
  const payload_shape p;  // taps 4 × 512 × 3072 bf16: 12 MiB, more than NCCL buffers in flight
  const auto specs = specs_for(p);
  constexpr int rounds = 5;
  constexpr int by_recv_into = 3;  // rounds ≥ this go into the consumer's static buffers
  const auto id = nccl::new_unique_id();
  on_ranks(2, [&](int r) {
    c10::cuda::CUDAGuard device(static_cast<c10::DeviceIndex>(r));
    nccl::communicator comm(id, r, 2, r, comm_options());
    if (r == producer_rank) {
      auto compute = c10::cuda::getStreamFromPool(false, 0);  // P: writes the buffers
      auto send = c10::cuda::getStreamFromPool(false, 0);     // S: sends only
      // Every round's values already on the device, so the loop below only
      // enqueues (nothing here waits on the consumer).
      std::vector<std::vector<at::Tensor>> staged;
      std::vector<at::Tensor> buffers;  // the producer's static buffers
      {
        c10::cuda::CUDAStreamGuard on(compute);
        for (int k = 0; k < rounds; ++k) {
          staged.emplace_back();
          for (const auto& v : values(p, k))
            staged.back().push_back(v.to(cuda(0)));
        }
        for (const auto& s : specs)
          buffers.push_back(at::zeros(s.shape, at::TensorOptions().dtype(s.dtype).device(cuda(0))));
      }
      std::shared_ptr<at::cuda::CUDAEvent> sent;
      std::vector<transport::handle> handles;
      for (int k = 0; k < rounds; ++k) {
        // The next write to the buffers waits for the previous round's sends:
        // the consumer posts its recv late on purpose, so a write that did
        // not wait would land in the bytes still being sent.
        if (sent)
          sent->block(compute);
        transport::payload pl;
        {
          c10::cuda::CUDAStreamGuard on(compute);
          for (size_t i = 0; i < buffers.size(); ++i)
            buffers[i].copy_(staged[static_cast<size_t>(k)][i]);
          pl.tensors = buffers;
          pl.ready = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
          pl.ready->record(compute);
        }
        const auto h = transport::publish(pl);
        EXPECT_EQ(transport::specs_of(h), specs);
        sent = transport::send_payload(comm, consumer_rank, h, specs, send, enqueue_only());
        ASSERT_TRUE(sent);
        handles.push_back(h);
      }
      // Bound the sends on the host, then the buffers and handles may go.
      comm.wait(send.stream(), 60s, "the producer's sends");
      EXPECT_TRUE(sent->query());
      for (auto h : handles)
        EXPECT_TRUE(transport::release(h));
      EXPECT_TRUE(same_bytes(on_stream(compute, [&] { return buffers[2].cpu(); }),
                             values(p, rounds - 1)[2]));
    } else {
      auto copy = c10::cuda::getStreamFromPool(false, 1);
      auto compute = c10::cuda::getStreamFromPool(false, 1);
      std::vector<at::Tensor> statics;
      for (const auto& s : specs)
        statics.push_back(at::zeros(s.shape, at::TensorOptions().dtype(s.dtype).device(cuda(1))));
      torch::cuda::synchronize(1);
      for (int k = 0; k < rounds; ++k) {
        std::this_thread::sleep_for(150ms);  // the consumer pulls late
        std::vector<at::Tensor> got;
        if (k < by_recv_into) {
          auto rx = transport::recv_payload(comm, producer_rank, specs, cuda(1), copy, compute,
                                            waited());
          ASSERT_TRUE(rx.done);
          EXPECT_TRUE(rx.done->query()) << "waited: the receive has completed";
          got = rx.tensors;
        } else {
          auto done = transport::recv_into(comm, producer_rank, statics, copy, compute, waited());
          ASSERT_TRUE(done);
          got = statics;
        }
        const auto expected = values(p, k);
        ASSERT_EQ(got.size(), expected.size());
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_EQ(got[i].device(), cuda(1));
          EXPECT_TRUE(got[i].is_contiguous());
          const auto seen = on_stream(compute, [&] { return got[i].cpu(); });
          EXPECT_TRUE(same_bytes(seen, expected[i]))
            << "round " << k << ", tensor " << i << " " << transport::to_string(specs[i])
            << ": the consumer did not get the producer's bytes of this round";
        }
      }
    }
    EXPECT_TRUE(comm.close(60s)) << "rank " << r << ": " << comm.failure();
  });
}

TEST(transport_nccl, mismatches_fail_with_bad_input_before_any_nccl_call) {
  TANDEM_REQUIRE_GPUS(2);
  TANDEM_REQUIRE_NCCL();
  const payload_shape p{2, 64, 32};
  const auto specs = specs_for(p);
  const auto id = nccl::new_unique_id();
  on_ranks(2, [&](int r) {
    c10::cuda::CUDAGuard device(static_cast<c10::DeviceIndex>(r));
    nccl::communicator comm(id, r, 2, r, comm_options());
    // Each refused call must come back at once: no NCCL call, no deadline.
    auto refused = [&](const char* label, const std::function<void()>& call) {
      const auto t0 = steady::now();
      auto m = expect_error(errc::bad_input, call);
      EXPECT_LT(seconds_since(t0), 1.0) << label;
      EXPECT_TRUE(comm.usable()) << label << ": " << comm.failure();
      std::printf("rank %d, %s: %s\n", r, label, m.c_str());
      return m;
    };
    if (r == producer_rank) {
      auto send = c10::cuda::getStreamFromPool(false, 0);
      transport::payload pl;
      {
        c10::cuda::CUDAStreamGuard on(send);
        for (const auto& v : values(p, 0))
          pl.tensors.push_back(v.to(cuda(0)));
      }
      const auto h = transport::publish(pl);
      auto m = refused("unknown handle", [&] {
        transport::send_payload(comm, consumer_rank, h + 1000, specs, send, waited(5s));
      });
      EXPECT_TRUE(contains(m, "NCCL rank 0 of 2 on cuda:0 (transport): send_payload of handle "
                                + std::to_string(h + 1000) + " to rank 1"))
        << m;
      EXPECT_TRUE(contains(m, "unknown handle")) << m;
      auto fewer = specs;
      fewer.pop_back();
      m = refused("count", [&] {
        transport::send_payload(comm, consumer_rank, h, fewer, send, waited(5s));
      });
      EXPECT_TRUE(contains(m, "holds 3 tensors, the receiver expects 2")) << m;
      auto wider = specs;
      wider[2].shape[2] += 1;
      m = refused("shape", [&] {
        transport::send_payload(comm, consumer_rank, h, wider, send, waited(5s));
      });
      EXPECT_TRUE(contains(m, "tensor 2 is [2, 64, 32] BFloat16, the receiver expects [2, 64, 33]"))
        << m;
      auto f32 = specs;
      f32[2].dtype = at::kFloat;
      m = refused("dtype", [&] {
        transport::send_payload(comm, consumer_rank, h, f32, send, waited(5s));
      });
      EXPECT_TRUE(contains(m, "(dtype differ)")) << m;
      auto other_gpu = c10::cuda::getStreamFromPool(false, 1);
      m = refused("stream device", [&] {
        transport::send_payload(comm, consumer_rank, h, specs, other_gpu, waited(5s));
      });
      EXPECT_TRUE(contains(m, "the send stream is on cuda:1, the communicator on cuda:0")) << m;
      m = refused("self", [&] {
        transport::send_payload(comm, producer_rank, h, specs, send, waited(5s));
      });
      EXPECT_TRUE(contains(m, "this rank itself")) << m;
      m = refused("no such rank", [&] { transport::send_payload(comm, 5, h, specs, send, waited(5s)); });
      EXPECT_TRUE(contains(m, "peer 5 is not a rank of a world of 2")) << m;
      EXPECT_TRUE(transport::release(h));
      // The pair is still in step: a good transfer arrives intact.
      send_once(comm, values(p, 1), specs, send);
    } else {
      auto copy = c10::cuda::getStreamFromPool(false, 1);
      auto compute = c10::cuda::getStreamFromPool(false, 1);
      auto m = refused("consumer device", [&] {
        transport::recv_payload(comm, producer_rank, specs, cuda(0), copy, compute, waited(5s));
      });
      EXPECT_TRUE(contains(m, "recv_payload from rank 0: the consumer's device is cuda:0, the "
                              "communicator's cuda:1"))
        << m;
      auto other_gpu = c10::cuda::getStreamFromPool(false, 0);
      m = refused("copy stream device", [&] {
        transport::recv_payload(comm, producer_rank, specs, cuda(1), other_gpu, compute, waited(5s));
      });
      EXPECT_TRUE(contains(m, "the copy stream is on cuda:0")) << m;
      auto negative = specs;
      negative[0].shape[0] = -2;
      m = refused("negative size", [&] {
        transport::recv_payload(comm, producer_rank, negative, cuda(1), copy, compute, waited(5s));
      });
      EXPECT_TRUE(contains(m, "negative size")) << m;
      auto strided = at::zeros({64, 2}, at::TensorOptions().dtype(at::kInt).device(cuda(1))).t();
      m = refused("non-contiguous destination", [&] {
        transport::recv_into(comm, producer_rank, {strided}, copy, compute, waited(5s));
      });
      EXPECT_TRUE(contains(m, "destination 0 [2, 64] is not contiguous")) << m;
      auto rx = transport::recv_payload(comm, producer_rank, specs, cuda(1), copy, compute, waited());
      const auto expected = values(p, 1);
      for (size_t i = 0; i < specs.size(); ++i)
        EXPECT_TRUE(same_bytes(on_stream(compute, [&] { return rx.tensors[i].cpu(); }), expected[i]))
          << "tensor " << i;
    }
    EXPECT_TRUE(comm.close(60s)) << "rank " << r << ": " << comm.failure();
  });
}

TEST(transport_nccl, peer_that_stops_sending_times_out_and_both_ranks_abort) {
  // One good transfer first (the pair is connected, as mid-run), then the
  // producer goes silent: the consumer's receive is enqueued and never
  // completes, and the deadline ends it.
  TANDEM_REQUIRE_GPUS(2);
  TANDEM_REQUIRE_NCCL();
  const payload_shape p{2, 64, 32};
  const auto specs = specs_for(p);
  const auto id = nccl::new_unique_id();
  std::promise<void> gave_up;
  auto consumer_gave_up = gave_up.get_future().share();
  on_ranks(2, [&](int r) {
    c10::cuda::CUDAGuard device(static_cast<c10::DeviceIndex>(r));
    nccl::communicator comm(id, r, 2, r, comm_options());
    if (r == producer_rank) {
      send_once(comm, values(p, 0), specs, c10::cuda::getStreamFromPool(false, 0));
      // Then never sends again.  Told (by message, in Tandem) that the
      // consumer gave up, it aborts its rank too.
      consumer_gave_up.wait();
      EXPECT_TRUE(comm.abort()) << "producer: ncclCommAbort did not return in time";
      EXPECT_FALSE(comm.usable());
      return;
    }
    auto copy = c10::cuda::getStreamFromPool(false, 1);
    auto compute = c10::cuda::getStreamFromPool(false, 1);
    auto first = transport::recv_payload(comm, producer_rank, specs, cuda(1), copy, compute, waited());
    EXPECT_TRUE(same_bytes(on_stream(compute, [&] { return first.tensors[2].cpu(); }), values(p, 0)[2]));
    const auto t0 = steady::now();
    auto m = expect_error(errc::timeout, [&] {
      transport::recv_payload(comm, producer_rank, specs, cuda(1), copy, compute, waited(5s));
    });
    const double s = seconds_since(t0);
    std::printf("consumer alone in recv_payload: %.2f s: %s\n", s, m.c_str());
    EXPECT_GE(s, 4.9);
    EXPECT_LT(s, 8.0) << "the error must come at the deadline";
    EXPECT_TRUE(contains(m, "NCCL rank 1 of 2 on cuda:1 (transport): recv_payload from rank 0")) << m;
    EXPECT_TRUE(contains(m, "did not complete within")) << m;
    EXPECT_FALSE(comm.usable()) << "a timeout aborts the communicator";
    gave_up.set_value();
    EXPECT_TRUE(comm.abort()) << "consumer: ncclCommAbort did not return in time";
    // Further transfers are refused at once; the device itself is fine.
    auto again = expect_error(errc::device_failure, [&] {
      transport::recv_payload(comm, producer_rank, specs, cuda(1), copy, compute, waited(5s));
    });
    EXPECT_TRUE(contains(again, "not usable")) << again;
    EXPECT_EQ(on_stream(compute, [&] { return at::ones({8}, at::TensorOptions().device(cuda(1))).sum().cpu(); })
                .item<float>(),
              8.f);
    EXPECT_FALSE(comm.close(1s)) << "an aborted communicator does not close cleanly";
  });
}

TEST(transport_nccl, consumer_that_never_pulls_times_the_send_out) {
  // The consumer never takes part at all (NCCL never connects the pair):
  // the send cannot even be enqueued, and the deadline ends it.
  TANDEM_REQUIRE_GPUS(2);
  TANDEM_REQUIRE_NCCL();
  const payload_shape p;  // 12 MiB of taps: the send cannot finish without a recv
  const auto specs = specs_for(p);
  const auto id = nccl::new_unique_id();
  std::promise<void> gave_up;
  auto producer_gave_up = gave_up.get_future().share();
  on_ranks(2, [&](int r) {
    c10::cuda::CUDAGuard device(static_cast<c10::DeviceIndex>(r));
    nccl::communicator comm(id, r, 2, r, comm_options());
    if (r == consumer_rank) {
      producer_gave_up.wait();
      EXPECT_TRUE(comm.abort()) << "consumer: ncclCommAbort did not return in time";
      return;
    }
    auto send = c10::cuda::getStreamFromPool(false, 0);
    transport::payload pl;
    {
      c10::cuda::CUDAStreamGuard on(send);
      for (const auto& v : values(p, 0))
        pl.tensors.push_back(v.to(cuda(0)));
    }
    const auto h = transport::publish(pl);
    const auto t0 = steady::now();
    auto m = expect_error(errc::timeout, [&] {
      transport::send_payload(comm, consumer_rank, h, specs, send, waited(3s));
    });
    const double s = seconds_since(t0);
    std::printf("producer alone in send_payload: %.2f s: %s\n", s, m.c_str());
    EXPECT_GE(s, 2.9);
    EXPECT_LT(s, 6.0);
    EXPECT_TRUE(contains(m, "send_payload of handle " + std::to_string(h) + " to rank 1")) << m;
    EXPECT_TRUE(contains(m, "within")) << m;
    EXPECT_FALSE(comm.usable());
    gave_up.set_value();
    EXPECT_TRUE(comm.abort());
    EXPECT_TRUE(transport::release(h));
  });
}

#else

TEST(transport_nccl, gpu_cases) {
  GTEST_SKIP() << "SKIPPED: built without CUDA";
}

#endif
