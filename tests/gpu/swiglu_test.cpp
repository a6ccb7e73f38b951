// fused_swiglu (gpu/models/fused_ops.hpp; kernels gpu/kernels/swiglu.cu)
// against the composite it replaces, at::silu(gate) * up, run through
// autograd in fp32 on the same device from the same bf16/fp16 inputs: the
// forward and both gradients, element by element, in ulps of the kernel's
// dtype.  Odd sizes (tails of 1..7 elements), unaligned and non-contiguous
// operands, one frozen operand, the no-grad path, an empty tensor, and
// swiglu_mlp's wiring.  The CPU case checks that the CPU path is the
// composite bit for bit; the CUDA cases print "[  SKIPPED ]" without a GPU.
// The last case prints kernel times against the composite at the 8B MLP's
// shape (no assertion).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/models/common.hpp"
#include "gpu/models/fused_ops.hpp"
#include "gpu/pch.hpp"
#include "tests/gpu/fixtures.hpp"

using namespace tandem::gpu;
using tandem::gpu::test::have_cuda;
using tandem::gpu::test::gen;

namespace {

// Tolerances, per element, against the fp32 composite's value r:
//   |ours − r| ≤ max_ulps · ulp_T(r) + fp32_slack · m
/// The kernel evaluates ATen's fp32 formulae (d_up as dy · g · s, within an
/// fp32 ulp of dy · silu(g)) and rounds each output once to T: 0.5 ulp,
/// which an H200 measured on every case.  Two ulps leaves room for fp32
/// ops ordered differently; a wrong formula or index is off by far more.
constexpr double max_ulps = 2.0;
/// m is the sum of the magnitudes of the terms (d_gate's 1 + g·(1 − s)
/// cancels near g ≈ −1.28, where a few fp32 ulps of the factor exceed a bf16
/// ulp of the product); 2⁻²⁰ is 16 fp32 ulps of m.
constexpr double fp32_slack = 1.0 / (1 << 20);

/// ulp of T at each value of `x` (float64): 2^(exponent − mantissa bits),
/// the exponent floored at T's smallest normal one (subnormals).
at::Tensor ulp(const at::Tensor& x, at::ScalarType t) {
  const double mantissa = t == at::kBFloat16 ? 7 : 10;
  const double min_exp = t == at::kBFloat16 ? -126 : -14;
  return at::pow(2.0, at::floor(at::log2(x.abs())).clamp_min(min_exp) - mantissa);
}

struct ulp_check {
  double max_ulps = 0;   ///< largest |ours − ref| / ulp_T(ref)
  int64_t outside = 0;   ///< elements beyond the tolerance (or NaN where ref is not)
};

/// `ours` (dtype t) against `ref` (fp32), `mag` the terms' magnitude (float64).
ulp_check compare(const at::Tensor& ours, const at::Tensor& ref, const at::Tensor& mag,
                  at::ScalarType t) {
  auto o = ours.to(at::kCPU, at::kDouble), r = ref.to(at::kCPU, at::kDouble);
  auto err = (o - r).abs();
  auto u = ulp(r, t);
  auto bad = (err > max_ulps * u + fp32_slack * mag) | (err.isnan() & r.isnan().logical_not());
  ulp_check c;
  c.outside = bad.sum().item<int64_t>();
  c.max_ulps = o.numel() == 0 ? 0 : at::nan_to_num(err / u, 0.0).max().item<double>();
  return c;
}

struct swiglu_case {
  std::vector<int64_t> shape;
  at::ScalarType dtype;
  enum layout_kind { dense, unaligned, transposed } layout = dense;
  bool frozen_up = false;  ///< up does not require grad
};

const char* layout_name(swiglu_case::layout_kind k) {
  switch (k) {
    case swiglu_case::dense: return "dense";
    case swiglu_case::unaligned: return "unaligned (offset one element)";
    case swiglu_case::transposed: return "transposed view";
  }
  return "?";
}

/// A tensor of `shape` in the case's layout: contiguous; contiguous at an
/// odd element offset (never 16-byte aligned); or a transposed view.
at::Tensor make(const swiglu_case& c, at::Generator& g, double scale) {
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(c.dtype);
  int64_t n = 1;
  for (auto s : c.shape)
    n *= s;
  switch (c.layout) {
    case swiglu_case::dense: return (at::randn(c.shape, g) * scale).to(opts);
    case swiglu_case::unaligned:
      return (at::randn({n + 1}, g) * scale).to(opts).narrow(0, 1, n).view(c.shape);
    case swiglu_case::transposed: {
      auto flipped = c.shape;
      std::swap(flipped.front(), flipped.back());
      return (at::randn(flipped, g) * scale).to(opts).transpose(0, -1);
    }
  }
  return {};
}

void check_swiglu(const swiglu_case& c) {
  SCOPED_TRACE(::testing::Message() << "shape " << at::IntArrayRef(c.shape) << " " << c.dtype
                                    << " " << layout_name(c.layout)
                                    << (c.frozen_up ? " frozen up" : ""));
  auto g = gen(7);
  // gate spans silu's curve (saturation both ways); a few edge values first.
  auto gate = make(c, g, 4.0), up = make(c, g, 1.0), dy = make(c, g, 1.0);
  if (c.layout == swiglu_case::dense && gate.numel() >= 8) {
    auto edges = at::tensor({0.0, -0.0, 1e-3, -1.28, 30.0, -30.0, 100.0, -100.0}).to(gate.options());
    gate.view(-1).narrow(0, 0, 8).copy_(edges);
  }
  ASSERT_EQ(gate.is_contiguous(), c.layout != swiglu_case::transposed);
  ASSERT_EQ(fused_swiglu_path(gate, up), "cuda kernel");

  auto gl = gate.detach().requires_grad_(true);
  auto ul = up.detach().requires_grad_(!c.frozen_up);
  auto out = fused_swiglu(gl, ul);
  ASSERT_EQ(out.sizes(), gate.sizes());
  ASSERT_EQ(out.scalar_type(), c.dtype);
  out.backward(dy);

  // The reference: the composite through autograd in fp32, same inputs.
  auto gf = gate.detach().to(at::kFloat).requires_grad_(true);
  auto uf = up.detach().to(at::kFloat).requires_grad_(true);
  auto ref = swiglu_composite(gf, uf);
  ref.backward(dy.to(at::kFloat));

  // The terms' magnitudes, in float64.
  auto gd = gate.to(at::kCPU, at::kDouble), ud = up.to(at::kCPU, at::kDouble);
  auto dyd = dy.to(at::kCPU, at::kDouble);
  auto s = at::sigmoid(gd);
  auto mag_out = (gd * s * ud).abs();
  auto mag_up = (dyd * gd * s).abs();
  auto mag_gate = (dyd * ud * s).abs() * (1 + (gd * (1 - s)).abs());

  const auto fo = compare(out, ref, mag_out, c.dtype);
  const auto fg = compare(gl.grad(), gf.grad(), mag_gate, c.dtype);
  EXPECT_EQ(fo.outside, 0) << "out: max " << fo.max_ulps << " ulps";
  EXPECT_EQ(fg.outside, 0) << "d_gate: max " << fg.max_ulps << " ulps";
  ulp_check fu;
  if (c.frozen_up) {
    EXPECT_FALSE(ul.grad().defined());
  } else {
    ASSERT_TRUE(ul.grad().defined());
    fu = compare(ul.grad(), uf.grad(), mag_up, c.dtype);
    EXPECT_EQ(fu.outside, 0) << "d_up: max " << fu.max_ulps << " ulps";
  }

  // The composite in T (what the kernel replaces), measured the same way:
  // it rounds silu(gate), and the gradients' intermediates, before the end.
  auto gc = gate.detach().requires_grad_(true), uc = up.detach().requires_grad_(true);
  auto outc = swiglu_composite(gc, uc);
  outc.backward(dy);
  const auto co = compare(outc, ref, mag_out, c.dtype);
  const auto cg = compare(gc.grad(), gf.grad(), mag_gate, c.dtype);
  const auto cu = compare(uc.grad(), uf.grad(), mag_up, c.dtype);
  std::printf("  %s %s%s n %lld: max ulps fused / composite: out %.2f / %.2f, d_gate %.2f / "
              "%.2f, d_up %.2f / %.2f\n",
              c10::toString(c.dtype), layout_name(c.layout), c.frozen_up ? " frozen up" : "",
              static_cast<long long>(gate.numel()), fo.max_ulps, co.max_ulps, fg.max_ulps,
              cg.max_ulps, fu.max_ulps, cu.max_ulps);
  if (gate.numel() >= 1000) {  // one rounding is never worse than two, over many elements
    EXPECT_LE(fo.max_ulps, co.max_ulps + 0.05);
    EXPECT_LE(fg.max_ulps, cg.max_ulps + 0.05);
  }

  // The no-grad path runs the same kernel: bit-equal.
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(fused_swiglu(gate, up), out.detach()));
}

} // namespace

