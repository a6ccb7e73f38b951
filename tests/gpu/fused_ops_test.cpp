// fused_rms_norm and fused_apply_rope (gpu/models/fused_ops.hpp) against the
// composites they replace, evaluated in float64 through autograd on the same
// device: forward, dx, and dweight, at the target's and the drafter's row
// shapes (hidden states D 4096, per-head q/k rows D 128), bf16 and fp32,
// contiguous and strided inputs, eps as Qwen3 (1e-6).  The CPU case checks
// that the CPU path is the composite bit for bit; the CUDA cases print
// "[  SKIPPED ]" without a GPU.  tests/gpu/fused_ops_harness.py runs the
// same checks on the kernels alone, plus timings.
#include <gtest/gtest.h>

#include "gpu/models/common.hpp"
#include "gpu/models/fused_ops.hpp"
#include "gpu/pch.hpp"
#include "tests/gpu/fixtures.hpp"

using namespace tandem::gpu;
using tandem::gpu::test::have_cuda;
using tandem::gpu::test::gen;
using tandem::gpu::test::rel_err;

namespace {

// Tolerances on ‖ours − ref‖ / ‖ref‖ against the float64 composite.
/// bf16 forward: n and y are each rounded once to bf16 (2^-9 ≈ 2e-3 a
/// rounding); an H200 measured 2.3e-3 (fused_ops_harness.py).  Indexing or
/// reduction errors give O(1).
constexpr double bf16_fwd_rel = 1e-2;
/// bf16 gradients: fp32 math rounded once (measured 1.7e-3 dx, 2.4e-3 dw).
constexpr double bf16_grad_rel = 2e-2;
/// fp32: sums of D products in fp32 (measured 5e-8..2e-7).
constexpr double fp32_rel = 1e-5;
/// RoPE forward must equal the composite in the same dtype bit for bit; its
/// backward is fp32 math (bf16: one rounding, ~2e-3; fp32 ~3e-8).
constexpr double rope_bf16_grad_rel = 1e-2;
constexpr double rope_fp32_grad_rel = 1e-6;

constexpr double qwen3_eps = 1e-6;

struct norm_case {
  std::vector<int64_t> shape;  ///< [..., D]
  at::ScalarType dtype;
  bool strided = false;        ///< x a non-contiguous view (every other row)
  bool train_weight = true;    ///< weight requires grad (drafter) or not (target)
};

void check_norm(const norm_case& c) {
  SCOPED_TRACE(::testing::Message() << "D " << c.shape.back() << " dtype "
                                    << c.dtype << (c.strided ? " strided" : "")
                                    << (c.train_weight ? "" : " frozen weight"));
  auto g = gen(11);
  const auto d = c.shape.back();
  auto big = c.shape;
  if (c.strided)
    big[0] *= 2;
  auto x0 = (at::randn(big, g) * 3).to(at::kCUDA, c.dtype);
  auto x = c.strided ? x0.slice(0, 0, big[0], 2) : x0;
  ASSERT_EQ(x.is_contiguous(), !c.strided);
  auto w0 = (1 + 0.1 * at::randn({d}, g)).to(at::kCUDA, c.dtype);
  auto dy = at::randn(c.shape, g).to(at::kCUDA, c.dtype);

  auto xl = x.detach().requires_grad_(true);
  auto wl = w0.detach().requires_grad_(c.train_weight);
  ASSERT_EQ(fused_rms_norm_path(xl, wl), "cuda kernel");
  auto y = rms_norm(xl, wl, qwen3_eps);
  y.backward(dy);

  auto xr = x.detach().to(at::kDouble).requires_grad_(true);
  auto wr = w0.detach().to(at::kDouble).requires_grad_(true);
  auto yr = rms_norm_composite(xr, wr, qwen3_eps);
  yr.backward(dy.to(at::kDouble));

  const bool bf16 = c.dtype == at::kBFloat16;
  EXPECT_LT(rel_err(y, yr), bf16 ? bf16_fwd_rel : fp32_rel);
  EXPECT_LT(rel_err(xl.grad(), xr.grad()), bf16 ? bf16_grad_rel : fp32_rel);
  if (c.train_weight) {
    ASSERT_TRUE(wl.grad().defined());
    EXPECT_LT(rel_err(wl.grad(), wr.grad()), bf16 ? bf16_grad_rel : fp32_rel);
  } else {
    EXPECT_FALSE(wl.grad().defined());
  }
  if (bf16) {  // the composite's rounding: almost every element bit-equal
    auto same = rms_norm_composite(x, w0, qwen3_eps);
    EXPECT_GT((y.detach() == same).to(at::kFloat).mean().item<double>(), 0.99);
  }
  // Deterministic: a second forward + backward is bit-equal.
  auto xl2 = x.detach().requires_grad_(true);
  auto wl2 = w0.detach().requires_grad_(c.train_weight);
  rms_norm(xl2, wl2, qwen3_eps).backward(dy);
  EXPECT_TRUE(at::equal(xl.grad(), xl2.grad()));
  if (c.train_weight)
    EXPECT_TRUE(at::equal(wl.grad(), wl2.grad()));
}

void check_rope(at::ScalarType dtype, bool bthd) {
  SCOPED_TRACE(::testing::Message() << "dtype " << dtype << (bthd ? " [B,T,H,d] memory" : ""));
  auto g = gen(5);
  const int64_t b = 2, h = 8, t = 300, d = 128;
  auto make = [&] {
    return bthd ? at::randn({b, t, h, d}, g).to(at::kCUDA, dtype).transpose(1, 2)
                : at::randn({b, h, t, d}, g).to(at::kCUDA, dtype);
  };
  auto x = make(), dy = make();
  auto pos = at::randint(0, 40000, {b, t}, g).to(at::kCUDA);
  auto [cos, sin] = rope_tables(pos, d, 1e6);
  ASSERT_EQ(fused_apply_rope_path(x, cos, sin), "cuda kernel");

  auto xl = x.detach().requires_grad_(true);
  auto y = apply_rope(xl, cos, sin);
  y.backward(dy);
  EXPECT_TRUE(at::equal(y.detach(), apply_rope_composite(x, cos, sin)));
  EXPECT_EQ(y.strides(), x.strides());

  // float64 reference of the same function (cos/sin rounded to x's dtype, as
  // the composite does).
  auto xr = x.detach().to(at::kDouble).requires_grad_(true);
  auto yr = apply_rope_composite(xr, cos.to(dtype).to(at::kDouble), sin.to(dtype).to(at::kDouble));
  yr.backward(dy.to(at::kDouble));
  EXPECT_LT(rel_err(xl.grad(), xr.grad()),
            dtype == at::kBFloat16 ? rope_bf16_grad_rel : rope_fp32_grad_rel);
}

} // namespace

