// The fused cross-entropy kernel (gpu/kernels/ce_grad.hpp) and the CUDA path
// of chunked_cross_entropy built on it, against float64 references computed
// from the same bf16 logits: per-row loss, hits (exact) and the logits'
// gradient at the Qwen3 vocabulary (V 151936) and small V (1003: a tail past
// the 16-byte chunks), labels at 0 and V − 1, weight-0 rows, an exact tie
// for the max; then chunked_cross_entropy end to end (loss, accuracy hits,
// dh through autograd), its determinism and its forward-only variant.  The
// CUDA cases print "[  SKIPPED ]" without a GPU; tests/gpu/ce_grad_harness.py
// runs the same checks on the kernel alone, plus timings.
#include <gtest/gtest.h>

#include "gpu/models/dflash_objective.hpp"
#include "gpu/pch.hpp"

#ifdef TANDEM_HAVE_CUDA
#include "gpu/kernels/ce_grad.hpp"
#include "tests/gpu/fixtures.hpp"
#endif

using namespace tandem::gpu;
using tandem::gpu::test::have_cuda;
using tandem::gpu::test::gen;
using tandem::gpu::test::rel_err;

namespace {

// Tolerances, all against float64 of the same logits (so only fp32 rounding
// and the final cast differ; measured on an H200 by ce_grad_harness.py):
/// Per-row loss w·(lse − x[y]): |err| <= rel · |lse| · w + abs.  fp32 sums of
/// V exponentials in a different order (measured ≤ 1.6e-7 relative).
constexpr double loss_rel = 1e-5;
constexpr double loss_abs = 1e-6;
/// Gradient element: one rounding to bf16 (2^-9) of an fp32 value whose lse
/// is off by a few ulps: |err| <= 2^-8 |ref| + 1e-7 · w (measured ‖·‖ 1.6e-3).
constexpr double grad_rel = 1.0 / 256;
constexpr double grad_abs = 1e-7;
/// dh = g·head in bf16 against float64 g·head: g's rounding plus the bf16
/// output's (2^-9 each), summed over V terms (expected ~3e-3).
constexpr double dh_rel = 1e-2;
/// Loss sum of the whole chunked path vs float64 of the same logits.
constexpr double sum_rel = 1e-6;

struct ce_inputs {
  at::Tensor labels;  ///< [rows] int64 (CUDA)
  at::Tensor weight;  ///< [rows] float
  at::Tensor mask;    ///< [rows] float
};

/// Labels with 0 and V − 1, every fourth row labelled with `argmax_of`'s
/// argmax (so hits are not all zero), row 2 weight 0.
ce_inputs make_targets(int64_t rows, int64_t vocab, const at::Tensor& argmax_of, at::Generator& g) {
  ce_inputs t;
  auto y = at::randint(0, vocab, {rows}, g);
  y[0] = 0;
  y[1] = vocab - 1;
  auto am = argmax_of.to(at::kFloat).argmax(1).cpu();
  for (int64_t r = 3; r < rows; r += 4)
    y[r] = am[r];
  auto w = at::rand({rows}, g) + 0.1;
  w[2] = 0.0;
  t.labels = y.to(at::kCUDA);
  t.weight = w.to(at::kCUDA);
  t.mask = (at::rand({rows}, g) < 0.8).to(at::kFloat).to(at::kCUDA);
  return t;
}

struct reference {
  at::Tensor loss;  ///< [rows] double
  at::Tensor hit;   ///< [rows] double
  at::Tensor grad;  ///< [rows, V] double
  at::Tensor lse;   ///< [rows] double
};

/// chunked_ce_fn's composite in float64 on the same logits.
reference reference64(const at::Tensor& logits, const ce_inputs& t) {
  reference r;
  auto x = logits.to(at::kDouble);
  auto y = t.labels.unsqueeze(1);
  auto w = t.weight.to(at::kDouble);
  r.lse = at::logsumexp(x, 1);
  r.loss = (r.lse - x.gather(1, y).squeeze(1)) * w;
  r.hit = (x.argmax(1) == t.labels).to(at::kDouble) * t.mask.to(at::kDouble);
  r.grad = at::exp(x - r.lse.unsqueeze(1));
  r.grad.scatter_add_(1, y, at::full({x.size(0), 1}, -1.0, r.grad.options()));
  r.grad.mul_(w.unsqueeze(1));
  return r;
}

#ifdef TANDEM_HAVE_CUDA
/// `stride` > vocab: the logits are rows of a wider buffer (16-byte-aligned
/// rows whose vocabulary is not a multiple of 8: the vector path's tail).
void check_kernel(int64_t rows, int64_t vocab, bool write_grad, int64_t stride = 0) {
  SCOPED_TRACE(::testing::Message() << "[" << rows << ", " << vocab << "]"
                                    << (write_grad ? "" : " forward only") << " stride " << stride);
  auto g = gen(3);
  auto x = (at::randn({rows, vocab}, g) * 3).to(at::kCUDA, at::kBFloat16);
  // An exact tie for the max in row 5: the first index must win.
  x[5][7] = x[5].max();
  x[5][vocab - 2] = x[5][7];
  auto t = make_targets(rows, vocab, x, g);
  t.labels[5] = 7;
  auto ref = reference64(x, t);

  auto buf = stride > vocab ? at::zeros({rows, stride}, x.options()).narrow(1, 0, vocab) : at::empty_like(x);
  buf.copy_(x);
  auto out = at::empty({3, rows}, x.options().dtype(at::kFloat));
  tandem::gpu::kernels::ce_grad_args a;
  a.rows = rows;
  a.vocab = vocab;
  a.row_stride = buf.stride(0);
  a.dtype = tandem::gpu::kernels::ce_dtype::bf16;
  a.logits = buf.data_ptr();
  a.labels = t.labels.data_ptr<int64_t>();
  a.weight = t.weight.data_ptr<float>();
  a.mask = t.mask.data_ptr<float>();
  a.row_loss = out[0].data_ptr<float>();
  a.row_hit = out[1].data_ptr<float>();
  a.row_lse = out[2].data_ptr<float>();
  a.write_grad = write_grad;
  ASSERT_EQ(tandem::gpu::kernels::ce_grad(a, at::cuda::getCurrentCUDAStream()), cudaSuccess);

  auto w = t.weight.to(at::kDouble);
  auto loss_err = (out[0].to(at::kDouble) - ref.loss).abs();
  EXPECT_TRUE((loss_err <= loss_rel * ref.lse.abs() * w + loss_abs).all().item<bool>())
    << "max loss error " << loss_err.max().item<double>();
  EXPECT_TRUE(at::equal(out[1], ref.hit.to(at::kFloat)));
  EXPECT_GT(out[1].sum().item<double>(), 0.0);
  EXPECT_EQ(out[1][5].item<float>(), t.mask[5].item<float>());  // the tie: index 7 wins
  if (write_grad) {
    auto d = (buf.to(at::kDouble) - ref.grad).abs();
    auto lim = grad_rel * ref.grad.abs() + grad_abs * w.unsqueeze(1);
    EXPECT_TRUE((d <= lim).all().item<bool>()) << "grad rel " << rel_err(buf, ref.grad);
    EXPECT_TRUE(at::equal(buf[2], at::zeros_like(buf[2])));  // weight 0: no gradient
  } else {
    EXPECT_TRUE(at::equal(buf, x));
  }
}
#endif

} // namespace