TEST(swiglu, cpu_path_is_the_composite_bit_for_bit) {
  auto g = gen(1);
  auto gate = at::randn({3, 5, 77}, g).to(at::kBFloat16);
  auto up = at::randn({3, 5, 77}, g).to(at::kBFloat16);
  EXPECT_EQ(fused_swiglu_path(gate, up), "composite (not on CUDA)");
  EXPECT_TRUE(at::equal(fused_swiglu(gate, up), at::silu(gate) * up));

  // swiglu_mlp on the CPU: the composite MLP, bit for bit.
  layer_dims d;
  d.hidden = 16;
  d.intermediate = 40;
  d.heads = 2;
  d.kv_heads = 1;
  d.head_dim = 8;
  auto w = random_decoder_layer(d, at::kFloat, at::kCPU, gen(2), 0.1);
  auto x = at::randn({2, 3, 16}, g);
  auto composite = at::linear(
      at::silu(at::linear(x, w.gate_proj)) * at::linear(x, w.up_proj), w.down_proj);
  EXPECT_TRUE(at::equal(swiglu_mlp(x, w), composite));
}

TEST(swiglu, cuda_matches_fp32_composite_bf16) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  check_swiglu({{3, 1000, 77}, at::kBFloat16});
  check_swiglu({{5, 333, 7}, at::kBFloat16});  // n mod 8 = 7: a tail
  check_swiglu({{1}, at::kBFloat16});
  check_swiglu({{64, 12288}, at::kBFloat16});
  check_swiglu({{64, 12288}, at::kBFloat16, swiglu_case::dense, /*frozen_up=*/true});
}