TEST(fused_ops, cpu_path_is_the_composite_bit_for_bit) {
  auto g = gen(1);
  auto x = at::randn({3, 5, 64}, g).to(at::kBFloat16);
  auto w = at::randn({64}, g).to(at::kBFloat16);
  EXPECT_EQ(fused_rms_norm_path(x, w), "composite (not on CUDA)");
  EXPECT_TRUE(at::equal(rms_norm(x, w, qwen3_eps), rms_norm_composite(x, w, qwen3_eps)));
  EXPECT_TRUE(at::equal(fused_rms_norm(x, w, qwen3_eps), rms_norm_composite(x, w, qwen3_eps)));
  auto q = at::randn({2, 4, 5, 64}, g);
  auto [cos, sin] = rope_tables(at::arange(5).unsqueeze(0).expand({2, 5}), 64, 1e6);
  EXPECT_TRUE(at::equal(apply_rope(q, cos, sin), apply_rope_composite(q, cos, sin)));
  EXPECT_TRUE(at::equal(fused_apply_rope(q, cos, sin), apply_rope_composite(q, cos, sin)));
}

TEST(fused_ops, cuda_rms_norm_hidden_rows_match_float64) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device visible";
  check_norm({{8192, 4096}, at::kBFloat16});
  check_norm({{8192, 4096}, at::kFloat});
  check_norm({{1000, 4096}, at::kBFloat16, /*strided=*/false, /*train_weight=*/false});
  check_norm({{300, 4096}, at::kBFloat16, /*strided=*/true});
}