TEST(ce_grad, cuda_kernel_matches_float64_at_qwen3_vocab) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device visible";
#ifdef TANDEM_HAVE_CUDA
  check_kernel(300, 151936, /*write_grad=*/true);
  check_kernel(64, 151936, /*write_grad=*/false);
  check_kernel(40, 250003, /*write_grad=*/true, 250008);  // aligned rows, a 3-element tail
#endif
}

TEST(ce_grad, cuda_kernel_matches_float64_at_small_vocab) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device visible";
#ifdef TANDEM_HAVE_CUDA
  check_kernel(300, 1003, /*write_grad=*/true);  // unaligned rows: the scalar path
  check_kernel(300, 1024, /*write_grad=*/true);
  check_kernel(300, 1003, /*write_grad=*/true, 1008);  // aligned, with a tail
#endif
}

TEST(ce_grad, cuda_chunked_cross_entropy_matches_float64_of_its_logits) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device visible";
  const int64_t rows = 300, d = 256, vocab = 151936, chunk = 128;  // 2 full chunks + 44 rows
  auto g = gen(9);
  auto h = (at::randn({rows, d}, g)).to(at::kCUDA, at::kBFloat16);
  auto head = (at::randn({vocab, d}, g) * 0.2).to(at::kCUDA, at::kBFloat16);
  auto probe = at::matmul(h, head.t());
  auto t = make_targets(rows, vocab, probe, g);

  auto hl = h.detach().requires_grad_(true);
  auto out = chunked_cross_entropy(hl, head, t.labels, t.weight, t.mask, chunk);
  out.weighted_ce.backward();

  // float64 of the same logits: the same matmul call per chunk as the kernel
  // path makes, so the same bf16 values.
  double loss = 0, hits = 0;
  std::vector<at::Tensor> dh;
  for (int64_t r = 0; r < rows; r += chunk) {
    const auto len = std::min(chunk, rows - r);
    auto logits = at::matmul(h.narrow(0, r, len), head.t());
    ce_inputs c{t.labels.narrow(0, r, len), t.weight.narrow(0, r, len), t.mask.narrow(0, r, len)};
    auto ref = reference64(logits, c);
    loss += ref.loss.sum().item<double>();
    hits += ref.hit.sum().item<double>();
    dh.push_back(at::matmul(ref.grad, head.to(at::kDouble)));
  }
  EXPECT_NEAR(out.weighted_ce.item<double>(), loss, sum_rel * std::abs(loss));
  EXPECT_EQ(out.hits.item<double>(), hits);
  EXPECT_GT(hits, 0.0);
  ASSERT_TRUE(hl.grad().defined());
  EXPECT_LT(rel_err(hl.grad(), at::cat(dh)), dh_rel);

  // Deterministic: a second call is bit-equal.
  auto hl2 = h.detach().requires_grad_(true);
  auto out2 = chunked_cross_entropy(hl2, head, t.labels, t.weight, t.mask, chunk);
  out2.weighted_ce.backward();
  EXPECT_TRUE(at::equal(out.weighted_ce, out2.weighted_ce));
  EXPECT_TRUE(at::equal(hl.grad(), hl2.grad()));

  // Forward only (no gradient wanted): the same loss and hits, bit for bit.
  {
    at::NoGradGuard no_grad;
    auto f = chunked_cross_entropy(h, head, t.labels, t.weight, t.mask, chunk);
    EXPECT_TRUE(at::equal(f.weighted_ce, out.weighted_ce));
    EXPECT_TRUE(at::equal(f.hits, out.hits));
  }

  // The fp32 composite on the GPU (no bf16 rounding of the logits): close.
  auto hf = h.to(at::kFloat).requires_grad_(true);
  auto c = chunked_cross_entropy(hf, head.to(at::kFloat), t.labels, t.weight, t.mask, chunk);
  c.weighted_ce.backward();
  EXPECT_NEAR(out.weighted_ce.item<double>(), c.weighted_ce.item<double>(),
              1e-3 * std::abs(c.weighted_ce.item<double>()));  // logits' bf16 rounding
  EXPECT_LT(rel_err(hl.grad(), hf.grad()), 3e-2);
}