TEST(swiglu, cuda_matches_fp32_composite_fp16) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  check_swiglu({{3, 1000, 77}, at::kHalf});
  check_swiglu({{5, 333, 7}, at::kHalf});
  check_swiglu({{64, 12288}, at::kHalf});
}

TEST(swiglu, cuda_unaligned_and_non_contiguous_operands) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  // Unaligned: the kernel's one-element-a-thread path.  Transposed: copied
  // to contiguous first (and dy too, by the backward).
  check_swiglu({{3, 1000, 77}, at::kBFloat16, swiglu_case::unaligned});
  check_swiglu({{5, 333, 7}, at::kHalf, swiglu_case::unaligned});
  check_swiglu({{3, 1000, 77}, at::kBFloat16, swiglu_case::transposed});
}

TEST(swiglu, cuda_edge_shapes_and_fallbacks) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  const auto bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  // Empty: nothing launched, gradients empty.
  auto e = at::empty({0, 8}, bf16).requires_grad_(true);
  auto eu = at::empty({0, 8}, bf16).requires_grad_(true);
  auto eo = fused_swiglu(e, eu);
  EXPECT_EQ(eo.sizes(), e.sizes());
  eo.sum().backward();
  EXPECT_EQ(e.grad().sizes(), e.sizes());

  // fp32 on CUDA keeps the composite, bit for bit.
  auto g = at::randn({4, 33}, bf16.dtype(at::kFloat));
  auto u = at::randn({4, 33}, bf16.dtype(at::kFloat));
  EXPECT_EQ(fused_swiglu_path(g, u), "composite (dtype Float)");
  EXPECT_TRUE(at::equal(fused_swiglu(g, u), swiglu_composite(g, u)));
  // Mixed dtypes or shapes (broadcasting) are the composite's.
  EXPECT_NE(fused_swiglu_path(g.to(at::kBFloat16), u), "cuda kernel");
  EXPECT_NE(fused_swiglu_path(g.to(at::kBFloat16), u.to(at::kBFloat16)[0]), "cuda kernel");
}

TEST(swiglu, cuda_mlp_uses_the_kernel) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  layer_dims d;
  d.hidden = 256;
  d.intermediate = 768;
  d.heads = 4;
  d.kv_heads = 2;
  d.head_dim = 64;
  auto w = random_decoder_layer(d, at::kFloat, at::kCPU, gen(3), 0.05);
  for (auto* t : layer_tensors(w))
    *t = t->to(at::kCUDA, at::kBFloat16);
  auto x = at::randn({2, 50, 256}, gen(4)).to(at::kCUDA, at::kBFloat16);
  auto gate = at::linear(x, w.gate_proj), up = at::linear(x, w.up_proj);
  EXPECT_TRUE(at::equal(swiglu_mlp(x, w), at::linear(fused_swiglu(gate, up), w.down_proj)));
  // And close to the composite MLP it replaced (differences: one rounding).
  auto before = at::linear(at::silu(gate) * up, w.down_proj).to(at::kFloat);
  auto now = swiglu_mlp(x, w).to(at::kFloat);
  EXPECT_LT(((now - before).norm() / before.norm()).item<double>(), 1e-2);
}