TEST(fused_ops, cuda_rms_norm_per_head_rows_match_float64) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device visible";
  check_norm({{4, 512, 32, 128}, at::kBFloat16});
  check_norm({{4, 512, 32, 128}, at::kFloat});
  check_norm({{64, 8, 128}, at::kBFloat16, /*strided=*/true});
}

TEST(fused_ops, cuda_rms_norm_passing_adds_the_other_use_s_gradient_in_the_kernel) {
  // {rms_norm(x), x'}: the drafter's norm whose input is also a residual.
  // dx = the norm's dx + x''s gradient, against float64 autograd of the
  // composite used twice (bf16 and fp32, D 4096), and the same forward as
  // fused_rms_norm; x' unused gives the norm's dx alone.
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  for (auto dtype : {at::kBFloat16, at::kFloat}) {
    SCOPED_TRACE(::testing::Message() << "dtype " << dtype);
    auto g = gen(12);
    const int64_t rows = 96, d = 4096;
    auto x = (at::randn({2, rows / 2, d}, g) * 3).to(at::kCUDA, dtype);
    auto w = (1 + 0.1 * at::randn({d}, g)).to(at::kCUDA, dtype);
    auto dy = at::randn({2, rows / 2, d}, g).to(at::kCUDA, dtype);
    auto dr = at::randn({2, rows / 2, d}, g).to(at::kCUDA, dtype);
    auto xl = x.detach().requires_grad_(true), wl = w.detach().requires_grad_(true);
    auto [y, xp] = fused_rms_norm_passing(xl, wl, qwen3_eps);
    EXPECT_TRUE(at::equal(y.detach(), fused_rms_norm(x, w, qwen3_eps)));
    EXPECT_TRUE(at::equal(xp.detach(), x));
    ASSERT_TRUE(xp.grad_fn() != nullptr);  // the node's own view, not x itself
    torch::autograd::backward({y, xp}, {dy, dr});

    auto xr = x.detach().to(at::kDouble).requires_grad_(true), wr = w.detach().to(at::kDouble).requires_grad_(true);
    torch::autograd::backward({rms_norm_composite(xr, wr, qwen3_eps), xr * 1.0}, {dy.to(at::kDouble), dr.to(at::kDouble)});
    const bool bf16 = dtype == at::kBFloat16;
    EXPECT_LT(rel_err(xl.grad(), xr.grad()), bf16 ? bf16_grad_rel : fp32_rel);
    EXPECT_LT(rel_err(wl.grad(), wr.grad()), bf16 ? bf16_grad_rel : fp32_rel);

    // The other use's gradient absent: the norm's dx alone, as rms_norm's.
    auto xa = x.detach().requires_grad_(true), xb = x.detach().requires_grad_(true);
    auto ya = fused_rms_norm_passing(xa, w, qwen3_eps).first;
    ya.backward(dy);
    fused_rms_norm(xb, w, qwen3_eps).backward(dy);
    EXPECT_TRUE(at::equal(xa.grad(), xb.grad()));
  }
}