TEST(ce_grad, cuda_backward_scales_the_stored_gradient_as_the_composite) {
  // chunked_ce_fn's backward multiplies the gradient it stored (for an
  // upstream 1) by the upstream scalar in fp32 and rounds once; on CUDA one
  // kernel (kernels::ce_scale) does what the composite's three ops did.
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device visible";
  const int64_t rows = 301, d = 136, vocab = 1000, chunk = 128;
  auto g = gen(12);
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(::testing::Message() << dtype);
    auto h = at::randn({rows, d}, g).to(at::kCUDA, dtype);
    auto head = (at::randn({vocab, d}, g) * 0.2).to(at::kCUDA, dtype);
    auto t = make_targets(rows, vocab, at::matmul(h, head.t()), g);
    auto h1 = h.detach().requires_grad_(true);
    chunked_cross_entropy(h1, head, t.labels, t.weight, t.mask, chunk).weighted_ce.backward();
    auto hs = h.detach().requires_grad_(true);
    const auto upstream = at::full({}, 1.0 / 3.7, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
    chunked_cross_entropy(hs, head, t.labels, t.weight, t.mask, chunk).weighted_ce.backward(upstream);
    const auto expected = (h1.grad().to(at::kFloat) * upstream).to(dtype);
    EXPECT_TRUE(at::equal(hs.grad(), expected));
    EXPECT_FALSE(at::equal(hs.grad(), h1.grad()));
  }
}