TEST(fused_ops, cuda_rms_norm_rope_is_the_norm_then_rope_in_one_kernel_each_way) {
  // The drafter's q/k heads when training: fused_rms_norm_rope against the two
  // kernels it fuses (same output bits; gradients within a rounding: the
  // compiler may contract RoPE's backward differently) and against float64
  // autograd of the composites; per-token tables [B, T, h] and shared [1, T, h];
  // a head_dim the fused kernel does not take falls back to the two calls.
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  for (auto dtype : {at::kBFloat16, at::kFloat})
    for (int64_t h : {64, 128})
      for (bool shared_table : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "dtype " << dtype << " h " << h << (shared_table ? " [1, T, h]" : ""));
        auto g = gen(13);
        const int64_t b = 2, t = 300, heads = 8;
        auto x = (at::randn({b, t, heads, h}, g) * 3).to(at::kCUDA, dtype);
        auto w = (1 + 0.3 * at::randn({h}, g)).to(at::kCUDA, dtype);
        auto dy = at::randn({b, heads, t, h}, g).to(at::kCUDA, dtype);
        auto pos = at::randint(0, 40000, {shared_table ? 1 : b, t}, g).to(at::kCUDA);
        auto [cos, sin] = rope_tables(pos, h, 1e6);
        ASSERT_EQ(fused_rms_norm_rope_path(x, w, cos, sin), "cuda kernel");

        auto xf = x.detach().requires_grad_(true), wf = w.detach().requires_grad_(true);
        auto yf = fused_rms_norm_rope(xf, wf, qwen3_eps, cos, sin);
        ASSERT_EQ(yf.sizes(), at::IntArrayRef({b, heads, t, h}));
        yf.backward(dy);
        auto xu = x.detach().requires_grad_(true), wu = w.detach().requires_grad_(true);
        auto yu = fused_apply_rope(fused_rms_norm(xu, wu, qwen3_eps).transpose(1, 2), cos, sin);
        yu.backward(dy);
        EXPECT_TRUE(at::equal(yf.detach(), yu.detach()));
        const bool bf16 = dtype == at::kBFloat16;
        EXPECT_LT(rel_err(xf.grad(), xu.grad()), bf16 ? 1e-2 : 1e-5);
        EXPECT_LT(rel_err(wf.grad(), wu.grad()), bf16 ? 1e-2 : 1e-5);

        auto xr = x.detach().to(at::kDouble).requires_grad_(true), wr = w.detach().to(at::kDouble).requires_grad_(true);
        auto yr = apply_rope_composite(rms_norm_composite(xr, wr, qwen3_eps).transpose(1, 2),
                                       cos.to(dtype).to(at::kDouble), sin.to(dtype).to(at::kDouble));
        yr.backward(dy.to(at::kDouble));
        EXPECT_LT(rel_err(yf, yr), bf16 ? bf16_fwd_rel : fp32_rel);
        EXPECT_LT(rel_err(xf.grad(), xr.grad()), bf16 ? bf16_grad_rel : fp32_rel);
        EXPECT_LT(rel_err(wf.grad(), wr.grad()), bf16 ? bf16_grad_rel : fp32_rel);
      }
  auto g = gen(14);
  auto x16 = at::randn({1, 5, 2, 16}, g).to(at::kCUDA, at::kBFloat16).requires_grad_(true);
  auto w16 = at::ones({16}, x16.options()).detach();
  auto [c16, s16] = rope_tables(at::arange(5, at::TensorOptions().device(at::kCUDA)).unsqueeze(0), 16, 1e6);
  EXPECT_NE(fused_rms_norm_rope_path(x16, w16, c16, s16), "cuda kernel");
  EXPECT_TRUE(at::equal(fused_rms_norm_rope(x16, w16, qwen3_eps, c16, s16).detach(),
                        fused_apply_rope(fused_rms_norm(x16, w16, qwen3_eps).transpose(1, 2), c16, s16).detach()));
}

TEST(fused_ops, cuda_rope_forward_is_the_composite_and_backward_matches_float64) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device visible";
  check_rope(at::kBFloat16, /*bthd=*/true);
  check_rope(at::kFloat, /*bthd=*/true);
  check_rope(at::kBFloat16, /*bthd=*/false);
}

TEST(fused_ops, cuda_unsupported_operands_fall_back_to_the_composite) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device visible";
  auto x = at::randn({4, 6}, at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16));
  auto w = at::ones({6}, x.options());
  EXPECT_NE(fused_rms_norm_path(x, w), "cuda kernel");  // D 6: not a multiple of 8
  EXPECT_TRUE(at::equal(rms_norm(x, w, qwen3_eps), rms_norm_composite(x, w, qwen3_eps)));
  auto wf = at::ones({6}, x.options().dtype(at::kFloat));
  EXPECT_NE(fused_rms_norm_path(x, wf), "cuda kernel");  // mixed dtypes
}
